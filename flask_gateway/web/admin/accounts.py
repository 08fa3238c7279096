"""Several merchant accounts on the admin screens: the account switcher's choice (``?account=ID``), each
account's own callback address, and retiring or reopening an account (with a confirmation first).

A shop with one account sees none of it: the switcher and the account columns appear from two accounts on.
A person who may see only some accounts (``access.visible_accounts``) is offered only those.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from flask import abort, flash, redirect, render_template, request, url_for
from flask.typing import ResponseReturnValue

from flask_gateway.errors import UnknownAccountError
from flask_gateway.models import Installation
from flask_gateway.operations.checks import SetupWarning
from flask_gateway.payments.accounts import open_checkouts, reopen_account, retire_account
from flask_gateway.state import get_state
from flask_gateway.urls import callback_url, external_url
from flask_gateway.web.admin.access import account_from_path, visible_accounts, visible_installations
from flask_gateway.web.admin.blueprint import bp
from flask_gateway.web.forms import ActionForm

__all__ = ["AccountScope", "accepted_warnings", "account_callback_url", "account_scope"]

_log = logging.getLogger("flask_gateway.admin")


@dataclass(frozen=True)
class AccountScope:
    """The accounts a screen offers and the one it shows."""

    #: Every installed account, open and retired, oldest first, when there are two or more (the switcher
    #: and the account columns); empty for a shop with one account, which sees nothing new.
    accounts: list[Installation] = field(default_factory=list)
    #: The account the screen shows (``?account=ID``), or None for every account.
    account: str | None = None
    #: The accounts the person may see (None: every account): a list of every account shows only these.
    visible: frozenset[str] | None = None

    @property
    def several(self) -> bool:
        return bool(self.accounts)

    @property
    def shown(self) -> frozenset[str] | None:
        """The accounts whose rows the screen lists: its account, else those the person may see (None:
        every account's rows, those of no account included)."""
        return frozenset({self.account}) if self.account else self.visible

    def template_values(self) -> dict[str, Any]:
        return {"accounts": self.accounts, "account": self.account}


def account_scope() -> AccountScope:
    """The ``account`` query parameter, checked against the installed accounts: one that is not installed
    is a 404 that lists those that are (never a query with what was typed). The accounts offered are those
    the person may see (an account they may not see was answered 404 before the view)."""
    state = get_state()
    installations = visible_installations()
    asked = request.args.get("account", "")
    if asked and asked not in {row.merchant_account_id for row in installations}:
        abort(404, description=str(state.unknown_account(asked)))
    return AccountScope(installations if len(installations) > 1 else [], asked or None, visible_accounts())


def account_callback_url(account: str, installations: list[Installation]) -> str:
    """The callback address to offer an account: the shop's callback path for its first account (and for
    a shop installing its first one), ``.../callback/<account>`` (its own path) for a further one."""
    others = [row for row in installations if row.merchant_account_id != account]
    if not others or installations[0].merchant_account_id == account:
        return callback_url()
    return external_url("gateway.callback", account=account)


def accepted_warnings(warnings: list[SetupWarning], account: str | None) -> list[SetupWarning]:
    """The setup warnings without "the callback URL is not this shop's" for an account's own callback
    path (``/callback/<account>``): the shop does receive that account's callbacks there."""
    if account is None:
        return warnings
    own = external_url("gateway.callback", account=account).rstrip("/")
    return [w for w in warnings if not (w.kind == "callback-mismatch" and w.url.rstrip("/") == own)]


def _installation_or_404(account: str) -> Installation:
    installation = get_state().installation(account)  # None too for an id no account can have
    if installation is None:
        abort(404, description=str(get_state().unknown_account(account)))
    return installation


@bp.route("/accounts/<path:account>/retire", methods=["GET", "POST"])
@account_from_path("account")
def retire(account: str) -> ResponseReturnValue:
    """GET: what retiring means, and the button. POST: retire (closed for new checkouts)."""
    installation = _installation_or_404(account)
    if request.method == "GET":
        state = get_state()
        others = [
            row
            for row in state.installations()
            if not row.retired and row.merchant_account_id != installation.merchant_account_id
        ]
        default = state.installation()
        visible = visible_accounts()
        next_default = others[-1] if others else None
        return render_template(
            "gateway/admin/retire.html",
            installation=installation,
            open_checkouts=open_checkouts(installation.merchant_account_id),
            next_default=next_default,
            # An account the person may not see is not named (only that there is one).
            next_default_named=next_default is not None
            and (visible is None or next_default.merchant_account_id in visible),
            is_default=default is not None and default.id == installation.id,
            action_form=ActionForm(),
        )
    try:
        retire_account(installation.merchant_account_id)
    except UnknownAccountError as error:  # removed meanwhile
        flash(str(error), "error")
        return redirect(url_for(".index"))
    left = open_checkouts(installation.merchant_account_id)
    _log.info("admin retired merchant account %s (%d open checkouts left)", account, left)
    flash(
        f"Merchant account {account} is retired: it takes no new checkouts. "
        + (
            f"Its {left} open checkout{'s' if left != 1 else ''}, refunds and callbacks go on until settled."
            if left
            else "No checkout is open on it."
        ),
        "success",
    )
    return redirect(url_for(".index"))


@bp.post("/accounts/<path:account>/reopen")
@account_from_path("account")
def reopen(account: str) -> ResponseReturnValue:
    """Take new checkouts on a retired account again."""
    installation = _installation_or_404(account)
    try:
        reopen_account(installation.merchant_account_id)
    except UnknownAccountError as error:
        flash(str(error), "error")
        return redirect(url_for(".index"))
    _log.info("admin reopened merchant account %s", account)
    flash(f"Merchant account {account} is open again: it takes new checkouts.", "success")
    return redirect(url_for(".index"))
