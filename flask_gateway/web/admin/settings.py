"""The install screen (a new installation, another merchant account beside those installed, or adopting the
signing key of an existing one) and the settings screen of one account (callback URL, failure e-mail,
amount bounds: sent to the gateway; and a new API key, proved before it is stored)."""

from __future__ import annotations

import logging

from flask import abort, flash, redirect, render_template, request, url_for
from flask.typing import ResponseReturnValue
from pydantic import ValidationError as ModelValidationError

from flask_gateway.core.errors import (
    AlreadyInstalledError,
    AuthenticationError,
    GatewayConnectionError,
    GatewayError,
    GatewayServerError,
)
from flask_gateway.errors import SecretUnreadable
from flask_gateway.models import Installation
from flask_gateway.operations.checks import install_warnings, setup_warnings
from flask_gateway.payments.installation import (
    InstallSettings,
    adopt_signing_key,
    install,
    set_api_key,
    update_settings,
)
from flask_gateway.secrets import mask
from flask_gateway.state import get_state
from flask_gateway.urls import callback_url
from flask_gateway.web.admin.access import (
    account_from_form,
    account_from_query,
    default_installation,
    visible_installations,
)
from flask_gateway.web.admin.accounts import accepted_warnings, account_callback_url
from flask_gateway.web.admin.blueprint import bp, viewed_account
from flask_gateway.web.admin.inputs import _cents
from flask_gateway.web.admin.problems import _problem
from flask_gateway.web.admin.status import _masked_secrets
from flask_gateway.web.forms import ApiKeyForm, InstallForm, SettingsForm

_log = logging.getLogger("flask_gateway.admin")


def _settings_from(form: InstallForm) -> InstallSettings:
    return InstallSettings(
        merchant_account_id=form.merchant_account_id.data,
        api_key=form.api_key.data,
        callback_url=form.callback_url.data,
        callback_failures_email=form.callback_failures_email.data or None,
        minimum_cents=_cents(form.minimum_amount),
        maximum_cents=_cents(form.maximum_amount),
    )


def _fill_settings(form: SettingsForm, installation: Installation | None, callback: str) -> None:
    """Prefill from the installation; the callback URL: the one offered to the account."""
    form.callback_url.data = callback
    if installation is not None:
        form.callback_failures_email.data = installation.callback_failures_email or ""
        form.minimum_amount.data = installation.minimum_cents
        form.maximum_amount.data = installation.maximum_cents


def _install_form(installations: list[Installation]) -> InstallForm:
    """The install form. Another account (one is installed): a callback URL left empty becomes the
    account's own callback address (``.../callback/<account>``), as the form says."""
    if request.method == "POST" and installations:
        account = request.form.get("merchant_account_id", "").strip()
        if account and not request.form.get("callback_url", "").strip():
            formdata = request.form.copy()
            formdata["callback_url"] = account_callback_url(account, installations)
            return InstallForm(formdata=formdata)
    return InstallForm()


@bp.route("/install", methods=["GET", "POST"])
@account_from_form("merchant_account_id")
def install_screen() -> ResponseReturnValue:
    state = get_state()
    installations = state.installations()
    installed = {row.merchant_account_id: row for row in installations}
    shown = visible_installations()  # the accounts the person may see: listed, and the form's prefill
    installation = default_installation(shown)
    installation = None if installation is None or installation.retired else installation
    form = _install_form(installations)
    if request.method == "GET":
        # Another account beside those installed: its id is not known yet, nor so its callback address.
        _fill_settings(form, installation, "" if installations else callback_url())
    account = (form.merchant_account_id.data or "").strip()
    warnings = install_warnings(form.callback_url.data or "", account)
    already_installed: str | None = None
    adopting = False
    if form.validate_on_submit():
        adopting = bool(form.signing_key.data)
        if account in installed and not adopting:
            # Installed here: the gateway would answer "already installed" (its key is issued once).
            form.merchant_account_id.errors.append(
                f"Merchant account {account} is already installed in this shop: change its settings on the "
                f"Settings screen ({url_for('.settings_screen', account=account)}). Only if the gateway no "
                "longer accepts its stored signing key, enter the key you have under “Installed this "
                "merchant account before?”."
            )
        elif warnings and not form.confirm_local.data:
            form.confirm_local.errors.append(
                "Tick this box to install with this address anyway, or fix the address first."
            )
        else:
            settings = _settings_from(form)
            state.session.commit()  # no transaction (SQLite: no write lock) while the gateway answers
            try:
                if adopting:
                    adopt_signing_key(settings, form.signing_key.data)
                else:
                    install(settings)
            except AlreadyInstalledError as error:
                already_installed = error.message
            except AuthenticationError as error:
                flash(_refused_credentials(error, adopting=adopting), "error")
            except ModelValidationError as error:
                flash(f"The settings were not sent: {_problem(error)}", "error")
            except (GatewayConnectionError, GatewayServerError) as error:
                flash(
                    f"No usable answer from the gateway ({_problem(error)}); nothing was stored. Try "
                    "again. If the gateway did install the account, it now answers “already installed”: "
                    "ask the gateway's account manager for the signing key, or to reset the installation.",
                    "error",
                )
            except GatewayError as error:
                flash(f"The gateway refused the installation: {_problem(error)}", "error")
            else:
                _log.info(
                    "gateway %s for merchant account %s (%s)",
                    "signing key adopted" if adopting else "installed",
                    settings.merchant_account_id,
                    state.config.environment,
                )
                flash(
                    "The gateway is installed. The signing key is stored encrypted; only its last 4 "
                    "characters are ever shown.",
                    "success",
                )
                others = [
                    row.merchant_account_id
                    for row in shown
                    if row.merchant_account_id != settings.merchant_account_id
                ]
                if others:
                    flash(
                        f"Merchant account {settings.merchant_account_id} is installed beside "
                        f"{', '.join(others)}. Checkouts that name no account now use it (the newest open "
                        "account): the shop chooses an account per checkout with account= or its account "
                        "resolver.",
                        "info",
                    )
                return redirect(url_for(".index"))
    return render_template(
        "gateway/admin/install.html",
        form=form,
        installation=installation,
        installations=shown,
        # Another account's own callback address, as the form explains it.
        further_callback=f"{callback_url()}/<merchant account id>" if installations else None,
        warnings=warnings,
        already_installed=already_installed,
        adopt_open=already_installed is not None or adopting,
    )


