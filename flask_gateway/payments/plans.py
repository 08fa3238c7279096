"""The gateway's payment plan for a total, as the shop shows it: "or 3 x R 133.00".

The plan comes from the v1 configuration call, one authenticated gateway call per new total: answers are
kept per process (``cachetools.TLRUCache``) for :data:`PLAN_CACHE_SECONDS`, failures for 30 seconds (so a
gateway outage does not cost every product page a timeout), and anonymous visitors may cause at most
``GATEWAY_PLAN_RATE_LIMIT`` lookups.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from cachetools import TLRUCache
from flask import has_request_context, request

from flask_gateway.core.errors import (
    GatewayError,
)
from flask_gateway.core.money import format_money
from flask_gateway.errors import CheckoutUnavailableError, NotInstalledError, UnknownAccountError
from flask_gateway.payments.accounts import choose_account
from flask_gateway.payments.availability import is_available
from flask_gateway.state import get_state, leaves_no_transaction

__all__ = [
    "PLAN_CACHE_SECONDS",
    "PaymentPlan",
    "clear_payment_plan_cache",
    "format_instalment_hint",
    "payment_plan",
]

log = logging.getLogger("flask_gateway.plans")

#: How long a payment plan answer is kept per process, and how long a failure is.
PLAN_CACHE_SECONDS: Final = 300.0
_PLAN_ERROR_CACHE_SECONDS: Final = 30.0
_PLAN_CACHE_MAX: Final = 1024
_INSTALMENTS: Final = 3


@dataclass(frozen=True)
class PaymentPlan:
    """The gateway's plan for an amount: ``instalments`` payments of ``instalment_cents``.

    The remainder (``excess_cents``) is paid with the first instalment, due at ``first_due_at``.
    """

    total_cents: int
    instalments: int
    instalment_cents: int
    excess_cents: int
    first_due_at: datetime

    @property
    def first_instalment_cents(self) -> int:
        return self.instalment_cents + self.excess_cents

    @property
    def amounts(self) -> tuple[int, ...]:
        """Every instalment in cents, first to last, as the gateway charges them: they add up to the total."""
        return (self.first_instalment_cents, *(self.instalment_cents,) * (self.instalments - 1))

    def describe(self, symbol: str = "R") -> str:
        """The hint for product and cart pages, the amounts exactly as the gateway charges them:
        ``"or 3 x R 133.00"``, or ``"or R 325.68 now, then 2 x R 325.66"`` when the first instalment carries
        the cents that do not divide evenly."""
        each = format_money(self.instalment_cents, symbol)
        if self.excess_cents == 0:
            return f"or {self.instalments} x {each}"
        first = format_money(self.first_instalment_cents, symbol)
        return f"or {first} now, then {self.instalments - 1} x {each}"


def _lifetime(_key: object, plan: PaymentPlan | None, now: float) -> float:
    return now + (PLAN_CACHE_SECONDS if plan is not None else _PLAN_ERROR_CACHE_SECONDS)


#: (v1 base URL, merchant account, total) -> the plan, or None for a failure; per process.
_plan_cache: TLRUCache[tuple[str, str, int], PaymentPlan | None] = TLRUCache(
    maxsize=_PLAN_CACHE_MAX, ttu=_lifetime, timer=time.monotonic
)
_plan_lock = threading.Lock()


def clear_payment_plan_cache() -> None:
    """Forget every cached payment plan (tests; after changing the merchant account)."""
    with _plan_lock:
        _plan_cache.clear()


@leaves_no_transaction
def payment_plan(total_cents: int, *, account: str | None = None, draft: Any = None) -> PaymentPlan | None:
    """The v1 configuration's payment plan for ``total_cents``, or None, from the account a new checkout
    would use (``account``, else the shop's resolver given ``draft``, else the default account).

    None when the option is not available for the amount (:func:`is_available`) or the gateway could not
    be asked: the hint is then left out rather than guessed. Answers are cached per process for
    :data:`PLAN_CACHE_SECONDS` per account and amount, failures for 30 seconds.
    """
    try:
        installation = choose_account(draft, account)  # the shop's resolver asked once
    except (CheckoutUnavailableError, NotInstalledError, UnknownAccountError):
        return None  # no open account for it: not offered
    if not is_available(total_cents, account=installation.merchant_account_id):
        return None
    state = get_state()
    key = (state.config.v1_base_url, installation.merchant_account_id, total_cents)
    with _plan_lock:
        if key in _plan_cache:
            return _plan_cache[key]
    plan: PaymentPlan | None = None
    client = state.v1_client(installation)
    # Never wait on the network inside a transaction (on SQLite it holds the write lock).
    state.session.commit()
    if not _plan_lookup_allowed():
        return None  # not cached: the hint comes back once the visitor's window ends
    try:
        answer = client.configuration(amount=total_cents).data.payment_plan
    except GatewayError as error:
        log.warning("payment plan for %s cents unavailable: %s", total_cents, error)
    else:
        if answer is None or answer.amount is None or answer.due_at is None:
            log.warning("the v1 configuration answered no usable payment_plan for %s cents", total_cents)
        else:
            plan = PaymentPlan(
                total_cents=total_cents,
                instalments=_INSTALMENTS,
                instalment_cents=answer.amount,
                excess_cents=answer.excess or 0,
                first_due_at=answer.due_at,
            )
    with _plan_lock:
        _plan_cache[key] = plan
    return plan


def _plan_lookup_allowed() -> bool:
    """One more authenticated gateway call for this visitor (``GATEWAY_PLAN_RATE_LIMIT`` per address)?

    Every new cart total costs a v1 configuration call: an anonymous visitor varying quantities must not
    turn the shop into a client of the gateway on his behalf."""
    limit = get_state().plan_limit
    if limit is None or not has_request_context():
        return True
    client = request.remote_addr or "unknown"
    if limit.retry_after(client) is not None:
        log.info("payment plan lookups of %s over GATEWAY_PLAN_RATE_LIMIT: hint left out", client)
        return False
    limit.hit(client)
    return True


@leaves_no_transaction
def format_instalment_hint(total_cents: int, *, account: str | None = None, draft: Any = None) -> str:
    """The gateway's plan for the cart or product page (:meth:`PaymentPlan.describe`, with
    ``GATEWAY_CURRENCY_SYMBOL``): ``"or 3 x R 133.00"``, ``"or R 325.68 now, then 2 x R 325.66"``; ``""``
    when there is no plan to show. The account is chosen as :func:`payment_plan` chooses it."""
    plan = payment_plan(total_cents, account=account, draft=draft)
    if plan is None:
        return ""
    return plan.describe(get_state().config.currency_symbol)
