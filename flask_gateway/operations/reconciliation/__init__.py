"""Reconciliation: ask the gateway about every checkout whose outcome the shop may have missed.

A floor-3 service in one job a module; it imports the floors below and the services ``polling``,
``transitions``, ``health`` and ``heartbeats``. Inside, imports run one way, from left to right:
``run`` (``reconcile()``) -> ``pool`` (the polling loops) -> ``answers`` (applying them) -> ``claiming``
(what is due, claimed) and ``report`` (the report), which import no sibling.
"""

from __future__ import annotations

# Besides __all__, the names imported from here today (``X as X``: re-exported for mypy too): the doctor's
# due query, and the bounds the concurrency tests check.
from flask_gateway.operations.reconciliation.claiming import BATCH_SIZE as BATCH_SIZE
from flask_gateway.operations.reconciliation.claiming import (
    CLAIM_LEASE_SECONDS,
    PAID_POLLED_STATUSES,
    PAID_RECHECK_SECONDS,
    POLLED_STATUSES,
)
from flask_gateway.operations.reconciliation.claiming import due as due
from flask_gateway.operations.reconciliation.pool import AHEAD_PER_THREAD as AHEAD_PER_THREAD
from flask_gateway.operations.reconciliation.report import AccountReport, ReconcileError, ReconcileReport
from flask_gateway.operations.reconciliation.run import reconcile

__all__ = [
    "CLAIM_LEASE_SECONDS",
    "PAID_POLLED_STATUSES",
    "PAID_RECHECK_SECONDS",
    "POLLED_STATUSES",
    "AccountReport",
    "ReconcileError",
    "ReconcileReport",
    "reconcile",
]
