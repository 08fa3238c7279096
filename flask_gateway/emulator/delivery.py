"""Outbox delivery: signed status callbacks, v1 ABANDONED notices, failure e-mails, the background worker.

The outbox is the ``Delivery`` table; :mod:`~flask_gateway.emulator.checkouts` adds rows when a v2
checkout is paid (and, for accounts with ``cancelCallbacks``, when the consumer cancels) and when a v1
order expires. :func:`run_due` makes the attempts that are due; the worker thread of each server process
calls it every ``EMULATOR_WORKER_INTERVAL`` seconds (app config, default 0.5), and so do
``POST /_emulator/deliver`` and ``POST /_emulator/clock/advance``.

One attempt is four short transactions, and none is open while talking to the merchant or to SMTP:

1. **claim**: the oldest due row (``pending``, ``next_attempt_at <= clock.now()``, lease free) is
   locked with ``SELECT ... FOR UPDATE SKIP LOCKED`` and leased (``claimed_until`` = real time + 60 s),
   so several workers, in one process or many, never make the same attempt twice. The lease runs on
   real time, not on the test clock, so advancing the clock never breaks a lease held by an attempt in
   flight. An attempt that a database outage cuts short gives its lease back as soon as the database
   answers again (the process remembers it), so it is made again within a tick, not a minute later.
2. **prepare**: the checkout is locked and its expiry applied; for a callback its
   ``lastCallbackAttemptedAt`` is set to the attempt time and the body is built from the checkout's
   status *at the time of the attempt* (``checkouts.status_payload``). So the body carries this
   attempt's own ``lastCallbackAttemptedAt`` and the *previous* attempt's
   ``lastCallbackAttemptStatusMessage`` (``null`` on the first attempt): the outcome of an attempt
   cannot be known while it is being made. A ``getstatus`` during the attempt shows the same values.
3. **send**: callbacks first consult the injected faults (``callback_fail`` records ``HTTP 500``,
   ``callback_timeout`` records ``Timeout after 10 s``, nothing is sent), then POST the exact body bytes,
   signed (``X-Signature``, ``X-Merchant-Account-ID``), with a 10 s timeout; only HTTP 200
   acknowledges. v1 ABANDONED notices GET the order's fail URL with ``token``, ``status=FAIL`` and
   ``reason=ABANDONED``; any HTTP 200 acknowledges (no consumer is waiting to be redirected, so the
   answer's ``return_url`` is not needed).
4. **record**: checkout and delivery locked again; a ``DeliveryAttempt`` is stored, the checkout's
   ``lastCallbackAttemptedAt``/``lastCallbackAttemptStatusMessage`` set (``"OK"`` after a 200), and a
   checkout that was sent as ``PAID_PENDING_CALLBACK`` and is still in it becomes ``PAID``. A failure
   schedules the next attempt after ``EMULATOR_CALLBACK_RETRY_DELAYS[n-1]`` seconds of the test clock;
   after the last (default: 3rd) attempt the delivery is ``dead`` (the dead letter queue) and the
   checkout keeps its status. Every outcome is a line on the checkout's timeline.

Each failed *callback* attempt writes one e-mail (:mod:`~flask_gateway.emulator.mail`) when the
account's ``callbackFailuresEmail`` is set; v1 ABANDONED notices write none (the setting belongs to the
v2 callbacks).

``paymentUrl`` in a callback body needs the emulator's external address: ``EMULATOR_PUBLIC_URL`` when
set, else the URL of the current request (``/_emulator/deliver``, ``clock/advance``), else the address
of the last request this process served (remembered by ``views/deliveries.py``), else
``http://localhost``. The background worker never guesses: a freshly started process delivers once it
has served its first request (at once with ``EMULATOR_PUBLIC_URL``), so no callback carries a made-up
address, and the watcher process of ``flask run --debug`` (which serves nothing) never delivers.

A callback is sent to the account's *current* ``checkoutStatusCallbackUrl``: when the merchant changes it
(``PATCH /install/v2``), pending retries and redelivered dead letters follow (``Delivery.url`` is updated
and the change is a timeline event). v1 notices keep the fail URL of their order.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from flask import Flask, current_app, has_request_context, request
from sqlalchemy import ColumnElement, or_, select, update

from flask_gateway.core.outages import is_database_outage
from flask_gateway.core.sql import sqlite_read_transactions
from flask_gateway.core.timestamps import format_timestamp, utcnow
from flask_gateway.core.wire import CheckoutStatus, V1FailReason, V1OutcomeStatus
from flask_gateway.emulator import checkouts, clock, faults, mail, merchant
from flask_gateway.emulator.access import visible_url
from flask_gateway.emulator.api import settings
from flask_gateway.emulator.database import database_state
from flask_gateway.emulator.merchant import CALLBACK_TIMEOUT, MerchantReply
from flask_gateway.emulator.models import (
    Account,
    Checkout,
    Delivery,
    DeliveryAttempt,
    DeliveryKind,
    DeliveryState,
    Email,
    db,
)
from flask_gateway.emulator.problems import ApiProblem

__all__ = [
    "CLAIM_LEASE",
    "DEFAULT_WORKER_INTERVAL",
    "FALLBACK_BASE_URL",
    "address_known",
    "base_url",
    "describe_attempt",
    "describe_delivery",
    "redeliver",
    "remember_base_url",
    "run_due",
    "start_worker",
    "stop_worker",
]

_log = logging.getLogger(__name__)

#: How long a claimed delivery stays reserved for the worker that claimed it (real time).
CLAIM_LEASE: Final = timedelta(seconds=60)
#: Seconds between two runs of the background worker (app config ``EMULATOR_WORKER_INTERVAL``).
DEFAULT_WORKER_INTERVAL: Final = 0.5
#: The ``paymentUrl`` base when nothing better is known (see the module docstring).
FALLBACK_BASE_URL: Final = "http://localhost"

_BASE_URL_KEY: Final = "gateway_emulator_base_url"
_WORKER_KEY: Final = "gateway_emulator_worker"
_worker_lock = threading.Lock()


# --- the emulator's external address ----------------------------------------------------------------


def remember_base_url(url: str) -> None:
    """Remember where the current app was last reached (used for ``paymentUrl`` outside requests)."""
    current_app.extensions[_BASE_URL_KEY] = url.rstrip("/")


def base_url() -> str:
    """The base of ``paymentUrl`` in callback bodies and e-mails (see the module docstring)."""
    public = settings().public_url
    if public:
        return public
    if has_request_context():
        return request.url_root.rstrip("/")
    remembered: str | None = current_app.extensions.get(_BASE_URL_KEY)
    return remembered or FALLBACK_BASE_URL


def address_known() -> bool:
    """True once ``paymentUrl`` needs no guess: ``EMULATOR_PUBLIC_URL`` is set or a request was served."""
    return bool(settings().public_url or current_app.extensions.get(_BASE_URL_KEY))


# --- running the outbox -----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Job:
    """Everything one attempt needs, read while the rows were locked (no ORM access while sending)."""

    delivery_id: int
    kind: str
    number: int
    at: datetime
    #: The URL as called (v1: the fail URL with the query parameters added).
    url: str
    #: The stored URL (``Delivery.url``).
    target: str
    body: bytes
    account_id: str
    signing_key: str | None
    checkout_token: str
    #: The ``checkoutPaymentStatus`` the callback body carries.
    sent_status: str


def run_due(*, limit: int = 100) -> int:
    """Run every due delivery attempt now, synchronously; returns how many attempts were made.

    Expires the checkouts whose time has come first (a v1 expiry enqueues its ABANDONED notice). Each
    delivery gets at most one attempt per call, even when its retry delay is zero.
    """
    _release_cut_short()
    checkouts.expire_due()
    db.session.commit()
    done: list[int] = []
    while len(done) < limit:
        claimed = _claim_next(exclude=done)
        if claimed is None:
            break
        delivery_id, lease = claimed
        done.append(delivery_id)
        _attempt_holding(delivery_id, lease)
    return len(done)


def redeliver(delivery_id: int) -> int | None:
    """Put a dead letter back in the outbox and make its attempt now.

    404 when there is no such delivery, 409 when it is not dead. The attempt counter starts again at 0,
    so the redelivered message gets the full retry schedule. Returns the new attempt's id (None only if
    the checkout disappeared meanwhile, e.g. by a reset).
    """
    # Ids are 32-bit on PostgreSQL: a larger one names no row (and would be a 500 in the query).
    delivery = (
        db.session.get(Delivery, delivery_id, with_for_update=True, populate_existing=True)
        if 0 < delivery_id < 2**31
        else None
    )
    if delivery is None:
        db.session.rollback()
        raise ApiProblem(404, f"No delivery with id {delivery_id}.")
    if delivery.state != DeliveryState.DEAD:
        db.session.rollback()
        raise ApiProblem(
            409,
            f"Delivery {delivery_id} is {delivery.state}, not dead: only dead letters can be redelivered.",
        )
    delivery.state = DeliveryState.PENDING.value
    delivery.attempts = 0
    delivery.next_attempt_at = clock.now()
    lease = delivery.claimed_until = utcnow() + CLAIM_LEASE  # ours: the worker must not take it meanwhile
    checkouts.record_event(
        delivery.checkout, f"{_label(delivery.kind)}-requeued", "from the dead letter queue"
    )
    db.session.commit()
    return _attempt_holding(delivery_id, lease)


def due(lease_now: datetime) -> tuple[ColumnElement[bool], ...]:
    """The conditions of a delivery whose attempt is due and that no worker holds."""
    return (
        Delivery.state == DeliveryState.PENDING.value,
        Delivery.next_attempt_at <= clock.now(),
        or_(Delivery.claimed_until.is_(None), Delivery.claimed_until < lease_now),
    )


def anything_due() -> bool:
    """Whether :func:`run_due` would find anything to do now (an expiry, or an attempt): one read-only
    query, which on SQLite takes no write lock (``run_due`` takes it twice even when there is nothing)."""
    _release_cut_short()  # a lease released is a delivery due again
    with sqlite_read_transactions():
        try:
            found = db.session.execute(
                select(
                    or_(
                        select(Checkout.id).where(*checkouts.expiry_due(clock.now())).exists(),
                        select(Delivery.id).where(*due(utcnow())).exists(),
                    )
                )
            ).scalar()
        finally:
            db.session.rollback()  # the next transaction (run_due's) begins as a writing one
    return bool(found)


def _claim_next(*, exclude: list[int]) -> tuple[int, datetime] | None:
    """Lease the oldest due delivery (skipping rows another worker holds); its id and lease, or None."""
    lease_now = utcnow()
    query = (
        select(Delivery)
        .where(*due(lease_now))
        .order_by(Delivery.next_attempt_at, Delivery.id)
        .limit(1)
        .with_for_update(skip_locked=True)
        .execution_options(populate_existing=True)
    )
    if exclude:
        query = query.where(Delivery.id.not_in(exclude))
    delivery = db.session.scalars(query).first()
    if delivery is None:
        db.session.commit()
        return None
    lease = delivery.claimed_until = lease_now + CLAIM_LEASE
    delivery_id = delivery.id
    db.session.commit()
    return delivery_id, lease


# --- attempts cut short by a database outage -------------------------------------------------------------
#
# An attempt whose database went away between its claim and its record leaves the delivery leased for
# CLAIM_LEASE (60 s): nothing else may make it meanwhile. This process knows it holds no such attempt any
# more, so it gives the lease back as soon as the database answers (the next run_due or anything_due),
# and the delivery is attempted again within a tick instead of a minute. The callback may have been sent
# already: it is sent again, which a merchant must accept anyway (at least once, the same body).

_CUT_SHORT_KEY: Final = "gateway_emulator_cut_short"
_cut_short_lock = threading.Lock()


def _attempt_holding(delivery_id: int, lease: datetime) -> int | None:
    """:func:`_attempt` for a delivery this process leased until ``lease``; remembers an outage's victim."""
    try:
        return _attempt(delivery_id)
    except Exception as error:
        if is_database_outage(error):
            with _cut_short_lock:
                current_app.extensions.setdefault(_CUT_SHORT_KEY, {})[delivery_id] = lease
        raise