def _refused_credentials(error: AuthenticationError, *, adopting: bool) -> str:
    if adopting:
        return (
            "The gateway did not accept this signing key for the merchant account "
            f"({_problem(error)}). Copy the key you received at the first installation again, whole, "
            "and check the merchant account id."
        )
    return (
        "The gateway refused the merchant account id or API key "
        f"({_problem(error)}). Check both against what the account manager issued for this environment "
        f"({get_state().config.environment})."
    )


def _viewed_installation() -> tuple[Installation | None, list[Installation]]:
    """The settings screens' account (``?account=ID``, else the default account) among those the person
    may see; None when nothing is installed (404 for an account that is not one of them)."""
    state = get_state()
    installations = visible_installations()
    account = viewed_account()  # ?account=, else the default account: what the admin guard was told
    installation = next((row for row in installations if row.merchant_account_id == account), None)
    if installation is None and account is not None:
        abort(404, description=str(state.unknown_account(account)))
    return installation, installations


def _settings_page(
    installation: Installation,
    installations: list[Installation],
    form: SettingsForm,
    key_form: ApiKeyForm,
) -> ResponseReturnValue:
    several = len(installations) > 1
    # An unreadable key is no obstacle: storing a new one needs no old one.
    stored_key = _masked_secrets(get_state(), installation).get(
        "api_key", "unreadable with the configured keys"
    )
    return render_template(
        "gateway/admin/settings.html",
        form=form,
        key_form=key_form,
        stored_key=stored_key,
        installation=installation,
        # Several accounts: the switcher, and the forms post to this account's screen.
        accounts=installations if several else [],
        account=installation.merchant_account_id if several else None,
        warnings=accepted_warnings(
            setup_warnings(form.callback_url.data), installation.merchant_account_id if several else None
        ),
    )


@bp.route("/settings", methods=["GET", "POST"])
@account_from_query(default_account=True)
def settings_screen() -> ResponseReturnValue:
    """One account's settings: ``?account=ID``, else the default account (the newest one still open)."""
    state = get_state()
    installation, installations = _viewed_installation()
    if installation is None:
        flash("Install the gateway first: the settings belong to an installation.", "error")
        return redirect(url_for(".install_screen"))
    form = SettingsForm()
    if request.method == "GET":
        _fill_settings(form, installation, installation.callback_url)
    if form.validate_on_submit():
        try:
            update_settings(
                callback_url=form.callback_url.data,
                callback_failures_email=form.callback_failures_email.data or None,
                minimum_cents=_cents(form.minimum_amount),
                maximum_cents=_cents(form.maximum_amount),
                account=installation.merchant_account_id,
            )
        except AuthenticationError as error:
            state.session.rollback()
            flash(
                f"The gateway refused the stored signing key ({_problem(error)}). If the account was "
                "installed again elsewhere, enter its current signing key on the install screen.",
                "error",
            )
        except (GatewayError, ModelValidationError, SecretUnreadable) as error:
            state.session.rollback()
            flash(f"The settings were not changed: {_problem(error)}", "error")
        else:
            _log.info("gateway settings updated for merchant account %s", installation.merchant_account_id)
            flash(
                "Settings saved on the gateway. The signing key it returned is stored encrypted.", "success"
            )
            return redirect(url_for(".index"))
    return _settings_page(installation, installations, form, ApiKeyForm(formdata=None))


@bp.route("/settings/api-key", methods=["POST"])
@account_from_query(default_account=True)
def change_api_key() -> ResponseReturnValue:
    """A new API key for the screen's account: proved with one authenticated, read-only call (the v1
    configuration) before it is stored; the stored key is kept when the gateway refuses it or does not
    answer. The key is never shown again, nor logged: the answer names its last 4 characters."""
    state = get_state()
    installation, installations = _viewed_installation()
    if installation is None:
        flash("Install the gateway first: the API key belongs to an installation.", "error")
        return redirect(url_for(".install_screen"))
    account = installation.merchant_account_id
    key_form = ApiKeyForm()
    if key_form.validate_on_submit():
        key = key_form.api_key.data
        state.session.commit()  # no transaction (SQLite: no write lock) while the gateway answers
        try:
            set_api_key(account, key)
        except AuthenticationError as error:
            state.session.rollback()
            key_form.api_key.errors.append(
                f"The gateway refused this API key ({_problem(error)}): the stored key is unchanged. Check "
                f"it against what the account manager issued for the {state.config.environment} environment."
            )
        except GatewayError as error:
            state.session.rollback()
            key_form.api_key.errors.append(
                f"The new API key could not be proved ({_problem(error)}): the stored key is unchanged. "
                "Try again once the gateway answers."
            )
        else:
            _log.info("new API key stored for merchant account %s (settings screen)", account)
            flash(
                f"Stored the new API key of {account} ({mask(key)}), encrypted: the gateway accepted "
                "it. The old one is no longer used here.",
                "success",
            )
            return redirect(url_for(".settings_screen", account=account))
    form = SettingsForm(formdata=None)
    _fill_settings(form, installation, installation.callback_url)
    return _settings_page(installation, installations, form, key_form)
