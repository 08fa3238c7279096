"""Drift of the gateway's settings: does the gateway still have the callback URL, e-mail and limits the shop
installed?

Anyone who can sign a settings update can change them behind the shop's back, and on the sandbox anyone
can (its 401 answers carry ``expectedSignature``): the callbacks then go to another server and the shop
never hears of its payments. :func:`check_settings` compares the gateway's settings with the
installation's and records the answer on it (``settings_checked_at``, ``settings_drift``); the admin
status page shows it (with a "check now" button) and ``flask gateway check-settings`` runs it from cron
(exit code 1 when something differs).

With several merchant accounts each one has its own settings at the gateway: :func:`check_settings`
checks one (the default account unless told), with that account's keys, and records the answer on that
account's row; :func:`check_all_settings` checks every account installed, open and retired (a retired
account's callbacks still come), one after the other, and an account that cannot be checked never stops
the others.

The gateway has no operation that only reads its settings. So the check reads the limits with the v1
configuration (read-only), then sends them back unchanged in a settings update, whose answer carries all
four settings and the signing key: the update changes nothing, and what it answers is the gateway's view
(docs/decisions.md). A signing key that differs from the stored one is stored (the gateway signs the
callbacks with it) and reported.
"""

from __future__ import annotations

import hmac
import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from flask_gateway.core.timestamps import utcnow
from flask_gateway.core.wire import SettingsUpdateRequest
from flask_gateway.models import Installation
from flask_gateway.state import get_state, leaves_no_transaction

__all__ = ["AccountCheck", "Difference", "DriftReport", "check_all_settings", "check_settings", "last_report"]

_log = logging.getLogger("flask_gateway.drift")


@dataclass(frozen=True)
class Difference:
    setting: str
    shop: str
    gateway: str

    def to_json(self) -> dict[str, str]:
        return {"setting": self.setting, "shop": self.shop, "gateway": self.gateway}


@dataclass
class DriftReport:
    checked_at: datetime
    differences: list[Difference] = field(default_factory=list)
    #: The merchant account checked.
    account: str | None = None

    @property
    def ok(self) -> bool:
        return not self.differences

    def summary(self) -> str:
        if self.ok:
            return "The gateway's settings are the shop's (callback URL, e-mail, limits, signing key)."
        lines = ["The gateway's settings differ from the shop's:"]
        lines += [f"  {d.setting}: the shop has {d.shop}, the gateway {d.gateway}" for d in self.differences]
        lines.append(
            "If nobody here changed them, someone else signed a settings update: save the settings screen "
            "to put the shop's back, and ask the gateway's account manager about the account."
        )
        return "\n".join(lines)


def _shown(value: Any) -> str:
    return "(none)" if value is None or value == "" else repr(value)


@leaves_no_transaction
def check_settings(account: str | None = None) -> DriftReport:
    """Ask the gateway for ``account``'s settings (default: the default account), compare, record the
    result on that account's installation and return it.

    Raises ``NotInstalledError`` before installation, ``UnknownAccountError`` for an account not installed
    and ``GatewayError`` when the gateway cannot be asked.
    """
    state = get_state()
    installation = state.require_installation(account)
    account = installation.merchant_account_id
    v1 = state.v1_client(installation)
    client = state.client(installation)
    stored_key = state.box.decrypt_cached(installation.signing_key_encrypted)
    state.session.commit()  # no transaction while the gateway answers
    limits = v1.configuration().data
    report = DriftReport(checked_at=utcnow(), account=account)
    sent: dict[str, int] = {}
    if limits.minimum_amount is not None:
        sent["minimumCheckoutAmountCents"] = limits.minimum_amount
    if limits.maximum_amount is not None:
        sent["maximumCheckoutAmountCents"] = limits.maximum_amount
    if not sent:
        raise ValueError("the gateway's v1 configuration answered no limits: its settings cannot be read")
    # The gateway's own limits, sent back: a settings update that changes nothing and answers all four.
    answer = client.update_settings(SettingsUpdateRequest.model_validate(sent)).data
    theirs = {
        "callback URL": (installation.callback_url, answer.checkoutStatusCallbackUrl),
        "failure e-mail": (installation.callback_failures_email, answer.callbackFailuresEmail),
        "minimum amount (cents)": (installation.minimum_cents, answer.minimumCheckoutAmountCents),
        "maximum amount (cents)": (installation.maximum_cents, answer.maximumCheckoutAmountCents),
    }
    for setting, (ours, gateways) in theirs.items():
        if (ours or None) != (gateways or None):
            report.differences.append(Difference(setting, _shown(ours), _shown(gateways)))
    new_key = answer.signingKey.get_secret_value()
    installation = state.require_installation(account)
    if not hmac.compare_digest(new_key.encode(), stored_key.encode()):
        installation.signing_key_encrypted = state.box.encrypt(new_key)
        report.differences.append(
            Difference(
                "signing key", "the stored key", "another key (now stored: callbacks are signed with it)"
            )
        )
    installation.settings_checked_at = report.checked_at
    installation.settings_drift = [d.to_json() for d in report.differences]
    state.session.commit()
    if not report.ok:
        _log.warning(
            "gateway settings of merchant account %s differ: %s",
            installation.merchant_account_id,
            "; ".join(f"{d.setting}: shop {d.shop}, gateway {d.gateway}" for d in report.differences),
        )
    return report


@dataclass
class AccountCheck:
    """One account's part of :func:`check_all_settings`: its report, or why it could not be checked."""

    account: str
    retired: bool
    report: DriftReport | None = None
    #: ``"ErrorName: message"`` when the account could not be checked (the gateway, its stored keys).
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.report is not None and self.report.ok


@leaves_no_transaction
def check_all_settings() -> list[AccountCheck]:
    """:func:`check_settings` for every account installed for this environment, open and retired, oldest
    first. An account that cannot be checked (the gateway does not answer it, its keys do not decrypt) is
    reported with its error and the next one is checked all the same. An empty list: nothing installed."""
    state = get_state()
    accounts = [(row.merchant_account_id, row.retired) for row in state.installations()]
    state.session.commit()  # no transaction while the gateway answers
    checks: list[AccountCheck] = []
    for account, retired in accounts:
        try:
            checks.append(AccountCheck(account, retired, report=check_settings(account)))
        except Exception as error:
            state.session.rollback()
            text = str(error).strip().splitlines()
            _log.warning(
                "gateway settings of merchant account %s could not be checked: %s: %s",
                account,
                type(error).__name__,
                text[0] if text else "",
            )
            checks.append(
                AccountCheck(account, retired, error=f"{type(error).__name__}: {text[0] if text else ''}")
            )
    return checks


def last_report(installation: Installation) -> DriftReport | None:
    """The result of the last check, as recorded on the installation (None: never checked)."""
    if installation.settings_checked_at is None:
        return None
    differences = [
        Difference(str(d.get("setting")), str(d.get("shop")), str(d.get("gateway")))
        for d in installation.settings_drift or []
        if isinstance(d, dict)
    ]
    return DriftReport(
        checked_at=installation.settings_checked_at,
        differences=differences,
        account=installation.merchant_account_id,
    )