def _release_cut_short() -> None:
    """Give back the leases of attempts an outage cut short (only while still ours: same lease value)."""
    cut_short: dict[int, datetime] | None = current_app.extensions.get(_CUT_SHORT_KEY)
    if not cut_short:  # the common case: one dict lookup
        return
    with _cut_short_lock:
        pending = dict(cut_short)
    for delivery_id, lease in pending.items():
        db.session.execute(
            update(Delivery)
            .where(Delivery.id == delivery_id, Delivery.claimed_until == lease)
            .values(claimed_until=None)
        )
    db.session.commit()
    with _cut_short_lock:
        for delivery_id in pending:
            cut_short.pop(delivery_id, None)


def _attempt(delivery_id: int) -> int | None:
    job = _prepare(delivery_id)
    if job is None:
        return None
    reply, injected = _send(job)
    return _record(job, reply, injected)


def _prepare(delivery_id: int) -> _Job | None:
    """Lock checkout and delivery, stamp the attempt time, build the body; commit before sending."""
    delivery = db.session.get(Delivery, delivery_id)
    if delivery is None:
        db.session.rollback()
        return None
    try:
        checkout = checkouts.lock(None, delivery.checkout.token)
    except ApiProblem:
        db.session.rollback()
        return None
    delivery = db.session.get(Delivery, delivery_id, with_for_update=True, populate_existing=True)
    account = db.session.get(Account, checkout.account_id)
    if delivery is None or account is None:
        db.session.rollback()
        return None
    at = clock.now()
    if delivery.kind == DeliveryKind.CALLBACK:
        if account.callback_url and account.callback_url != delivery.url:
            # The merchant changed checkoutStatusCallbackUrl (PATCH /install/v2): follow it, so fixing a
            # broken URL and redelivering the dead letters works.
            checkouts.record_event(
                checkout, "callback-url-changed", f"{delivery.url} -> {account.callback_url}"
            )
            delivery.url = account.callback_url
        checkout.last_callback_attempted_at = at
        body = checkouts.status_payload(checkout, base_url()).to_json(settings().wire_names)
        url = delivery.url
    else:
        body = b""
        url = merchant.with_query(
            delivery.url,
            {
                "token": checkout.token,
                "status": V1OutcomeStatus.FAIL.value,
                "reason": V1FailReason.ABANDONED.value,
            },
        )
    job = _Job(
        delivery_id=delivery.id,
        kind=delivery.kind,
        number=delivery.attempts + 1,
        at=at,
        url=url,
        target=delivery.url,
        body=body,
        account_id=account.merchant_account_id,
        signing_key=account.signing_key,
        checkout_token=checkout.token,
        sent_status=checkout.status,
    )
    db.session.commit()
    return job


