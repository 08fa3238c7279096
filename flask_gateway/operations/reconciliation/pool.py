"""The polling loops: one checkout at a time in the run's thread, or a pool of polling threads.

Concurrency (``GATEWAY_RECONCILE_CONCURRENCY``, ``concurrency=``): a run keeps that many getstatus calls
in flight. A pool of threads sends them, each over a keep-alive HTTP session of its own (the extension's
session of that thread), touching no database; the run's own thread claims the next checkouts (reading
their token and status in the claim, so nothing is read before a request), hands them out through a
bounded queue, and applies the answers that came in, several per transaction, then sends their events.
The run never holds more than ``AHEAD_PER_THREAD * concurrency + BATCH_SIZE`` claimed checkouts, whatever
the number due; the report and ``progress`` are only ever touched by the run's thread. With
``concurrency=1`` (or an in-memory SQLite database) the run polls one checkout at a time in its own thread,
claiming :data:`BATCH_SIZE` at a time, each answer applied in a transaction of its own.

Several merchant accounts share the pool: the claims take every account's due checkouts, and each is asked
about with its own account's client (:class:`Keys`). An account whose key the gateway refuses (401) or
that cannot be read fails alone: its checkouts are counted as failed without a request each, the others
are asked about as usual.

Imports ``answers``, ``claiming`` and ``report`` of the package.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Final

from flask import Flask, current_app
from sqlalchemy import ColumnElement

from flask_gateway.core.client import GatewayClient
from flask_gateway.core.errors import AuthenticationError
from flask_gateway.core.wire import CheckoutStatusPayload
from flask_gateway.operations.reconciliation.answers import _Answer, _write
from flask_gateway.operations.reconciliation.claiming import BATCH_SIZE, _claim, _claim_rows, _Claimed
from flask_gateway.operations.reconciliation.report import ReconcileReport, _NotAsked, _Outcome, _record
from flask_gateway.state import get_state

log = logging.getLogger("flask_gateway.reconciliation")

#: ``progress(done, total)``: called once before the first poll and after every checkout.
Progress = Callable[[int, int], None]

#: The passes of a run: which checkouts are due, and whether they are the paid ones.
Passes = list[tuple[ColumnElement[bool], bool]]


class Keys:
    """The signing key of each merchant account of a run, and the accounts whose checkouts are no longer
    asked about: a key that cannot be read (known before the run polls), a key the gateway refused (its
    first 401 for the account). Shared by the run's polling threads; each thread makes its own clients.

    A checkout of such an account is answered :class:`_NotAsked` without a request (counted as failed, for
    its account); the other accounts' polls go on."""

    def __init__(self, keys: dict[str, str], problems: dict[str, str] | None = None) -> None:
        self._keys = keys
        self._problems = dict(problems or {})
        self._lock = threading.Lock()

    def problems(self) -> dict[str, str]:
        with self._lock:
            return dict(self._problems)

    def _problem(self, account: str) -> str | None:
        with self._lock:
            return self._problems.get(account)

    def _refused(self, account: str, error: AuthenticationError) -> None:
        with self._lock:
            if account in self._problems:
                return
            self._problems[account] = f"the gateway refused the key of account {account} ({error})"
        log.warning(
            "reconcile: the gateway refused the key of merchant account %s (%s): its other checkouts are not "
            "asked about in this run (the other accounts' are)",
            account,
            error,
        )

    def ask(self, claimed: _Claimed, clients: dict[str, GatewayClient]) -> CheckoutStatusPayload | Exception:
        """getstatus for ``claimed`` with its own account's client (made once per thread and account, from
        ``clients``); the answer, or why none came."""
        problem = self._problem(claimed.account)
        if problem is None and claimed.account not in self._keys:
            problem = f"account {claimed.account} is not among the run's accounts"
        if problem is not None:
            return _NotAsked(f"not asked: {problem}")
        try:
            client = clients.get(claimed.account)
            if client is None:
                client = clients[claimed.account] = get_state().signed_client(
                    claimed.account, self._keys[claimed.account]
                )
            return client.get_status(claimed.token).data
        except AuthenticationError as error:
            self._refused(claimed.account, error)
            return error
        except Exception as error:  # one checkout's failure never stops the run
            return error


def _run_in_turn(
    passes: Passes,
    report: ReconcileReport,
    limit: int | None,
    total: int,
    progress: Progress | None,
    keys: Keys,
) -> None:
    """One checkout at a time, in this thread: claim a batch, poll it, claim the next."""
    clients: dict[str, GatewayClient] = {}
    done = 0
    seen: set[int] = set()  # at most one poll per checkout per run, whichever pass would take it again
    for where, paid in passes:
        while limit is None or done < limit:
            batch = min(BATCH_SIZE, limit - done) if limit is not None else BATCH_SIZE
            claimed = [c for c in _claim(where, batch, paid=paid) if c.id not in seen]
            if not claimed:
                break
            for checkout in claimed:
                seen.add(checkout.id)
                _record(report, _reconcile_one(checkout, keys, clients))
                done += 1
                if progress is not None:
                    progress(done, max(total, done))


