"""The report of a run, and what polling one checkout did (recorded into the report by the run's thread).

Imports no other module of the package.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime


@dataclass(frozen=True)
class ReconcileError:
    """One checkout that could not be reconciled (the run went on)."""

    checkout_id: int
    token: str | None
    message: str


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
    #: Open checkouts of a merchant account other than the installed one: not polled.
    other_account: int = 0
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
    #: Checkouts (of either pass) this run flagged for a person.
    flagged: int = 0

    @property
    def failed(self) -> int:
        return len(self.errors)

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
                f"Refunds learnt from the gateway: {self.refunded} checkout(s), {self.refunded_cents} cents "
                "recorded (refund_succeeded sent)."
            )
        if self.flagged:
            lines.append(
                f"{self.flagged} checkout(s) flagged for a person: the gateway's answer does not add up with "
                "the shop's record (the admin's checkouts list, flagged only)."
            )
        for error in self.errors[:20]:
            lines.append(f"  failed: checkout #{error.checkout_id} ({error.token}): {error.message}")
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
    return ", ".join(f"{name} {count}" for name, count in sorted(statuses.items()))


@dataclass(frozen=True)
class _Outcome:
    """What polling one checkout did: recorded into the report by the run's own thread."""

    paid: bool
    error: ReconcileError | None = None
    status: str = ""
    changed: bool = False
    confirmed: bool = False
    expired: int = 0
    refunded_cents: int = 0
    flagged: bool = False


def _record(report: ReconcileReport, outcome: _Outcome) -> None:
    if outcome.error is not None:
        report.errors.append(outcome.error)
        if outcome.paid:
            report.paid_failed += 1
        return
    if outcome.paid:
        report.paid_polled += 1
        report.paid_changed += outcome.changed
    else:
        report.polled += 1
        report.changed += outcome.changed
        report.confirmed += outcome.confirmed
        report.expired += outcome.expired
    if outcome.refunded_cents > 0:
        report.refunded += 1
        report.refunded_cents += outcome.refunded_cents
    report.flagged += outcome.flagged
    (report.paid_statuses if outcome.paid else report.statuses)[outcome.status] += 1