def _send(job: _Job) -> tuple[MerchantReply, bool]:
    """Talk to the merchant (no transaction open). Returns the reply and whether a fault was injected."""
    if job.kind == DeliveryKind.CALLBACK:
        rule = faults.take("callback", "callback_fail", "callback_timeout")
        fault = rule.kind if rule is not None else None
        db.session.rollback()  # reading the rule may have begun a transaction: end it before the HTTP call
        if fault == "callback_fail":
            return MerchantReply(False, 500, "HTTP 500", 0), True
        if fault == "callback_timeout":
            return MerchantReply(False, None, f"Timeout after {CALLBACK_TIMEOUT:g} s", 0), True
        if not job.signing_key:
            return MerchantReply(False, None, "The merchant account has no signing key", 0), False
        try:
            return (
                merchant.post_callback(
                    job.url, job.body, merchant_account_id=job.account_id, signing_key=job.signing_key
                ),
                False,
            )
        except Exception as exc:  # never leave a claimed delivery without its attempt
            _log.exception("callback delivery %s failed unexpectedly", job.delivery_id)
            return MerchantReply(False, None, f"Delivery failed ({type(exc).__name__})", 0), False
    try:
        reply = merchant.call_v1_outcome(
            job.target, job.checkout_token, V1OutcomeStatus.FAIL, V1FailReason.ABANDONED
        )
    except Exception as exc:
        _log.exception("v1 ABANDONED notice %s failed unexpectedly", job.delivery_id)
        return MerchantReply(False, None, f"Delivery failed ({type(exc).__name__})", 0), False
    if reply.http_status == 200 and not reply.ok:
        # Acknowledged: no consumer waits for a return_url after an expiry, so the answer body is moot.
        reply = MerchantReply(True, 200, "OK", reply.duration_ms)
    return reply, False


