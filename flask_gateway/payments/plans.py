"""The gateway's payment plan for a total, as the shop shows it: "or 3 x R 133.00".

A hint costs no gateway call per visitor: the plan for any total is computed locally from the account's
plan rule, learned from ONE authenticated v1 configuration answer (its instalment count: ``amount`` =
total // count each, ``excess``, the cents that do not divide evenly, paid with the first; ``due_at`` as
the gateway stated it) and re-checked with one more answer once per :data:`PLAN_CACHE_SECONDS` per
account and process. Any number of distinct totals therefore cost at most one call per period per account.
When a re-check finds an answer the rule does not give, the gateway is trusted: a warning is logged, its
answer shown, and each total asked (answers cached for the period) until an answer gives one rule again.
A failed call is not retried for 30 seconds (a gateway outage does not cost every product page a timeout;
a rule already learned goes on meanwhile), and ``GATEWAY_PLAN_RATE_LIMIT`` limits the calls a visitor
address may cause (learning, re-checking, or asking per total while no rule holds).
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


@dataclass
class _Rule:
    """What the gateway's configuration answers say of every total, per account: ``instalments`` payments of
    ``total // instalments``, the first carrying the cents that do not divide evenly, the first due at
    ``first_due_at`` (the learned answer's ``due_at``, as the gateway stated it).

    ``holds`` False: a re-check found an answer the rule does not give; each total is then asked until an
    answer gives ``instalments`` (None: not derivable yet) again."""

    instalments: int | None
    first_due_at: datetime
    #: When the gateway last confirmed it (``_clock``).
    checked_at: float
    holds: bool = True
    #: A request is asking the gateway to re-check it: the others go on with it meanwhile.
    checking: bool = False

    def plan(self, total_cents: int) -> PaymentPlan:
        count = self.instalments or _INSTALMENTS
        each = total_cents // count
        return PaymentPlan(total_cents, count, each, total_cents - count * each, self.first_due_at)


def _instalments_of(plan: PaymentPlan) -> int | None:
    """The instalment count that gives ``plan`` by the rule (``total // n`` each, the rest with the first), or
    None when no count does (an amount of 0, or a rounding of another kind: then each total is asked)."""
    amount, excess = plan.instalment_cents, plan.excess_cents
    if amount <= 0 or excess < 0 or (plan.total_cents - excess) % amount:
        return None
    count = (plan.total_cents - excess) // amount
    return count if count >= 1 and excess < count else None


def _clock() -> float:
    return time.monotonic()


_Key = tuple[str, str]  # (v1 base URL, merchant account)

#: Per process: the rule of each account, the gateway's answers per total while no rule holds (for
#: PLAN_CACHE_SECONDS), and until when an account's configuration call is not retried after a failure.
_rules: dict[_Key, _Rule] = {}
_answers: TLRUCache[tuple[_Key, int], PaymentPlan] = TLRUCache(
    maxsize=_PLAN_CACHE_MAX, ttu=lambda _key, _plan, now: now + PLAN_CACHE_SECONDS, timer=lambda: _clock()
)
_failures: dict[_Key, float] = {}
_plan_lock = threading.Lock()


def clear_payment_plan_cache() -> None:
    """Forget every learned plan rule, cached answer and failure (tests; after changing the merchant
    account)."""
    with _plan_lock:
        _rules.clear()
        _answers.clear()
        _failures.clear()


@leaves_no_transaction
def payment_plan(total_cents: int, *, account: str | None = None, draft: Any = None) -> PaymentPlan | None:
    """The gateway's payment plan for ``total_cents``, or None, from the account a new checkout would use
    (``account``, else the shop's resolver given ``draft``, else the default account).

    Computed locally from the account's plan rule, learned from one v1 configuration answer and re-checked
    with one more once per :data:`PLAN_CACHE_SECONDS`; when a re-check finds an answer the rule does not
    give, the gateway's answer is shown and each total asked until the rule holds again.

    None when the option is not available for the amount (:func:`is_available`) or the gateway could not
    be asked (no call for 30 seconds after a failure): the hint is then left out rather than guessed.
    """
    try:
        installation = choose_account(draft, account)  # the shop's resolver asked once
    except (CheckoutUnavailableError, NotInstalledError, UnknownAccountError):
        return None  # no open account for it: not offered
    if not is_available(total_cents, account=installation.merchant_account_id):
        return None
    state = get_state()
    key = (state.config.v1_base_url, installation.merchant_account_id)
    now = _clock()
    with _plan_lock:
        rule = _rules.get(key)
        held = rule if rule is not None and rule.holds else None
        failing = now < _failures.get(key, 0.0)
        if held is not None and (failing or held.checking or now < held.checked_at + PLAN_CACHE_SECONDS):
            return held.plan(total_cents)  # no gateway call
        if failing:
            return None
        if (key, total_cents) in _answers:
            return _answers[(key, total_cents)]
        if held is not None:
            held.checking = True  # this request re-checks the rule
    try:
        client = state.v1_client(installation)
        # Never wait on the network inside a transaction (on SQLite it holds the write lock).
        state.session.commit()
        if not _plan_lookup_allowed():
            return held.plan(total_cents) if held is not None else None
        answer = _ask(client, total_cents)
        with _plan_lock:
            learned = _learn(key, total_cents, answer, _clock())
        if learned is None and held is not None:
            return held.plan(
                total_cents
            )  # the re-check failed: the rule last confirmed goes on, retried in 30 s
        return learned
    finally:
        if held is not None:
            with _plan_lock:
                held.checking = False


def _ask(client: Any, total_cents: int) -> PaymentPlan | None:
    """The v1 configuration's plan for ``total_cents`` as the gateway states it, or None (logged)."""
    try:
        answer = client.configuration(amount=total_cents).data.payment_plan
    except GatewayError as error:
        log.warning("payment plan for %s cents unavailable: %s", total_cents, error)
        return None
    if answer is None or answer.amount is None or answer.due_at is None:
        log.warning("the v1 configuration answered no usable payment_plan for %s cents", total_cents)
        return None
    excess = answer.excess or 0
    plan = PaymentPlan(total_cents, _INSTALMENTS, answer.amount, excess, answer.due_at)
    count = _instalments_of(plan)
    return plan if count is None else PaymentPlan(total_cents, count, answer.amount, excess, answer.due_at)


def _learn(key: _Key, total_cents: int, answer: PaymentPlan | None, now: float) -> PaymentPlan | None:
    """Record the gateway's ``answer`` for ``total_cents`` (under ``_plan_lock``) and return it: it learns,
    confirms, refutes or re-establishes the account's rule."""
    rule = _rules.get(key)
    if answer is None:
        _failures[key] = now + _PLAN_ERROR_CACHE_SECONDS
        return None
    _failures.pop(key, None)
    count = _instalments_of(answer)
    if rule is None:
        if count is None:
            _answers[(key, total_cents)] = answer
        else:
            _rules[key] = _Rule(count, answer.first_due_at, now)
            log.info("payment plan rule of %s learned: %s instalments", key[1], count)
        return answer
    if rule.holds:
        if count == rule.instalments:
            rule.checked_at, rule.first_due_at = now, answer.first_due_at  # confirmed
            return answer
        log.warning(
            "the gateway's payment plan for %s cents (%s) is not the rule learned for %s (%s): shown as the "
            "gateway states it, and each total asked until a rule holds again",
            total_cents,
            answer.amounts,
            key[1],
            rule.plan(total_cents).amounts,
        )
        rule.holds, rule.instalments = False, count
        _answers[(key, total_cents)] = answer
        return answer
    if count is not None and count == rule.instalments:
        rule.holds, rule.checked_at, rule.first_due_at = True, now, answer.first_due_at
        log.warning("the payment plan rule of %s holds again: %s instalments", key[1], count)
        return answer
    rule.instalments = count
    _answers[(key, total_cents)] = answer
    return answer


def _plan_lookup_allowed() -> bool:
    """One more authenticated gateway call for this visitor (``GATEWAY_PLAN_RATE_LIMIT`` per address)?

    Only learning or re-checking a rule (or asking per total while none holds) calls the gateway: an
    anonymous visitor must not turn the shop into a client of the gateway on his behalf."""
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