def _reconcile_one(claimed: _Claimed, keys: Keys, clients: dict[str, GatewayClient]) -> _Outcome:
    """Poll one claimed checkout and apply the answer in a transaction of its own (concurrency 1)."""
    [outcome] = _write([(claimed, keys.ask(claimed, clients))], None)[0]
    return outcome


#: Answers applied in one transaction at most (those that came in while the last one was written).
WRITE_BATCH: Final = 100
#: Claimed checkouts a run holds at most (waiting, in flight, answered and not yet applied), per thread;
#: plus :data:`BATCH_SIZE`.
AHEAD_PER_THREAD: Final = 4


def _run_concurrently(
    passes: Passes,
    report: ReconcileReport,
    limit: int | None,
    total: int,
    progress: Progress | None,
    keys: Keys,
    workers: int,
) -> None:
    """``workers`` threads send the getstatus requests; this thread claims, hands out, and applies the
    answers.

    The threads only wait on the gateway: they touch no database. This thread loops: it takes the answers
    that came in (waiting for one when it has nothing else to do), applies them in one transaction, in
    which it also claims the next checkouts when there is room for a batch of them, commits, then hands
    the claimed checkouts out and sends the answers' events. So the database is written by one thread of
    the run, in short transactions (one commit for many checkouts: on SQLite, where writers serialise and
    a commit may cost an fsync, that is what lets the run keep up with the gateway), while the threads'
    HTTP waits overlap. The run holds at most ``AHEAD_PER_THREAD * workers + BATCH_SIZE`` claimed
    checkouts at once, whatever the number due (memory bounded by the pool), every thread has its next
    checkout at hand, and a claimed checkout is polled seconds after its claim, well within
    :data:`CLAIM_LEASE_SECONDS`; a concurrent run claims the others. The report and ``progress`` are only
    touched by this thread.
    """
    app = current_app._get_current_object()  # type: ignore[attr-defined]
    capacity = AHEAD_PER_THREAD * workers + BATCH_SIZE
    tasks: queue.Queue[_Claimed | None] = queue.Queue(maxsize=capacity)
    answers: queue.SimpleQueue[_Answer] = queue.SimpleQueue()
    threads = [
        threading.Thread(
            target=_work, args=(app, keys, tasks, answers), name=f"gateway-reconcile-{n}", daemon=True
        )
        for n in range(workers)
    ]
    for thread in threads:
        thread.start()
    remaining = list(passes)
    claimed = done = 0
    # No set of the ids polled (it would grow with the run): a claimed checkout is not due again in this
    # run, in either pass, as the claim set its last_polled_at after the run started, and both passes only
    # take checkouts unpolled since before it started (the lease).

    def claim() -> list[_Claimed]:
        """The next checkouts to hand out, in the current transaction (as many as there is room for)."""
        while remaining:
            size = capacity - (claimed - done)
            if limit is not None:
                size = min(size, limit - claimed)
            where, paid = remaining[0]
            fresh = _claim_rows(where, size, paid=paid)
            if fresh:
                return fresh
            remaining.pop(0)  # this pass is done
        return []

    try:
        while True:
            can_claim = (
                bool(remaining)
                and (limit is None or claimed < limit)
                and capacity - (claimed - done) >= BATCH_SIZE
            )
            if not can_claim and claimed == done:
                break
            batch: list[_Answer] = []
            if not can_claim:
                batch.append(_next_answer(answers, threads))
            while len(batch) < WRITE_BATCH:
                try:
                    batch.append(answers.get_nowait())
                except queue.Empty:
                    break
            outcomes, fresh = _write(batch, claim if can_claim else None)
            for checkout in fresh:
                tasks.put_nowait(checkout)
            claimed += len(fresh)
            if can_claim and not fresh:
                remaining.clear()  # nothing left to claim (or the limit is reached)
            for outcome in outcomes:
                _record(report, outcome)
                done += 1
                if progress is not None:
                    progress(done, max(total, done))
    finally:
        # Normally the queue is empty here. After an error (a claim, the progress callback) the checkouts
        # not handed out yet stay claimed (due again after the lease); those in flight finish.
        while True:
            try:
                tasks.get_nowait()
            except queue.Empty:
                break
        for _ in threads:
            tasks.put(None)
        for thread in threads:
            thread.join()


def _work(
    app: Flask, keys: Keys, tasks: queue.Queue[_Claimed | None], answers: queue.SimpleQueue[_Answer]
) -> None:
    """A polling thread: ask about the checkouts handed out until told to end, each with its own account's
    client (one per account, made on first use). The clients use the extension's HTTP session of this
    thread, so a connection of its own, kept alive from one request to the next; it touches no database."""
    with app.app_context():
        clients: dict[str, GatewayClient] = {}
        while (checkout := tasks.get()) is not None:
            answer: CheckoutStatusPayload | BaseException
            try:
                answer = keys.ask(checkout, clients)
            except BaseException as error:  # an answer for every checkout: the run waits for each one
                answer = error
            answers.put((checkout, answer))


def _next_answer(answers: queue.SimpleQueue[_Answer], threads: list[threading.Thread]) -> _Answer:
    while True:
        try:
            return answers.get(timeout=1.0)
        except queue.Empty:
            if not any(thread.is_alive() for thread in threads):
                raise RuntimeError(
                    "reconcile: every polling thread stopped before the run was done"
                ) from None