def _record(job: _Job, reply: MerchantReply, injected: bool) -> int | None:
    """Store the attempt and its consequences (next attempt, dead letter, PAID, e-mail); its id."""
    try:
        checkout = checkouts.lock(None, job.checkout_token)
    except ApiProblem:
        db.session.rollback()
        return None
    delivery = db.session.get(Delivery, job.delivery_id, with_for_update=True, populate_existing=True)
    account = db.session.get(Account, job.account_id)
    if delivery is None or account is None:
        db.session.rollback()
        return None
    now = clock.now()
    config = settings()
    attempt = DeliveryAttempt(
        number=job.number,
        at=job.at,
        url=job.url,
        request_body=job.body.decode("utf-8"),
        http_status=reply.http_status,
        message=reply.message[:255],
        ok=reply.ok,
        duration_ms=reply.duration_ms,
    )
    delivery.attempt_log.append(attempt)
    delivery.attempts = job.number
    delivery.last_status_message = attempt.message
    delivery.claimed_until = None
    label = _label(job.kind)
    of = f"attempt {job.number} of {config.max_callback_attempts}"
    next_at: datetime | None = None
    if reply.ok:
        delivery.state = DeliveryState.DELIVERED.value
        checkouts.record_event(checkout, f"{label}-delivered", f"{of}: HTTP 200 from {job.url}")
    else:
        cause = f"{attempt.message} (injected fault)" if injected else attempt.message
        if job.number < config.max_callback_attempts:
            next_at = now + timedelta(seconds=config.callback_retry_delays[job.number - 1])
            delivery.next_attempt_at = next_at
            checkouts.record_event(
                checkout,
                f"{label}-failed",
                f"{of} to {job.url}: {cause}; next at {format_timestamp(next_at)}",
            )
        else:
            delivery.state = DeliveryState.DEAD.value
            checkouts.record_event(checkout, f"{label}-failed", f"{of} to {job.url}: {cause}")
            checkouts.record_event(checkout, f"{label}-dead-lettered", "no attempts left")
    outgoing: tuple[int, str, str, str] | None = None
    if job.kind == DeliveryKind.CALLBACK:
        checkout.last_callback_attempted_at = job.at
        checkout.last_callback_status_message = attempt.message
        if reply.ok and job.sent_status == CheckoutStatus.PAID_PENDING_CALLBACK:
            checkouts.mark_callback_delivered(checkout)
        if not reply.ok and account.callback_failures_email:
            notice = mail.FailureNotice(
                account_id=account.merchant_account_id,
                to=account.callback_failures_email,
                checkout_token=checkout.token,
                attempt=job.number,
                max_attempts=config.max_callback_attempts,
                attempted_at=job.at,
                url=job.url,
                error=attempt.message,
                next_attempt_at=next_at,
                checkout_detail=checkouts.status_payload(checkout, base_url()).to_wire(config.wire_names),
            )
            email = mail.compose_failure_email(notice, now)
            db.session.add(email)
            db.session.flush()
            outgoing = (email.id, email.to, email.subject, email.body)
    db.session.flush()
    attempt_id = attempt.id
    db.session.commit()
    if outgoing is not None and config.smtp_url:
        email_id, to, subject, body = outgoing
        result = mail.send_smtp(config.smtp_url, to=to, subject=subject, body=body, at=now)
        stored = db.session.get(Email, email_id)
        if stored is not None:
            stored.smtp_result = result
        db.session.commit()
    return attempt_id


