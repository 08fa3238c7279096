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

**On a schedule, and repaired** (issue 29): :func:`scheduled_check` runs by itself, from Celery beat (the
task ``flask_gateway.check_settings``), from every ``reconcile`` run and from ``flask gateway
check-settings`` (cron), at most once per ``GATEWAY_SETTINGS_CHECK_SECONDS`` whichever process runs it (the
turn is taken in the database: ``flask_gateway.payments.heartbeats.claim_turn``; by hand it always checks).
It checks every account with ``repair=True``: a callback URL, e-mail or limit that is not the shop's is put
back at once (a settings update carrying only those settings, signed with the shop's key), recorded in
``gateway_settings_incidents`` (:class:`~flask_gateway.models.SettingsIncident`: the foreign value, the
shop's, when found, when repaired), announced (``settings_drift_repaired``, a WARNING) and shown on every
admin page until a person acknowledges it. A setting changed again after its repair, while that repair is
not acknowledged or within :data:`ATTACK_PERIODS` periods of it, is someone fighting the repair: recorded
as an ``attack`` (``settings_under_attack``, an ERROR) and **not** repaired again, so the shop and the
attacker never take turns in a loop, until a person acknowledges it (then the next check puts the shop's
back). The signing key is the gateway's to issue: a new one is stored, never "repaired".
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Final

from sqlalchemy import select, update

from flask_gateway import signals
from flask_gateway.core.sql import commit_keeping_loaded, sqlite_read_transactions
from flask_gateway.core.timestamps import utcnow
from flask_gateway.core.wire import SettingsUpdateRequest
from flask_gateway.core.wire.names import OPERATOR, WireNames
from flask_gateway.models import Installation, SettingsIncident
from flask_gateway.payments.heartbeats import SETTINGS_CHECK, claim_turn, finish_turn
from flask_gateway.payments.installation import store_signing_key
from flask_gateway.state import get_state, leaves_no_transaction

__all__ = [
    "ATTACK",
    "ATTACK_PERIODS",
    "REPAIRED",
    "REPAIR_FAILED",
    "AccountCheck",
    "Difference",
    "DriftReport",
    "ScheduledCheck",
    "acknowledge_incidents",
    "check_all_settings",
    "check_settings",
    "last_report",
    "open_incidents",
    "scheduled_check",
]

_log = logging.getLogger("flask_gateway.drift")

#: ``SettingsIncident.outcome``: the shop's value was put back.
REPAIRED: Final = "repaired"
#: The repair was refused or failed (the next check tries again).
REPAIR_FAILED: Final = "repair-failed"
#: Changed again after a repair: not repaired until a person acknowledges it.
ATTACK: Final = "attack"
#: A setting changed again within this many check periods (``GATEWAY_SETTINGS_CHECK_SECONDS``) of its
#: repair, or while the repair is not acknowledged, is an attack.
ATTACK_PERIODS: Final = 3

#: The settings the shop puts back: the label the reports use, the installation's attribute, the wire name.
_REPAIRABLE: Final = {
    "callback URL": ("callback_url", "checkoutStatusCallbackUrl"),
    "failure e-mail": ("callback_failures_email", "callbackFailuresEmail"),
    "minimum amount (cents)": ("minimum_cents", "minimumCheckoutAmountCents"),
    "maximum amount (cents)": ("maximum_cents", "maximumCheckoutAmountCents"),
}


@dataclass(frozen=True)
class Difference:
    setting: str
    shop: str
    gateway: str
    #: The values themselves (``shop`` and ``gateway`` are their display): what a repair sends and records.
    ours: str | int | None = field(default=None, compare=False)
    theirs: str | int | None = field(default=None, compare=False)

    def to_json(self) -> dict[str, str]:
        return {"setting": self.setting, "shop": self.shop, "gateway": self.gateway}


@dataclass
class DriftReport:
    checked_at: datetime
    differences: list[Difference] = field(default_factory=list)
    #: The merchant account checked.
    account: str | None = None
    #: With ``repair=True``: the settings put back, those left alone because someone fights the repair
    #: (an attack), and why a repair failed (None: it did not).
    repaired: list[str] = field(default_factory=list)
    under_attack: list[str] = field(default_factory=list)
    repair_error: str | None = None

    @property
    def ok(self) -> bool:
        return not self.differences

    def summary(self) -> str:
        if self.ok:
            return "The gateway's settings are the shop's (callback URL, e-mail, limits, signing key)."
        lines = ["The gateway's settings differ from the shop's:"]
        lines += [f"  {d.setting}: the shop has {d.shop}, the gateway {d.gateway}" for d in self.differences]
        if self.repaired:
            lines.append(
                f"Put the shop's back: {', '.join(self.repaired)}. Recorded; every gateway admin page shows "
                "it until a person acknowledges it."
            )
        if self.under_attack:
            lines.append(
                f"NOT put back, changed again after a repair (someone fights it: an attack): "
                f"{', '.join(self.under_attack)}. Acknowledge the banner on the gateway admin pages once the "
                "account is safe (rotate its keys with the gateway): the next check puts the shop's back."
            )
        if self.repair_error:
            lines.append(f"The repair failed: {self.repair_error}. The next check tries again.")
        # A new signing key alone is the gateway's ordinary key change, not someone else's settings.
        changed = [d for d in self.differences if d.setting != "signing key"]
        if changed and not (self.repaired or self.under_attack or self.repair_error):
            lines.append(
                "If nobody here changed them, someone else signed a settings update: save the settings "
                "screen to put the shop's back, and ask the gateway's account manager about the account."
            )
        return "\n".join(lines)


def _shown(value: Any) -> str:
    return "(none)" if value is None or value == "" else repr(value)


@leaves_no_transaction
def check_settings(account: str | None = None, *, repair: bool = False) -> DriftReport:
    """Ask the gateway for ``account``'s settings (default: the default account), compare, record the
    result on that account's installation and return it.

    ``repair``: put the shop's callback URL, e-mail and limits back where they differ, record each as a
    :class:`~flask_gateway.models.SettingsIncident` and send the signals (module docstring); a failed
    repair is in the report (``repair_error``), not raised. Without it the check only compares.

    Raises ``NotInstalledError`` before installation, ``UnknownAccountError`` for an account not installed
    and ``GatewayError`` when the gateway cannot be asked.
    """
    state = get_state()
    installation = state.require_installation(account)
    account = installation.merchant_account_id
    v1 = state.v1_client(installation)
    client = state.client(installation)
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
            report.differences.append(
                Difference(setting, _shown(ours), _shown(gateways), ours=ours, theirs=gateways)
            )
    installation = state.require_installation(account)
    if store_signing_key(installation, answer.signingKey.get_secret_value(), report.checked_at):
        report.differences.append(
            Difference(
                "signing key",
                "the stored key",
                "another key (now stored: callbacks are signed with it; the previous one still verifies "
                f"them for {state.config.previous_signing_key_hours} h, GATEWAY_PREVIOUS_SIGNING_KEY_HOURS)",
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
    if repair and any(d.setting in _REPAIRABLE for d in report.differences):
        _repair(account, report)
    return report


# --- putting the shop's settings back --------------------------------------------------------------------


class _SettingsPatch(SettingsUpdateRequest):
    """A settings update with exactly the settings given, ``null`` included: the failure e-mail a shop
    without one puts back is ``null`` (the plain request leaves a ``None`` out, which changes nothing)."""

    def to_wire(self, names: WireNames = OPERATOR) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True)


def _text(value: str | int | None) -> str | None:
    return None if value is None else str(value)


def _latest(account: str, setting: str) -> SettingsIncident | None:
    state = get_state()
    found: SettingsIncident | None = state.session.scalar(
        select(SettingsIncident)
        .where(
            SettingsIncident.environment == state.config.environment,
            SettingsIncident.merchant_account_id == account,
            SettingsIncident.setting == setting,
        )
        .order_by(SettingsIncident.id.desc())
        .limit(1)
    )
    return found


def _repair(account: str, report: DriftReport) -> None:
    """Put back the shop's value of each repairable setting that differs, unless someone fights it
    (module docstring); record, log and announce. Never raises for the gateway's refusal."""
    state = get_state()
    now = report.checked_at
    window = timedelta(seconds=ATTACK_PERIODS * state.config.settings_check_seconds)
    installation = state.require_installation(account)
    to_fix: list[tuple[Difference, SettingsIncident]] = []
    attacks: list[SettingsIncident] = []
    for difference in report.differences:
        if difference.setting not in _REPAIRABLE:
            continue
        attribute, _ = _REPAIRABLE[difference.setting]
        if (getattr(installation, attribute) or None) != (difference.ours or None):
            continue  # the shop's own settings changed meanwhile (its settings screen): compared next time
        previous = _latest(account, difference.setting)
        if previous is not None and previous.outcome == ATTACK and previous.acknowledged_at is None:
            previous.last_seen_at = now  # still diverted, already reported: left alone until acknowledged
            previous.foreign_value = _text(difference.theirs)
            report.under_attack.append(difference.setting)
            continue
        fought = (
            previous is not None
            and previous.outcome == REPAIRED
            and (
                previous.acknowledged_at is None
                or (previous.repaired_at is not None and previous.repaired_at >= now - window)
            )
        )
        if previous is not None and previous.outcome == REPAIR_FAILED and previous.acknowledged_at is None:
            incident = previous  # the repair that failed last time: tried again, the same incident
            incident.last_seen_at, incident.foreign_value = now, _text(difference.theirs)
        else:
            incident = SettingsIncident(
                environment=state.config.environment,
                merchant_account_id=account,
                setting=difference.setting,
                foreign_value=_text(difference.theirs),
                our_value=_text(difference.ours),
                outcome=ATTACK if fought else REPAIR_FAILED,  # REPAIRED once the gateway answered
                found_at=now,
                last_seen_at=now,
            )
            state.session.add(incident)
        if fought:
            attacks.append(incident)
            report.under_attack.append(difference.setting)
        else:
            to_fix.append((difference, incident))
    body = {_REPAIRABLE[d.setting][1]: getattr(installation, _REPAIRABLE[d.setting][0]) for d, _ in to_fix}
    client = state.client(installation)
    commit_keeping_loaded(state.session)  # the incidents are recorded before the gateway is asked
    if to_fix:
        _send_back(account, report, body, to_fix, client)
    installation = state.require_installation(account)
    installation.settings_drift = [
        d.to_json() for d in report.differences if d.setting not in report.repaired
    ]
    commit_keeping_loaded(state.session)
    app = signals.sender()
    if to_fix:
        signals.settings_drift_repaired.send(app, account=account, incidents=[i for _, i in to_fix])
    if attacks:
        _log.error(
            "gateway settings of merchant account %s changed again after the shop put them back: %s. Not "
            "repaired again until a person acknowledges it on the gateway admin pages (someone holds a "
            "way to sign the account's settings updates: rotate its keys with the gateway)",
            account,
            "; ".join(f"{i.setting}: gateway {_shown(i.foreign_value)}" for i in attacks),
        )
        signals.settings_under_attack.send(app, account=account, incidents=attacks)


def _send_back(
    account: str,
    report: DriftReport,
    body: dict[str, Any],
    to_fix: Sequence[tuple[Difference, SettingsIncident]],
    client: Any,
) -> None:
    """One settings update with the shop's values of ``to_fix``; each incident marked repaired when the
    gateway answers them, else repair-failed with the reason."""
    state = get_state()
    settings = ", ".join(d.setting for d, _ in to_fix)
    try:
        answer = client.update_settings(_SettingsPatch.model_validate(body)).data
    except Exception as error:
        text = str(error).strip().splitlines()
        reason = f"{type(error).__name__}: {text[0][:300] if text else ''}"
        for _, incident in to_fix:
            incident.outcome, incident.detail = REPAIR_FAILED, reason
        report.repair_error = reason
        _log.warning(
            "gateway settings of merchant account %s: putting back %s failed (%s); the next check tries",
            account,
            settings,
            reason,
        )
        return
    done = utcnow()
    repaired: list[SettingsIncident] = []
    wrong: list[str] = []
    for difference, incident in to_fix:
        wire = _REPAIRABLE[difference.setting][1]
        if (getattr(answer, wire) or None) == (body[wire] or None):
            incident.outcome, incident.repaired_at, incident.detail = REPAIRED, done, None
            repaired.append(incident)
            report.repaired.append(difference.setting)
        else:
            incident.outcome = REPAIR_FAILED
            incident.detail = f"the gateway answered {_shown(getattr(answer, wire))}"
            wrong.append(f"{difference.setting}: the gateway answered {_shown(getattr(answer, wire))}")
    if wrong:
        report.repair_error = "; ".join(wrong)
    store_signing_key(state.require_installation(account), answer.signingKey.get_secret_value(), done)
    if repaired:
        _log.warning(
            "gateway settings of merchant account %s were changed at the gateway and put back: %s",
            account,
            "; ".join(f"{i.setting}: it had {_shown(i.foreign_value)}" for i in repaired),
        )


# --- the scheduled check, the incidents ------------------------------------------------------------------


@dataclass
class ScheduledCheck:
    """What :func:`scheduled_check` did: ``ran`` False when another run checked within the period (or
    nothing is installed); else each account's :class:`~flask_gateway.operations.drift.AccountCheck`."""

    ran: bool
    checked_at: datetime
    checks: list[AccountCheck] = field(default_factory=list)
    #: Why it did not run.
    skipped: str = ""

    @property
    def ok(self) -> bool:
        return all(check.ok for check in self.checks)

    @property
    def failed(self) -> bool:
        """An account could not be checked, or a repair failed: the run did not do its work."""
        return any(
            check.error is not None or (check.report is not None and check.report.repair_error)
            for check in self.checks
        )

    def summary(self) -> str:
        if not self.ran:
            return f"Settings not checked: {self.skipped}."
        parts = []
        for check in self.checks:
            if check.report is None:
                parts.append(f"{check.account}: could not be checked ({check.error})")
            elif check.report.ok:
                parts.append(f"{check.account}: the shop's")
            else:
                found = ", ".join(d.setting for d in check.report.differences)
                done = []
                if check.report.repaired:
                    done.append(f"put back {', '.join(check.report.repaired)}")
                if check.report.under_attack:
                    done.append(f"under attack: {', '.join(check.report.under_attack)}")
                if check.report.repair_error:
                    done.append("repair failed")
                parts.append(
                    f"{check.account}: differed ({found}" + (f"; {'; '.join(done)})" if done else ")")
                )
        return "Settings checked: " + ("; ".join(parts) if parts else "nothing installed") + "."


@leaves_no_transaction
def scheduled_check(*, force: bool = False) -> ScheduledCheck:
    """The settings check of the schedules (Celery beat, ``reconcile``, ``flask gateway check-settings``):
    every account installed, checked and repaired (``check_all_settings(repair=True)``), at most once per
    ``GATEWAY_SETTINGS_CHECK_SECONDS`` across every process (``force``: now, whatever the last check;
    a person's command). Records its turn and outcome in ``gateway_job_runs`` (row ``check-settings``:
    the doctor reads it). Never raises for an account's failure (it is in the result).

    Not due, and nothing written, while every account's settings were compared within the period and
    found the shop's (the installation, the settings screen's save and the doctor compare them too); an
    account whose last comparison found a difference is due at once (the doctor and "check now" only
    compare: the schedule repairs)."""
    state = get_state()
    now = utcnow()
    # A little slack: a schedule that ticks every period (beat, cron) must not miss its turn by the few
    # seconds its previous run started late.
    period = state.config.settings_check_seconds
    every = timedelta(seconds=period - min(10.0, period / 20))
    with sqlite_read_transactions():
        installed = [(row.settings_checked_at, bool(row.settings_drift)) for row in state.installations()]
    state.session.commit()
    if not installed:
        return ScheduledCheck(ran=False, checked_at=now, skipped="the gateway is not installed")
    fresh = all(checked is not None and checked > now - every and not drift for checked, drift in installed)
    if fresh and not force:
        return ScheduledCheck(
            ran=False,
            checked_at=now,
            skipped=f"compared less than GATEWAY_SETTINGS_CHECK_SECONDS={period} s ago, and the shop's",
        )
    if not claim_turn(SETTINGS_CHECK, every, now=now, force=force):
        return ScheduledCheck(
            ran=False,
            checked_at=now,
            skipped=f"checked less than GATEWAY_SETTINGS_CHECK_SECONDS={period} s ago (by another run)",
        )
    result = ScheduledCheck(ran=True, checked_at=now, checks=check_all_settings(repair=True))
    finish_turn(SETTINGS_CHECK, result.summary(), failed=result.failed, now=utcnow())
    return result


@leaves_no_transaction
def open_incidents(
    account: str | None = None, *, accounts: Collection[str] | None = None
) -> list[SettingsIncident]:
    """The incidents of this environment no person has acknowledged yet (of ``account``, or of those of
    ``accounts``, or of every account), oldest first: what the admin pages' banner shows. Loaded, detached
    from no transaction."""
    state = get_state()
    query = select(SettingsIncident).where(
        SettingsIncident.environment == state.config.environment,
        SettingsIncident.acknowledged_at.is_(None),
    )
    if account is not None:
        query = query.where(SettingsIncident.merchant_account_id == account)
    if accounts is not None:
        query = query.where(SettingsIncident.merchant_account_id.in_(sorted(accounts)))
    with sqlite_read_transactions():
        rows = list(state.session.scalars(query.order_by(SettingsIncident.id)))
    commit_keeping_loaded(state.session)
    return rows


@leaves_no_transaction
def acknowledge_incidents(
    by: str, ids: Sequence[int] | None = None, *, accounts: Collection[str] | None = None
) -> int:
    """A person has read the banner: the open incidents (those of ``ids``, or every one; of ``accounts``
    only, when given: the accounts the person may see) are acknowledged by ``by`` now. An attack's setting
    is repaired again by the next check. The number acknowledged."""
    state = get_state()
    query = update(SettingsIncident).where(
        SettingsIncident.environment == state.config.environment,
        SettingsIncident.acknowledged_at.is_(None),
    )
    if ids is not None:
        query = query.where(SettingsIncident.id.in_(list(ids)))
    if accounts is not None:
        query = query.where(SettingsIncident.merchant_account_id.in_(sorted(accounts)))
    result = state.session.execute(
        query.values(acknowledged_at=utcnow(), acknowledged_by=by),
        execution_options={"synchronize_session": False},
    )
    state.session.commit()
    count: int = getattr(result, "rowcount", 0) or 0
    if count:
        _log.info("%d gateway settings incident(s) acknowledged by %s", count, by)
    return count


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
def check_all_settings(*, repair: bool = False) -> list[AccountCheck]:
    """:func:`check_settings` (with ``repair``) for every account installed for this environment, open and
    retired, oldest first. An account that cannot be checked (the gateway does not answer it, its keys do
    not decrypt) is reported with its error and the next one is checked all the same. An empty list:
    nothing installed."""
    state = get_state()
    accounts = [(row.merchant_account_id, row.retired) for row in state.installations()]
    state.session.commit()  # no transaction while the gateway answers
    checks: list[AccountCheck] = []
    for account, retired in accounts:
        try:
            checks.append(AccountCheck(account, retired, report=check_settings(account, repair=repair)))
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
