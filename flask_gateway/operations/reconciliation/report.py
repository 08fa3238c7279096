"""The report of a run, and what polling one checkout did (recorded into the report by the run's thread).

With several merchant accounts the report also holds one :class:`AccountReport` per account the run
covered, and its summary says per account what happened; with one account it reads as it always did.

Imports no other module of the package. Statuses are shown in the words of ``flask_gateway.labels``, with
their codes.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime

from flask_gateway.core.money import format_money
from flask_gateway.labels import status_label


@dataclass(frozen=True)
class ReconcileError:
    """One checkout that could not be reconciled (the run went on)."""

    checkout_id: int
    token: str | None
    message: str
    #: The checkout's merchant account.
    account: str | None = None


@dataclass
class AccountReport:
    """What one run did for one merchant account (``ReconcileReport.accounts``)."""

    account: str
    #: The account is retired (closed for new checkouts): its checkouts are reconciled all the same.
    retired: bool = False
    #: The default account (the newest one still open).
    default: bool = False
    #: Its open checkouts due when the run started (before ``limit``).
    due: int = 0
    polled: int = 0
    changed: int = 0
    confirmed: int = 0
    expired: int = 0
    #: Its open checkouts that could not be asked about (also in the run's ``errors``).
    failed: int = 0
    #: Its paid checkouts due when the run started (before ``limit``).
    paid_due: int = 0
    paid_polled: int = 0
    paid_changed: int = 0
    paid_failed: int = 0
    #: Why the run stopped asking about its checkouts (the gateway refused its key, or its signing key
    #: cannot be read), or None. The checkouts not asked are counted as failed, without a request each;
    #: the next run asks again.
    problem: str | None = None

    @property
    def label(self) -> str:
        """``b``, ``a (default)``, ``c (retired)``."""
        marks = [word for word, on in (("default", self.default), ("retired", self.retired)) if on]
        return self.account + (f" ({', '.join(marks)})" if marks else "")

    def summary(self) -> str:
        """One line: ``a (default): polled 3 of 3 due, 1 changed, ...``."""
        line = (
            f"{self.label}: polled {self.polled} of {self.due} due, {self.changed} changed, "
            f"{self.confirmed} payment(s) confirmed, {self.expired} expired, {self.failed} failed"
        )
        if self.paid_due or self.paid_polled or self.paid_failed:
            line += (
                f"; checked {self.paid_polled} of {self.paid_due} paid, {self.paid_changed} changed, "
                f"{self.paid_failed} failed"
            )
        if self.problem:
            line += f"; STOPPED: {self.problem}"
        return line + "."


@dataclass
class ReconcileReport:
    """What one run did."""

    started_at: datetime
    finished_at: datetime | None = None
    #: False: the gateway is not installed, nothing was polled.
    installed: bool = True
    #: Checkouts due when the run started (after ``limit``); a concurrent run may take some of them.
    due: int = 0
    polled: int = 0
    #: Polls that moved a checkout to another status.
    changed: int = 0
    #: Payments this run confirmed (``payment_confirmed`` was sent for each).
    confirmed: int = 0
    expired: int = 0
    #: The status each polled checkout has after the poll.
    statuses: Counter[str] = field(default_factory=Counter)
    errors: list[ReconcileError] = field(default_factory=list)
    #: Ids of ``CREATING`` checkouts older than a minute: their create answer never came (not polled).
    stuck_creating: list[int] = field(default_factory=list)
    #: Open v1 orders past their expiry: v1 has no status query, so they are only counted.
    v1_unresolved: int = 0
    #: Open checkouts of a merchant account not installed here (for this environment): not polled.
    other_account: int = 0
    #: Each merchant account the run covered (every one installed, open or retired, oldest first; or the
    #: one asked for): what the run did for it. Its summary lines are shown when there are several.
    accounts: dict[str, AccountReport] = field(default_factory=dict)
    #: The paid window of this run, in hours (0: paid checkouts were not asked about).
    paid_window_hours: float = 0
    #: Paid checkouts in the window due when the run started (after what ``limit`` left for them).
    paid_due: int = 0
    #: Paid checkouts asked about (the "checked" of the summary).
    paid_polled: int = 0
    #: Paid checkouts whose status or refunded amount changed (a refund recorded).
    paid_changed: int = 0
    #: Paid checkouts that could not be asked about (also in ``errors``).
    paid_failed: int = 0
    #: The status each paid checkout asked about has after the poll.
    paid_statuses: Counter[str] = field(default_factory=Counter)
    #: Checkouts (of either pass) whose refunded amount grew: refunds learnt from the gateway, recorded.
    refunded: int = 0
    #: What those refunds add up to, in cents.
    refunded_cents: int = 0
    #: The shop's currency symbol (``GATEWAY_CURRENCY_SYMBOL``): the summary shows money with it.
    currency_symbol: str = "R"
    #: Checkouts (of either pass) this run flagged for a person.
    flagged: int = 0

    @property
    def failed(self) -> int:
        return len(self.errors)

    @property
    def several_accounts(self) -> bool:
        return len(self.accounts) > 1

    def summary(self) -> str:
        """A few lines for a terminal or a log."""
        if not self.installed:
            return "The gateway is not installed: nothing to reconcile."
        lines = [
            f"Polled {self.polled} of {self.due} due checkout(s): {self.changed} changed, "
            f"{self.confirmed} payment(s) confirmed, {self.expired} expired, "
            f"{self.failed - self.paid_failed} failed."
        ]
        if self.statuses:
            lines.append("Statuses now: " + _counted(self.statuses))
        if self.paid_window_hours > 0:
            line = (
                f"Checked {self.paid_polled} of {self.paid_due} paid checkout(s) due from the last "
                f"{self.paid_window_hours:g} hour(s): {self.paid_changed} changed, {self.paid_failed} failed."
            )
            if self.paid_statuses:
                line += " Statuses now: " + _counted(self.paid_statuses)
            lines.append(line)
        else:
            lines.append("Paid checkouts not checked (paid window 0).")
        if self.refunded:
            lines.append(
                f"Refunds learnt from the gateway: {self.refunded} checkout(s), "
                f"{format_money(self.refunded_cents, self.currency_symbol)} recorded (refund_succeeded sent)."
            )
        if self.flagged:
            lines.append(
                f"{self.flagged} checkout(s) flagged for a person: the gateway's answer does not add up with "
                "the shop's record (the admin's checkouts list, flagged only)."
            )
        if self.several_accounts:
            lines.append("Per account:")
            lines.extend(f"  {account.summary()}" for account in self.accounts.values())
        elif self.accounts:
            [only] = self.accounts.values()
            if only.problem:
                lines.append(f"Stopped asking: {only.problem}.")
        for error in self.errors[:20]:
            of = f" of account {error.account}" if self.several_accounts and error.account else ""
            lines.append(f"  failed: checkout #{error.checkout_id} ({error.token}){of}: {error.message}")
        if len(self.errors) > 20:
            lines.append(f"  ... and {len(self.errors) - 20} more failures")
        if self.stuck_creating:
            shown = ", ".join(f"#{i}" for i in self.stuck_creating[:20])
            lines.append(
                f"{len(self.stuck_creating)} checkout(s) stuck in CREATING (the create answer never came; "
                f"retry create_checkout for the order or review them): {shown}"
            )
        if self.v1_unresolved:
            lines.append(
                f"{self.v1_unresolved} v1 order(s) past their expiry without an outcome (v1 has no status "
                "query: check them on the gateway)."
            )
        if self.other_account:
            lines.append(
                f"{self.other_account} open checkout(s) belong to another merchant account and were skipped."
            )
        return "\n".join(lines)


def _counted(statuses: Counter[str]) -> str:
    """``Awaiting payment (PENDING_ORDER): 2, Expired (EXPIRED): 1``: each status in the words of
    ``flask_gateway.labels`` with its code (what the gateway, the logs and ``--status`` say), by code."""
    return ", ".join(f"{_status(code)}: {count}" for code, count in sorted(statuses.items()))


def _status(code: str) -> str:
    label = status_label(code)
    return code if label.text == code else f"{label.text} ({code})"


class _NotAsked(Exception):
    """A claimed checkout not asked about: its account's key was refused earlier in the run, or cannot be
    read (:attr:`AccountReport.problem`)."""


@dataclass(frozen=True)
class _Outcome:
    """What polling one checkout did: recorded into the report by the run's own thread."""

    paid: bool
    account: str = ""
    error: ReconcileError | None = None
    status: str = ""
    changed: bool = False
    confirmed: bool = False
    expired: int = 0
    refunded_cents: int = 0
    flagged: bool = False


def _record(report: ReconcileReport, outcome: _Outcome) -> None:
    account = report.accounts.get(outcome.account) or AccountReport(outcome.account)
    if outcome.error is not None:
        report.errors.append(outcome.error)
        if outcome.paid:
            report.paid_failed += 1
            account.paid_failed += 1
        else:
            account.failed += 1
        return
    if outcome.paid:
        report.paid_polled += 1
        report.paid_changed += outcome.changed
        account.paid_polled += 1
        account.paid_changed += outcome.changed
    else:
        report.polled += 1
        report.changed += outcome.changed
        report.confirmed += outcome.confirmed
        report.expired += outcome.expired
        account.polled += 1
        account.changed += outcome.changed
        account.confirmed += outcome.confirmed
        account.expired += outcome.expired
    if outcome.refunded_cents > 0:
        report.refunded += 1
        report.refunded_cents += outcome.refunded_cents
    report.flagged += outcome.flagged
    (report.paid_statuses if outcome.paid else report.statuses)[outcome.status] += 1