def _label(kind: str) -> str:
    return "callback" if kind == DeliveryKind.CALLBACK else "v1-abandoned"


# --- descriptions (control API, dashboard) ------------------------------------------------------------


def _shown(url: str, kind: str) -> str:
    """A v1 notice's URL is the shop's fail URL: masked for anyone but the operator (``access``)."""
    if kind == DeliveryKind.CALLBACK:
        return url
    return visible_url(url) or ""


def describe_attempt(attempt: DeliveryAttempt) -> dict[str, Any]:
    """One attempt as ``GET /_emulator/callbacks`` shows it."""
    delivery = attempt.delivery
    return {
        "id": attempt.id,
        "deliveryId": delivery.id,
        "checkoutToken": delivery.checkout.token,
        "kind": delivery.kind,
        "number": attempt.number,
        "at": format_timestamp(attempt.at),
        "url": _shown(attempt.url, delivery.kind),
        "httpStatus": attempt.http_status,
        "message": attempt.message,
        "ok": attempt.ok,
        "durationMs": attempt.duration_ms,
        "requestBody": attempt.request_body,
    }


def describe_delivery(delivery: Delivery) -> dict[str, Any]:
    """One outbox row, with its attempts, as ``GET /_emulator/dead-letters`` shows it."""
    return {
        "id": delivery.id,
        "checkoutToken": delivery.checkout.token,
        "merchantAccountId": delivery.checkout.account_id,
        "kind": delivery.kind,
        "url": _shown(delivery.url, delivery.kind),
        "state": delivery.state,
        "attempts": delivery.attempts,
        "nextAttemptAt": (
            format_timestamp(delivery.next_attempt_at) if delivery.state == DeliveryState.PENDING else None
        ),
        "createdAt": format_timestamp(delivery.created_at),
        "lastStatusMessage": delivery.last_status_message,
        "attemptLog": [describe_attempt(attempt) for attempt in delivery.attempt_log],
    }


