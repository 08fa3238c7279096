"""The owner login's defences, in the shop's database so every worker process shares them.

**Attempt counters** (``shop_login_counters``), one row per client address and one for the owner account:

- An attempt is *counted before the password is checked*, in one short transaction holding the rows'
  locks, and cleared after a right password. The transaction's first statement is a write to the account's
  counter (:func:`_take_the_lock`): on PostgreSQL it locks that row, on SQLite it takes the database's
  write lock, so concurrent attempts count one after the other on both. So twenty concurrent guesses cannot
  all be checked: the first :data:`FREE_ATTEMPTS` are, the rest are refused (429) before any hashing.
- **Exponential backoff per address**: from the :data:`FREE_ATTEMPTS`-th failure on, the address waits
  :data:`BASE_DELAY` seconds, doubling with every further failure, up to :data:`MAX_DELAY`.
- **Per account**: failures from addresses that never logged in spread over many addresses (a botnet)
  back off the account as well, after :data:`ACCOUNT_FREE_ATTEMPTS`; that block applies to unknown
  addresses only. An address the owner logged in from in the last :data:`GOOD_FOR` is *good*: an attacker
  can slow down his own addresses and unknown ones, never lock the owner out of a good address.
- A counter whose last attempt is :data:`FORGET_AFTER` old starts again from zero.

**Session version** (``shop_owner_state``): a login stores the current version in the session;
``is_owner`` checks it against the server. Logging out increments the
version, ending every copy of the session cookie (on every device); a new password ends them too (the
session carries ``SHOP_OWNER_CREDENTIAL_KEY``, an HMAC of the password's hash under ``SECRET_KEY``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Final

from sqlalchemy import Float, Integer, String, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Mapped, mapped_column

from example_shop.extensions import db

__all__ = [
    "ACCOUNT_FREE_ATTEMPTS",
    "BASE_DELAY",
    "FREE_ATTEMPTS",
    "LoginCounter",
    "OwnerState",
    "Verdict",
    "begin_attempt",
    "end_sessions",
    "record_success",
    "session_version",
]

OWNER_ACCOUNT: Final = "owner"
#: Failed logins an address may make before it must wait.
FREE_ATTEMPTS: Final = 5
#: Failures from unknown addresses, all together, before the account backs off for them.
ACCOUNT_FREE_ATTEMPTS: Final = 20
#: The first wait (seconds); each further failure doubles it.
BASE_DELAY: Final = 30.0
MAX_DELAY: Final = 3600.0
#: A counter whose last attempt is this old starts again.
FORGET_AFTER: Final = timedelta(hours=24)
#: An address the owner logged in from stays good this long.
GOOD_FOR: Final = timedelta(days=30)


class LoginCounter(db.Model):  # type: ignore[name-defined,misc]
    __tablename__ = "shop_login_counters"

    #: ``address:<ip>`` or ``account:owner``.
    key: Mapped[str] = mapped_column(String(100), primary_key=True)
    failures: Mapped[int] = mapped_column(Integer, default=0)
    #: Seconds since the epoch: no attempt is checked before then.
    blocked_until: Mapped[float] = mapped_column(Float, default=0.0)
    last_attempt: Mapped[float] = mapped_column(Float, default=0.0)
    #: Addresses: the owner logged in from here; good until then.
    good_until: Mapped[float] = mapped_column(Float, default=0.0)


class OwnerState(db.Model):  # type: ignore[name-defined,misc]
    __tablename__ = "shop_owner_state"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    #: Incremented by every logout: sessions that carry an older one are over.
    session_version: Mapped[int] = mapped_column(Integer, default=1)


def now() -> float:
    """The clock of the counters (tests replace it)."""
    return time.time()


def _delay(failures: int, free: int) -> float:
    return float(min(BASE_DELAY * 2 ** (failures - free), MAX_DELAY))


def _ensure(*keys: str) -> None:
    """Create the counters that do not exist yet, each committed on its own (a concurrent worker may create
    the same one: its row is as good)."""
    for key in keys:
        if db.session.get(LoginCounter, key) is not None:
            continue
        db.session.add(LoginCounter(key=key, failures=0, blocked_until=0.0, last_attempt=0.0, good_until=0.0))
        try:
            db.session.commit()
        except IntegrityError:
            db.session.rollback()
    db.session.commit()


def _take_the_lock(key: str) -> None:
    """Begin the counting transaction with a write to counter ``key`` (no change of value): every concurrent
    count then waits here, PostgreSQL on the row's lock, SQLite on the database's write lock (its reads
    could not lock anything)."""
    db.session.execute(update(LoginCounter).where(LoginCounter.key == key).values(key=LoginCounter.key))


def _locked(key: str) -> LoginCounter:
    """The counter ``key`` (created by ``_ensure``), row-locked for this transaction."""
    row: LoginCounter = db.session.scalars(
        select(LoginCounter)
        .where(LoginCounter.key == key)
        .with_for_update()
        .execution_options(populate_existing=True)
    ).one()
    return row


@dataclass(frozen=True)
class Verdict:
    """May this attempt be checked? ``wait``: seconds until it may, when not."""

    allowed: bool
    wait: float = 0.0


def begin_attempt(address: str) -> Verdict:
    """Count one login attempt from ``address`` before its password is checked (see the module)."""
    moment = now()
    account_key, address_key = f"account:{OWNER_ACCOUNT}", f"address:{address[:80]}"
    _ensure(account_key, address_key)
    # A transaction of its own, holding the counters' locks (always in this order) only while it counts.
    try:
        _take_the_lock(account_key)
        account = _locked(account_key)
        row = _locked(address_key)
        for counter in (account, row):
            if counter.last_attempt and moment - counter.last_attempt > FORGET_AFTER.total_seconds():
                counter.failures, counter.blocked_until = 0, 0.0
        good = row.good_until > moment
        if row.blocked_until > moment:
            verdict = Verdict(False, row.blocked_until - moment)
        elif not good and account.blocked_until > moment:
            verdict = Verdict(False, account.blocked_until - moment)
        else:
            row.failures += 1
            row.last_attempt = moment
            if row.failures >= FREE_ATTEMPTS:
                row.blocked_until = moment + _delay(row.failures, FREE_ATTEMPTS)
            if not good:
                account.failures += 1
                account.last_attempt = moment
                if account.failures >= ACCOUNT_FREE_ATTEMPTS:
                    account.blocked_until = moment + _delay(account.failures, ACCOUNT_FREE_ATTEMPTS)
            verdict = Verdict(True)
        db.session.commit()
    except BaseException:
        db.session.rollback()
        raise
    return verdict


def record_success(address: str) -> None:
    """A right password from ``address``: its counter is cleared and it is a good address from now on."""
    moment = now()
    key = f"address:{address[:80]}"
    _ensure(key)
    _take_the_lock(key)
    row = _locked(key)
    row.failures, row.blocked_until = 0, 0.0
    row.good_until = moment + GOOD_FOR.total_seconds()
    db.session.commit()


def _state() -> OwnerState:
    state = db.session.get(OwnerState, 1)
    if state is None:
        db.session.add(OwnerState(id=1, session_version=1))
        try:
            db.session.commit()
        except IntegrityError:
            db.session.rollback()
        state = db.session.get_one(OwnerState, 1)
    return state


def session_version() -> int:
    return int(_state().session_version)


def end_sessions() -> None:
    """Every owner session issued so far is over (logout: every copy of the cookie, on every device)."""
    _state()  # the row exists from here on
    # One statement: atomic on every backend, however many logouts run at once.
    db.session.execute(
        update(OwnerState).where(OwnerState.id == 1).values(session_version=OwnerState.session_version + 1)
    )
    db.session.commit()
