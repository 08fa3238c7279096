"""Which checkouts are due, and claiming them for one run.

Which checkouts are due: nothing happened to them (``updated_at``) and nobody polled them
(``last_polled_at``) for ``older_than_seconds`` (default ``GATEWAY_RECONCILE_AFTER_SECONDS``), so a
shopper still on the payment page is not polled and a busy schedule polls each checkout at most once per
period. Paid checkouts (the paid pass) are due once in :data:`PAID_RECHECK_SECONDS`, within the paid window.

Two runs at once never poll the same checkout: a run *claims* a small batch before polling it, by
setting ``last_polled_at`` in a short transaction under ``SELECT ... FOR UPDATE SKIP LOCKED``
(PostgreSQL: a concurrent run skips rows being claimed and, once the claim commits, sees them as just
polled; SQLite: ``BEGIN IMMEDIATE`` serialises the claims). A claimed row is not due again for at least
:data:`CLAIM_LEASE_SECONDS` (or ``older_than_seconds`` when longer), so neither a concurrent run nor the
same run takes it twice; a run that dies after claiming leaves its rows to the next run after the lease.
No extra column is needed.

Every merchant account of the run is claimed in the same queries (``merchant_account_id IN (...)``; one
account: ``=``, as before several existed): a run polls all of them with one pool, oldest first, whatever
their account. Each claimed checkout carries its account, whose client asks about it.

Imports no other module of the package.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Final

from sqlalchemy import (
    ColumnElement,
    Executable,
    FromClause,
    String,
    and_,
    column,
    func,
    or_,
    select,
    true,
    union_all,
    update,
    values,
)

from flask_gateway.core.timestamps import utcnow
from flask_gateway.core.wire import OPEN_STATUSES
from flask_gateway.core.wire import CheckoutStatus as S
from flask_gateway.models import GatewayCheckout
from flask_gateway.state import get_state

#: The statuses a reconciliation asks the gateway about.
POLLED_STATUSES: Final = (*sorted(OPEN_STATUSES), S.PAID_PENDING_CALLBACK.value)
#: The paid statuses a reconciliation asks about within the paid window (``PAID_PENDING_CALLBACK`` is
#: among ``POLLED_STATUSES`` already); ``FULLY_REFUNDED`` is final.
PAID_POLLED_STATUSES: Final = (S.PAID.value, S.PARTIALLY_REFUNDED.value)
#: A paid checkout is asked about again only once nothing changed or polled it for this long.
PAID_RECHECK_SECONDS: Final = 3600
#: A claimed (or polled) checkout is not due again for at least this long.
CLAIM_LEASE_SECONDS: Final = 60
#: Rows claimed per short transaction: small, so a claimed row is polled soon after its claim.
BATCH_SIZE: Final = 10


def _of(accounts: str | Sequence[str]) -> ColumnElement[bool]:
    """The checkouts of ``accounts`` (one id, or several)."""
    if isinstance(accounts, str):
        return GatewayCheckout.merchant_account_id == accounts
    if len(accounts) == 1:
        return GatewayCheckout.merchant_account_id == accounts[0]
    return GatewayCheckout.merchant_account_id.in_(list(accounts))


def due(accounts: str | Sequence[str], cutoff: datetime, lease_cutoff: datetime) -> ColumnElement[bool]:
    """The open checkouts of ``accounts`` to ask about: unchanged and unpolled since ``cutoff`` (and not
    claimed)."""
    return and_(
        GatewayCheckout.api_version == "v2",
        GatewayCheckout.token.is_not(None),
        GatewayCheckout.status.in_(POLLED_STATUSES),
        _of(accounts),
        GatewayCheckout.updated_at <= cutoff,
        or_(GatewayCheckout.last_polled_at.is_(None), GatewayCheckout.last_polled_at < lease_cutoff),
    )


def _paid_due(
    accounts: str | Sequence[str], window_start: datetime, recheck_cutoff: datetime, lease_cutoff: datetime
) -> ColumnElement[bool]:
    """The paid checkouts of ``accounts`` to ask about: payment recorded since ``window_start``, unchanged
    and unpolled since ``recheck_cutoff`` (and not claimed)."""
    return and_(
        GatewayCheckout.api_version == "v2",
        GatewayCheckout.token.is_not(None),
        GatewayCheckout.status.in_(PAID_POLLED_STATUSES),
        _of(accounts),
        or_(
            GatewayCheckout.payment_confirmed_at >= window_start,
            # Refunded before the shop knew of the payment (flagged, never confirmed): the gateway's paidAt.
            and_(GatewayCheckout.payment_confirmed_at.is_(None), GatewayCheckout.paid_at >= window_start),
        ),
        # Implied by the payment's time (recording it set updated_at), and what bounds the scan of the
        # (status, updated_at) index to the window: a shop's older paid orders are never read.
        GatewayCheckout.updated_at >= window_start,
        GatewayCheckout.updated_at <= recheck_cutoff,
        or_(GatewayCheckout.last_polled_at.is_(None), GatewayCheckout.last_polled_at < lease_cutoff),
    )


def _count_by_account(where: ColumnElement[bool]) -> dict[str, int]:
    """How many checkouts ``where`` takes, per account (one query)."""
    rows = get_state().session.execute(
        select(GatewayCheckout.merchant_account_id, func.count())
        .where(where)
        .group_by(GatewayCheckout.merchant_account_id)
    )
    return {str(row[0]): int(row[1]) for row in rows}


@dataclass(frozen=True)
class _Claimed:
    """A checkout claimed for polling: what the poll needs, read in the claim (no read before the poll)."""

    id: int
    token: str
    #: Its merchant account: the one whose client (and signing key) asks about it.
    account: str
    #: The status the shop had recorded when it was claimed, so before the question was sent.
    status: str
    paid: bool


def _claim(where: ColumnElement[bool], size: int, *, paid: bool) -> list[_Claimed]:
    """Take up to ``size`` due checkouts for this run: mark them polled now, in one short transaction."""
    session = get_state().session
    try:
        rows = _claim_rows(where, size, paid=paid)
        session.commit()
    except BaseException:
        session.rollback()
        raise
    return rows


def _oldest(where: ColumnElement[bool], size: int, *, paid: bool, dialect: str) -> Executable:
    """The query of a claim: the ``size`` oldest checkouts ``where`` takes (by ``updated_at``, then id),
    row-locked, skipping those a concurrent claim holds.

    One ordered read of the ``(status, updated_at)`` index per status of the pass, each taking at most
    ``size``, merged oldest first: the same rows as one query over ``status IN (...)``, whose plan reads
    and sorts every due checkout to hand out the first few (a scan of the whole table once most of it is
    due: issue 30, a million checkouts). On PostgreSQL each status is a ``LATERAL`` subquery locking its
    candidates (``FOR UPDATE SKIP LOCKED``) before the merge, so a claim may hold up to one batch per status
    until its commit; only the ``size`` oldest are marked polled, the others stay due. On SQLite
    (``BEGIN IMMEDIATE`` serialises the claims, nothing to lock) a ``UNION ALL`` of the same subqueries.
    """
    statuses = PAID_POLLED_STATUSES if paid else POLLED_STATUSES
    columns = (
        GatewayCheckout.id,
        GatewayCheckout.token,
        GatewayCheckout.merchant_account_id,
        GatewayCheckout.status,
        GatewayCheckout.updated_at,
    )
    candidates: FromClause
    if dialect == "postgresql":
        each = values(column("status", String), name="claimed_statuses").data([(s,) for s in statuses])
        candidates = (
            select(*columns)
            .where(where, GatewayCheckout.status == each.c.status)
            .order_by(GatewayCheckout.updated_at, GatewayCheckout.id)
            .limit(size)
            .with_for_update(skip_locked=True)
            .lateral("candidates")
        )
        merged = select(candidates).select_from(each).join(candidates, true())
    else:
        arms = [
            select(*columns)
            .where(where, GatewayCheckout.status == status)
            .order_by(GatewayCheckout.updated_at, GatewayCheckout.id)
            .limit(size)
            .subquery(f"status_{n}")
            for n, status in enumerate(statuses)
        ]
        candidates = union_all(*(select(arm) for arm in arms)).subquery("candidates")
        merged = select(candidates)
    return (
        merged.with_only_columns(
            candidates.c.id, candidates.c.token, candidates.c.merchant_account_id, candidates.c.status
        )
        .order_by(candidates.c.updated_at, candidates.c.id)
        .limit(size)
    )


def _claim_rows(where: ColumnElement[bool], size: int, *, paid: bool) -> list[_Claimed]:
    """``_claim`` in the current transaction (the caller commits)."""
    session = get_state().session
    dialect = session.get_bind().dialect.name
    rows = [
        _Claimed(
            id=row.id, token=row.token or "", account=row.merchant_account_id, status=row.status, paid=paid
        )
        for row in session.execute(_oldest(where, size, paid=paid, dialect=dialect))
    ]
    ids = [row.id for row in rows]
    if ids:
        session.execute(
            update(GatewayCheckout)
            .where(GatewayCheckout.id.in_(ids))
            .values(last_polled_at=utcnow())
            .execution_options(synchronize_session=False)
        )
    return rows