# --- the background worker ----------------------------------------------------------------------------


class _Worker(threading.Thread):
    def __init__(self, app: Flask, interval: float) -> None:
        super().__init__(name="gateway-emulator-delivery", daemon=True)
        self.app = app
        self.interval = interval
        self.stopping = threading.Event()

    def run(self) -> None:
        state = database_state(self.app)
        while not self.stopping.wait(self.interval):
            try:
                with self.app.app_context():
                    # Wait until this process knows its own address, so no callback carries a guessed
                    # paymentUrl (and the watcher process of `flask run --debug` never delivers).
                    # Most ticks find nothing: then no write transaction at all (SQLite: no write lock
                    # taken from the API's requests).
                    if address_known():
                        state.ensure()  # the tables and accounts before the first poll; a probe while away
                        if anything_due():
                            run_due()
            except Exception as error:
                if not is_database_outage(error):
                    self.app.logger.exception("the emulator's delivery worker failed; it runs again shortly")
                elif not state.watch.down:
                    # One line per outage (the requests share the watch); the next tick tries again, and
                    # a lease left by an attempt cut short expires (CLAIM_LEASE).
                    state.watch.failed(error)


def start_worker(app: Flask) -> None:
    """Start the background delivery thread of this server process (once per app).

    Every ``EMULATOR_WORKER_INTERVAL`` seconds (app config, default 0.5) it runs :func:`run_due` in an
    app context and logs (never raises) what goes wrong: a database outage once (the app's outage watch),
    after which it keeps polling and heals when the database answers. Several processes may each run
    one: claims are row-locked and leased.
    """
    with _worker_lock:
        existing = app.extensions.get(_WORKER_KEY)
        if isinstance(existing, _Worker) and existing.is_alive():
            return
        interval = float(app.config.get("EMULATOR_WORKER_INTERVAL", DEFAULT_WORKER_INTERVAL))
        worker = _Worker(app, interval)
        app.extensions[_WORKER_KEY] = worker
        worker.start()


def stop_worker(app: Flask, timeout: float = 15.0) -> None:
    """Stop the app's worker thread (if any) and wait for its current run to end (tests)."""
    with _worker_lock:
        worker = app.extensions.pop(_WORKER_KEY, None)
    if isinstance(worker, _Worker):
        worker.stopping.set()
        worker.join(timeout)
