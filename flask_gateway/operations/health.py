"""Callback health: do the gateway's callbacks reach the shop, and which path confirms the payments?

:func:`callback_health` reads the figures from the database, so every worker process and every machine
sees the same ones: the admin status page shows them, ``flask_gateway.operations.metrics`` exports them at
scrape time, :meth:`CallbackHealth.summary` is a line for a terminal or a log. :func:`check_callback_health`
also warns when the callbacks went silent (the status page and reconciliation run it).

What each figure is (over a window, the last 24 hours unless told):

- **The last callback**: the newest *verified* row of the callback log (``gateway_callback_log``: its
  signature matched the installation's key), whatever its outcome: proof that the gateway's callbacks
  reach the shop and verify. A refused callback proves nothing of the kind: anyone can post one.
- **Confirmations by path**: the payments confirmed in the window (``payment_confirmed_at``), each counted
  once, by the source of the status change that confirmed it: the checkout's first applied timeline event
  (``gateway_checkout_events``) to ``PAID`` or ``PAID_PENDING_CALLBACK``, written by ``transitions.apply``
  in the very transaction that set ``payment_confirmed_at``. Its ``source`` is ``callback``, ``return``
  (the shopper came back), ``poll`` or ``admin`` (a status check), ``reconcile`` or ``v1`` (the v1
  success URL).
- **Refused callbacks**: callbacks received in the window that were answered with an error or never
  answered (HTTP status 400 or more, or none yet): the callback log's "refused or unanswered" filter.
  ``flask gateway doctor``'s own probe (``doctor-probe``, answered 401) is not one (``REFUSED``).
- **Paid, awaiting the callback**: v2 checkouts in ``PAID_PENDING_CALLBACK`` whose callback may still
  come. The gateway said "paid" (to the shopper's return page, a status check or reconciliation) and no
  payment callback has been acknowledged yet: a verified payment callback records ``PAID``, as the
  gateway says ``PAID`` once the shop answered its callback with 200. The payment is confirmed
  (``payment_confirmed`` was sent, the order fulfilled); what is missing is the gateway's callback. The
  oldest one's age counts from its ``paid_at``.
- **Callback never came**: a callback lost for good leaves the checkout in ``PAID_PENDING_CALLBACK`` for
  ever, at the gateway too (it says ``PAID`` only after a callback answered 200). Once the gateway,
  asked at least ``CALLBACK_ATTEMPTS_WINDOW`` after the payment (by reconciliation, a status check,
  the shopper's return), still says ``PAID_PENDING_CALLBACK``, its attempts are over and the payment is
  confirmed with it: the checkout stops awaiting the callback and counts here instead (those paid in the
  window). The rule reads the checkout's timeline (``gateway_checkout_events``: every answer of the
  gateway is a line of it, a "no change" one too).
- **Silent**: no verified callback for ``GATEWAY_CALLBACK_SILENCE_MINUTES`` while at least
  ``GATEWAY_CALLBACK_SILENCE_PAYMENTS`` v2 payments were confirmed another way in those minutes: the
  gateway takes payments, but its callbacks do not arrive (a wrong callback URL, a stale signing key, a
  firewall or a login wall in front of ``/gateway/callback``). v1 checkouts have no callbacks: not counted.

**Once per silent spell.** A spell is named by the last verified callback before it (or "none ever"), so
it lasts until a verified callback arrives. The first check that finds a spell logs a WARNING and sends
``callbacks_silent``; it remembers that on the storage the rate limits use, which every worker and machine
shares (``GATEWAY_RATELIMIT_STORAGE_URI``: by default the ``gateway_rate_limits`` table), for 30 days,
with an atomic increment, so two checks at once still warn once. Later checks of the same spell log at
INFO. Should that storage fail, the check warns and signals anyway: twice is better than never.

**Several merchant accounts.** Each figure can be read for one account (``callback_health(account=...)``):
a callback counts for the account of the checkout it names (else the account its
``X-Merchant-Account-ID`` header claimed; a refused callback that names neither counts for no account), a
payment for its checkout's. Without ``account`` the figures are the whole shop's, as with one account,
except the silence: with several accounts each one's callbacks are watched apart (one account's callbacks
can stop while another's arrive, and the shop-wide last callback would hide it), so ``silences`` lists
every silent account, each :class:`Silence` naming its account, and ``callbacks_silent`` is sent once per
spell of each. A shop with one account gets what it always got (its one account named in the signal).
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Final, TypeVar

from flask import Flask
from limits.storage import Storage
from sqlalchemy import ColumnElement, Row, Select, and_, bindparam, case, exists, func, literal, or_, select
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import Session
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement

from flask_gateway import signals
from flask_gateway.clock import format_time
from flask_gateway.core.sql import UTCDateTime, sqlite_read_transactions
from flask_gateway.core.timestamps import utcnow
from flask_gateway.core.wire import PAYMENT_STATUSES, CheckoutStatus
from flask_gateway.models import CallbackLog, CallbackOutcome, CheckoutEvent, GatewayCheckout, Installation
from flask_gateway.operations.ratelimit import make_storage, watch_of
from flask_gateway.state import get_state, leaves_no_transaction

__all__ = [
    "CALLBACK_ATTEMPTS_WINDOW",
    "CONFIRMATION_PATHS",
    "DAY",
    "GATEWAY_ANSWER_SOURCES",
    "REFUSED",
    "SPELL_MEMORY_SECONDS",
    "CallbackHealth",
    "PathShare",
    "Silence",
    "callback_account",
    "callback_health",
    "check_callback_health",
    "describe_age",
    "silence_text",
]

log = logging.getLogger("flask_gateway.health")

#: The window of the status page's figures.
DAY: Final = timedelta(days=1)
#: The sources that can confirm a payment (``CheckoutEvent.source``), in the order they are listed.
CONFIRMATION_PATHS: Final = ("callback", "return", "poll", "reconcile", "admin", "v1")
#: How long after a payment the gateway's callback attempts (three, then its dead-letter queue) are surely
#: over: the specification gives no timing, so an hour (docs/decisions.md). A checkout the gateway still
#: calls ``PAID_PENDING_CALLBACK`` when asked after that will get no callback.
CALLBACK_ATTEMPTS_WINDOW: Final = timedelta(hours=1)
#: The sources of a timeline event that is the gateway's own getstatus answer.
GATEWAY_ANSWER_SOURCES: Final = ("poll", "reconcile", "admin", "return")
#: The callback log's "refused or unanswered" rows: answered 400 or more, or never answered; the
#: doctor's probe (answered 401 as any unsigned request) is not a refusal.
REFUSED: Final = and_(
    or_(CallbackLog.http_status >= 400, CallbackLog.http_status == 0),
    CallbackLog.outcome != CallbackOutcome.DOCTOR_PROBE.value,
)
#: How long the warning of a silent spell is remembered (a spell longer than this is announced again).
SPELL_MEMORY_SECONDS: Final = 30 * 24 * 3600
_SPELL_KEY: Final = "flask-gateway/callbacks-silent/"
_PAYMENT: Final = sorted(PAYMENT_STATUSES)
_SelectT = TypeVar("_SelectT", bound="Select[*tuple[Any, ...]]")


@dataclass(frozen=True)
class Silence:
    """Callbacks went silent while payments continued."""

    #: ``GATEWAY_CALLBACK_SILENCE_MINUTES``: how long without a verified callback.
    minutes: int
    #: v2 payments confirmed another way (return, status check, reconciliation) in those minutes.
    payments: int
    #: The last verified callback before the silence; None when none ever reached the shop.
    last_callback_at: datetime | None
    last_callback_id: int | None
    #: The merchant account whose callbacks are silent (with one account, its id; None: not installed).
    account: str | None = None
    #: The shop has several accounts: this one's callbacks were watched apart, and the words name it.
    named: bool = False

    @property
    def period(self) -> timedelta:
        """The minutes without a verified callback that make a silence."""
        return timedelta(minutes=self.minutes)


@dataclass(frozen=True)
class PathShare:
    """The payments one path confirmed, and their share of all confirmed in the window (0 to 1)."""

    path: str
    count: int
    share: float


@dataclass(frozen=True)
class CallbackHealth:
    """The figures of :func:`callback_health` (see the module docstring for what each one counts)."""

    checked_at: datetime
    window: timedelta
    #: The newest verified callback: when, and its ``CallbackLog.outcome``.
    last_callback_at: datetime | None = None
    last_callback_outcome: str | None = None
    #: Callbacks received in the window, by ``CallbackLog.outcome`` (refused ones included).
    callbacks: Mapping[str, int] = field(default_factory=dict)
    #: Callbacks received in the window answered with an error (HTTP 400 or more) or never answered.
    refused: int = 0
    #: Payments confirmed in the window, by the path that confirmed them (``CONFIRMATION_PATHS``).
    confirmations: Mapping[str, int] = field(default_factory=dict)
    #: v2 checkouts in ``PAID_PENDING_CALLBACK`` whose callback may still come (module docstring).
    awaiting_callback: int = 0
    #: The oldest of them: its ``paid_at``.
    oldest_awaiting_paid_at: datetime | None = None
    #: Paid in the window, the gateway's callback attempts over, the payment confirmed with the gateway
    #: (``PAID_PENDING_CALLBACK`` when asked after ``CALLBACK_ATTEMPTS_WINDOW``): no callback came.
    callback_never_came: int = 0
    #: Set when the callbacks went silent while payments continued (several accounts: the first silent
    #: account's; every one is in ``silences``).
    silence: Silence | None = None
    #: The merchant account these figures are of; None: the whole shop.
    account: str | None = None
    #: Every silent account (one at most with one account, or with ``account``): see the module docstring.
    silences: tuple[Silence, ...] = ()

    @property
    def silent(self) -> bool:
        return self.silence is not None

    @property
    def confirmed(self) -> int:
        """Payments confirmed in the window, by any path."""
        return sum(self.confirmations.values())

    @property
    def shares(self) -> list[PathShare]:
        """The paths that confirmed payments in the window, in ``CONFIRMATION_PATHS`` order."""
        total = self.confirmed
        order = {path: n for n, path in enumerate(CONFIRMATION_PATHS)}
        paths = sorted(self.confirmations, key=lambda path: (order.get(path, len(order)), path))
        return [
            PathShare(path, self.confirmations[path], self.confirmations[path] / total)
            for path in paths
            if self.confirmations[path]
        ]

    @property
    def last_callback_age(self) -> timedelta | None:
        return None if self.last_callback_at is None else _age(self.checked_at, self.last_callback_at)

    @property
    def oldest_awaiting_age(self) -> timedelta | None:
        paid_at = self.oldest_awaiting_paid_at
        return None if paid_at is None else _age(self.checked_at, paid_at)

    def summary(self) -> str:
        """The figures in a line (two when silent), for a terminal or a log."""
        window = describe_age(self.window)
        if self.last_callback_at is None:
            last = "no verified callback yet"
        else:
            age = describe_age(self.last_callback_age or timedelta())
            last = f"last verified callback {age} ago ({self.last_callback_outcome})"
        paths = ", ".join(f"{share.path} {share.count}" for share in self.shares)
        whose = "" if self.account is None else f" of merchant account {self.account}"
        line = (
            f"Callbacks{whose}: {last}; in the last {window}: {self.confirmed} payment(s) confirmed"
            f"{f' ({paths})' if paths else ''}, {self.refused} callback(s) refused or unanswered; "
            f"{self.awaiting_callback} paid checkout(s) awaiting the gateway's callback"
        )
        if self.oldest_awaiting_age is not None:
            line += f", the oldest paid {describe_age(self.oldest_awaiting_age)} ago"
        if self.callback_never_came:
            line += (
                f"; {self.callback_never_came} paid in the last {window} got no callback "
                "(the gateway's attempts are over; confirmed with the gateway)"
            )
        line += "."
        silences = self.silences or ((self.silence,) if self.silence is not None else ())
        if silences:
            line = "\n".join([*(silence_text(silence) for silence in silences), line])
        return line


def silence_text(silence: Silence) -> str:
    """What a silent spell means, in a sentence (the log line's words)."""
    since = (
        "no verified callback has ever reached the shop"
        if silence.last_callback_at is None
        else f"no verified callback since {format_time(silence.last_callback_at, get_state().config.zone)}"
    )
    whose = f" of merchant account {silence.account!r}" if silence.named else ""
    return (
        f"Gateway callbacks{whose} are silent: {since}, while {silence.payments} payment(s) were confirmed "
        f"another way in the last {describe_age(silence.period)}. Check the callback URL, the "
        "stored signing key and what stands in front of /gateway/callback (firewall, login wall, proxy)."
    )


def describe_age(age: timedelta) -> str:
    """``45 seconds``, ``1 minute``, ``3 hours``, ``2 days``: the largest whole unit."""
    seconds = max(int(age.total_seconds()), 0)
    for unit, size in (("day", 86_400), ("hour", 3_600), ("minute", 60)):
        if seconds >= size:
            count = seconds // size
            return f"{count} {unit}{'' if count == 1 else 's'}"
    return f"{seconds} second{'' if seconds == 1 else 's'}"


def _age(now: datetime, then: datetime) -> timedelta:
    return max(now - then, timedelta())


# --- the figures -----------------------------------------------------------------------------------------


@leaves_no_transaction
def callback_health(
    *, window: timedelta = DAY, now: datetime | None = None, account: str | None = None
) -> CallbackHealth:
    """The callback health figures over the last ``window`` (read only; needs an app context): of the
    merchant ``account``, or with None of the whole shop (its accounts' silences each apart)."""
    state = get_state()
    session = state.session
    now = now or utcnow()
    since = now - window
    with sqlite_read_transactions():  # readers never take SQLite's write lock
        accounts = [row[0] for row in session.execute(_ACCOUNTS, {"environment": state.config.environment})]
        last = _last_verified(session, account)
        callbacks: dict[str, int] = {}
        refused_count = 0
        for outcome, count, refusals in session.execute(
            _of_account(
                select(CallbackLog.outcome, func.count(), func.sum(case((REFUSED, 1), else_=0))),
                account,
            )
            .where(CallbackLog.received_at >= since)
            .group_by(CallbackLog.outcome)
        ):
            callbacks[outcome] = int(count)
            refused_count += int(refusals or 0)
        over = _callback_attempts_over()
        mine = _checkouts_of(account)
        awaiting, oldest = session.execute(
            select(func.count(), func.min(GatewayCheckout.paid_at)).where(_PENDING_CALLBACK, ~over, *mine)
        ).one()
        never_came = session.scalar(
            select(func.count()).where(_PENDING_CALLBACK, over, GatewayCheckout.paid_at >= since, *mine)
        )
        minutes = state.config.callback_silence_minutes
        payments = state.config.callback_silence_payments
        named = len(accounts) > 1
        silences: list[Silence] = []
        if account is not None or not named:
            # One account watched (the one asked for, or the shop's only one): as it always was.
            silence = _silence(
                session,
                now,
                last_id=last.id if last else None,
                last_at=last.received_at if last else None,
                minutes=minutes,
                payments=payments,
                account=account,
                named=named,
                label=account if account is not None else (accounts[0] if accounts else None),
            )
            silences += [silence] if silence is not None else []
        else:
            for each in accounts:  # several: each account's callbacks apart
                its_last = _last_verified(session, each)
                silence = _silence(
                    session,
                    now,
                    last_id=its_last.id if its_last else None,
                    last_at=its_last.received_at if its_last else None,
                    minutes=minutes,
                    payments=payments,
                    account=each,
                    named=True,
                    label=each,
                )
                silences += [silence] if silence is not None else []
        confirmations = _confirmations(session, since, account=account)
    return CallbackHealth(
        checked_at=now,
        window=window,
        last_callback_at=last.received_at if last else None,
        last_callback_outcome=last.outcome if last else None,
        callbacks=callbacks,
        refused=refused_count,
        confirmations=confirmations,
        awaiting_callback=int(awaiting or 0),
        oldest_awaiting_paid_at=oldest,
        callback_never_came=int(never_came or 0),
        silence=silences[0] if silences else None,
        account=account,
        silences=tuple(silences),
    )


#: The accounts installed for an environment, open and retired, oldest first (ids only).
_ACCOUNTS: Final = (
    select(Installation.merchant_account_id)
    .where(Installation.environment == bindparam("environment"))
    .order_by(Installation.id)
)


def callback_account() -> ColumnElement[str | None]:
    """The merchant account a callback log row counts for: its checkout's, else the one its
    ``X-Merchant-Account-ID`` header claimed (a query on ``CallbackLog`` outer-joined to its checkout)."""
    return func.coalesce(GatewayCheckout.merchant_account_id, CallbackLog.merchant_account_id)


def _of_account(query: _SelectT, account: str | None) -> _SelectT:
    """``query`` on the callback log, kept to the rows that count for ``account`` (None: every row)."""
    if account is None:
        return query
    return query.outerjoin(GatewayCheckout, GatewayCheckout.id == CallbackLog.checkout_id).where(
        callback_account() == account
    )


def _checkouts_of(account: str | None) -> tuple[ColumnElement[bool], ...]:
    return () if account is None else (GatewayCheckout.merchant_account_id == account,)


def _last_verified(session: Session, account: str | None) -> Row[int, datetime, str] | None:
    """The newest verified callback (of ``account``): its id, time and outcome."""
    return session.execute(
        _of_account(select(CallbackLog.id, CallbackLog.received_at, CallbackLog.outcome), account)
        .where(CallbackLog.verified.is_(True))
        .order_by(CallbackLog.id.desc())
        .limit(1)
    ).first()


_PENDING_CALLBACK: Final = and_(
    GatewayCheckout.status == CheckoutStatus.PAID_PENDING_CALLBACK.value,
    GatewayCheckout.api_version == "v2",
)


class _PlusSeconds(FunctionElement[datetime]):
    """``column + seconds`` as a time, in the database's own words (SQLite and PostgreSQL)."""

    type = UTCDateTime()
    inherit_cache = True
    name = "plus_seconds"


@compiles(_PlusSeconds, "sqlite")
def _plus_seconds_sqlite(element: _PlusSeconds, compiler: SQLCompiler, **kw: Any) -> str:
    column, seconds = list(element.clauses)
    # Stored as 'YYYY-MM-DD HH:MM:SS.ffffff' (UTC); datetime() answers in the same form, to the second.
    modifier = f"'+' || {compiler.process(seconds, **kw)} || ' seconds'"
    return f"datetime({compiler.process(column, **kw)}, {modifier})"


@compiles(_PlusSeconds)
def _plus_seconds_default(element: _PlusSeconds, compiler: SQLCompiler, **kw: Any) -> str:
    column, seconds = list(element.clauses)
    return f"({compiler.process(column, **kw)} + make_interval(secs => {compiler.process(seconds, **kw)}))"


def _callback_attempts_over() -> ColumnElement[bool]:
    """The checkout's own timeline has a getstatus answer of ``PAID_PENDING_CALLBACK`` given at least
    ``CALLBACK_ATTEMPTS_WINDOW`` after its payment: the gateway's attempts were over, no callback came."""
    return exists().where(
        CheckoutEvent.checkout_id == GatewayCheckout.id,
        CheckoutEvent.source.in_(GATEWAY_ANSWER_SOURCES),
        CheckoutEvent.to_status == CheckoutStatus.PAID_PENDING_CALLBACK.value,
        CheckoutEvent.at
        >= _PlusSeconds(GatewayCheckout.paid_at, literal(int(CALLBACK_ATTEMPTS_WINDOW.total_seconds()))),
    )


def _confirmations(
    session: Session, since: datetime, *, v2_only: bool = False, account: str | None = None
) -> dict[str, int]:
    """Payments confirmed since ``since``, by the source of the event that confirmed each one."""
    confirming = (
        select(func.min(CheckoutEvent.id))
        .join(GatewayCheckout, GatewayCheckout.id == CheckoutEvent.checkout_id)
        .where(
            GatewayCheckout.payment_confirmed_at >= since,
            CheckoutEvent.at >= since,  # the confirming event's time is payment_confirmed_at itself
            CheckoutEvent.applied.is_(True),
            CheckoutEvent.to_status.in_(_PAYMENT),
        )
        .group_by(CheckoutEvent.checkout_id)
    )
    if v2_only:
        confirming = confirming.where(GatewayCheckout.api_version == "v2")
    if account is not None:
        confirming = confirming.where(GatewayCheckout.merchant_account_id == account)
    rows = session.execute(
        select(CheckoutEvent.source, func.count())
        .where(CheckoutEvent.id.in_(confirming.scalar_subquery()))
        .group_by(CheckoutEvent.source)
    )
    return {source: int(count) for source, count in rows}


def _silence(
    session: Session,
    now: datetime,
    *,
    last_id: int | None,
    last_at: datetime | None,
    minutes: int,
    payments: int,
    account: str | None,
    named: bool,
    label: str | None,
) -> Silence | None:
    """The silence of ``account``'s callbacks (None: the whole shop's), named ``label`` in the signal."""
    since = now - timedelta(minutes=minutes)
    if last_at is not None and last_at >= since:
        return None  # a verified callback came within the minutes: not silent
    confirmed = _confirmations(session, since, v2_only=True, account=account)
    other_ways = sum(count for source, count in confirmed.items() if source != "callback")
    if other_ways < payments:
        return None
    return Silence(
        minutes=minutes,
        payments=other_ways,
        last_callback_at=last_at,
        last_callback_id=last_id,
        account=label,
        named=named,
    )


# --- the check -----------------------------------------------------------------------------------------


def check_callback_health(*, now: datetime | None = None, account: str | None = None) -> CallbackHealth:
    """:func:`callback_health` over the last day (of ``account``, or the whole shop's), and when the
    callbacks (of an account, with several) went silent while payments continued: a WARNING log line and
    ``callbacks_silent``, once per silent spell (module docstring)."""
    health = callback_health(now=now, account=account)
    for silence in health.silences:
        _announce(health, silence)
    return health


def _announce(health: CallbackHealth, silence: Silence) -> None:
    app = signals.sender()
    # One account: the key it always had. Several: each account's spells apart (two accounts that never
    # got a callback must not share the "none ever" spell).
    spell = (
        f"{silence.account}/{silence.last_callback_id or 0}" if silence.named else silence.last_callback_id
    )
    if not _first_notice(app, f"{_SPELL_KEY}{spell or 0}"):
        log.info("gateway callbacks still silent (warned already): %s", silence_text(silence))
        return
    log.warning("%s", silence_text(silence))
    if silence.named and health.account != silence.account:
        health = callback_health(now=health.checked_at, account=silence.account)  # that account's figures
    signals.callbacks_silent.send(
        app,
        account=silence.account,
        health=health,
        last_callback_at=silence.last_callback_at,
        payments=silence.payments,
    )


#: The storage that remembers the warned spells, per app (the rate limits' kind of storage).
_STORAGES: weakref.WeakKeyDictionary[Flask, Storage] = weakref.WeakKeyDictionary()


def _first_notice(app: Flask, key: str) -> bool:
    """True for the first check of a spell (counted atomically on the shared storage)."""
    storage = _STORAGES.get(app)
    try:
        if storage is None:
            storage = _STORAGES[app] = make_storage(get_state(app).config.ratelimit_storage_uri)
        first = storage.incr(key, SPELL_MEMORY_SECONDS) == 1
    except Exception as error:
        if storage is None:
            log.warning("callback health: the rate-limit storage cannot be built (%s)", error)
        else:  # one WARNING per failing spell of the storage, shared with the rate limits built on it
            watch_of(storage).failed(
                "callback-health", "its silent-spell warning may repeat", error, let_through=False
            )
        return True
    watch_of(storage).succeeded()
    return first
