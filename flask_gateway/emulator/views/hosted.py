"""The hosted payment pages: what the consumer sees at ``paymentUrl`` (v2) and ``redirect_to`` (v1).

Plain HTML with two POST forms (Pay, Cancel) protected by flask-wtf's CSRF token; no JavaScript, no
external resources. The state changes themselves live in :mod:`flask_gateway.emulator.consumer`.

Status codes:

- 200: the checkout with its buttons; by GET, the page of a paid or cancelled checkout; a v1 action that
  was recorded although the merchant's success/fail URL gave no usable answer (the consumer's request did
  succeed: a 5xx would say the payment failed and invite a retry).
- 303: after Pay or Cancel, to the merchant's page (``confirmRedirectUrl``/``cancelRedirectUrl``, or the
  v1 merchant's ``return_url``).
- 409: Pay or Cancel refused because the checkout is already paid or cancelled.
- 410: the checkout has expired (GET and POST). Expiry is permanent: the checkout can be neither paid nor
  updated again, the merchant has to create a new one, which is what 410 Gone means (409 would suggest the
  client could resolve the conflict and retry).
- 404: no checkout with this token (or a token of the other API version's path).
- 400: a POST without a valid CSRF token (nothing changes).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from flask import Blueprint, Response, make_response, redirect, render_template, request, url_for
from flask_wtf.csrf import CSRFError
from werkzeug.wrappers import Response as BaseResponse

from flask_gateway.core.local_time import add_months, format_date, format_time
from flask_gateway.core.money import format_money
from flask_gateway.core.timestamps import format_timestamp
from flask_gateway.core.wire import CheckoutStatus
from flask_gateway.emulator import checkouts, clock, consumer
from flask_gateway.emulator.api import settings
from flask_gateway.emulator.models import ApiVersion, Checkout, db
from flask_gateway.emulator.problems import ApiProblem
from flask_gateway.emulator.views.v1 import INSTALMENTS, payment_plan

__all__ = ["bp", "format_rand"]

bp = Blueprint("emulator_hosted", __name__)

#: The checkout page; ``/pay`` and ``/cancel`` below it take the consumer's POSTs.
PAGE: Final = "/api/<any(v1, v2):version>/app/checkout/<token>"
TEMPLATES: Final = "emulator/hosted"

S = CheckoutStatus
_PAID: Final = frozenset(
    s.value for s in (S.PAID, S.PAID_PENDING_CALLBACK, S.PARTIALLY_REFUNDED, S.FULLY_REFUNDED)
)
_CANCELLED: Final = frozenset(s.value for s in (S.CANCELLED_BY_CONSUMER, S.CANCELLED_BY_MERCHANT))


# --- money ------------------------------------------------------------------------------------------


def format_rand(cents: int) -> str:
    """Integer cents as Rand: ``123456`` -> ``R 1 234.56`` (thousands grouped by spaces, two decimals)."""
    return format_money(cents, "R")


bp.add_app_template_filter(format_rand, "rand")


# --- what the pages show ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Line:
    name: str
    #: The SKU (v2) or the merchant's item reference (v1).
    reference: str
    quantity: int
    unit_cents: int

    @property
    def total_cents(self) -> int:
        return self.quantity * self.unit_cents


@dataclass(frozen=True)
class Instalment:
    number: int
    amount_cents: int
    #: When it is due: the first now, the others a month apart (docs/decisions.md, "The payment page:
    #: whose name, which times").
    due_at: datetime
    #: ``due_at`` as the page shows it: the time for the first (paid now), the date for the others.
    due_text: str


@dataclass(frozen=True)
class Order:
    """A checkout as the consumer sees it, the same for v1 and v2."""

    token: str
    version: str
    status: str
    #: The shop's name as the account has it (``EMULATOR_ACCOUNTS``' ``id:apikey:Name``), else its id.
    merchant: str
    account_id: str
    reference: str
    customer_name: str
    lines: list[Line]
    total_cents: int
    expires_at: datetime
    #: Where the consumer may go back to the shop (v2 only: v1 stores no page for the consumer).
    confirm_url: str | None
    cancel_url: str | None

    @property
    def expires_iso(self) -> str:
        return format_timestamp(self.expires_at, "s")

    @property
    def expires_text(self) -> str:
        """In ``EMULATOR_TIMEZONE``, as every time on the pages: ``2026-12-01 21:12 SAST``."""
        return format_time(self.expires_at, settings().zone, seconds=False)


def _version(checkout: Checkout) -> str:
    return "v1" if checkout.api_version == ApiVersion.V1 else "v2"


def _v1_lines(details: dict[str, Any]) -> list[Line]:
    items: dict[str, dict[str, Any]] | list[dict[str, Any]] = details["order"].get("items") or {}
    if isinstance(items, dict):  # keyed "1", "2", ..., "10" (or as the client chose): in key order
        ordered = [item for _, item in sorted(items.items(), key=lambda kv: (len(kv[0]), kv[0]))]
    else:
        ordered = items
    return [
        Line(
            name=str(item["description"]),
            reference=str(item["merchant_reference"]),
            quantity=int(item["quantity"]),
            unit_cents=int(item["unit_price"]),
        )
        for item in ordered
    ]


def _v2_lines(details: dict[str, Any]) -> list[Line]:
    return [
        Line(
            name=str(item["name"]),
            reference=str(item.get("sku") or ""),
            quantity=int(item["quantity"]),
            unit_cents=int(item["priceCents"]),
        )
        for item in details.get("orderItems") or []
    ]


def _customer_name(checkout: Checkout) -> str:
    details = checkout.details
    if checkout.api_version == ApiVersion.V1:
        person = details.get("customer") or {}
        names = (person.get("first_name"), person.get("last_name"))
    else:
        person = details.get("customer") or {}
        names = (person.get("firstName"), person.get("lastName"))
    return " ".join(str(n) for n in names if n)


def _order(checkout: Checkout) -> Order:
    v1 = checkout.api_version == ApiVersion.V1
    details = checkout.details
    return Order(
        token=checkout.token,
        version=_version(checkout),
        status=checkout.status,
        merchant=settings().account_name(checkout.account_id),
        account_id=checkout.account_id,
        reference=checkout.merchant_order_reference,
        customer_name=_customer_name(checkout),
        lines=_v1_lines(details) if v1 else _v2_lines(details),
        total_cents=checkout.total_cents,
        expires_at=checkout.expires_at,
        confirm_url=None if v1 else details.get("confirmRedirectUrl"),
        cancel_url=None if v1 else details.get("cancelRedirectUrl"),
    )


def _plan(total_cents: int) -> list[Instalment]:
    """The v1 configuration's plan for this total: the first instalment also pays the remainder and is due
    now, each of the others a month after the one before."""
    plan = payment_plan(total_cents)
    amount, excess = plan.amount or 0, plan.excess or 0
    amounts = [amount + excess] + [amount] * (INSTALMENTS - 1)
    now, zone = plan.due_at or clock.now(), settings().zone
    instalments = []
    for number, cents in enumerate(amounts, start=1):
        due = add_months(now, number - 1)
        text = format_time(due, zone, seconds=False) if number == 1 else format_date(due, zone)
        instalments.append(Instalment(number, cents, due, text))
    return instalments


def _minutes_left(expires_at: datetime) -> int:
    return max(0, int((expires_at - clock.now()).total_seconds() // 60))


# --- loading and rendering ------------------------------------------------------------------------------


def _load(version: str, token: str) -> Checkout | None:
    """The checkout behind this page, its expiry brought up to date; None when there is none."""
    try:
        checkout = checkouts.find(None, token)
    except ApiProblem:
        return None
    if _version(checkout) != version:
        return None
    if checkouts.needs_expiry(checkout):
        checkout = checkouts.lock(None, token)
        db.session.commit()
    return checkout


def _page(template: str, status: int, **context: Any) -> Response:
    return make_response(render_template(f"{TEMPLATES}/{template}", **context), status)


def _not_found() -> Response:
    return _page("not_found.html", 404)


def _show(checkout: Checkout, *, refused: bool = False) -> Response:
    """The page for the checkout's current status; ``refused``: a Pay/Cancel that its status forbids."""
    order = _order(checkout)
    conflict = 409 if refused else 200
    if checkout.status == S.PENDING_ORDER:
        return _page(
            "checkout.html",
            200,
            order=order,
            instalments=_plan(order.total_cents),
            minutes_left=_minutes_left(order.expires_at),
        )
    if checkout.status == S.EXPIRED:
        return _page("expired.html", 410, order=order)
    if checkout.status in _PAID:
        return _page("paid.html", conflict, order=order)
    return _page(
        "cancelled.html",
        conflict,
        order=order,
        by_consumer=checkout.status == S.CANCELLED_BY_CONSUMER,
        known=checkout.status in _CANCELLED,
    )


def _act(version: str, token: str, action: Callable[[str], consumer.Outcome], what: str) -> BaseResponse:
    if _load(version, token) is None:
        return _not_found()
    try:
        outcome = action(token)
    except ApiProblem:
        # 409 (the status forbids it; the lock may have just expired it) or 404: show where it stands.
        db.session.rollback()
        checkout = _load(version, token)
        return _not_found() if checkout is None else _show(checkout, refused=True)
    if outcome.redirect_url is None:
        checkout = _load(version, token)
        if checkout is None:  # pragma: no cover - reset while the merchant was being asked
            return _not_found()
        return _page(
            "no_answer.html",
            200,
            order=_order(checkout),
            what=what,
            merchant_message=outcome.merchant_message or "no answer",
        )
    return redirect(outcome.redirect_url, 303)


# --- routes -------------------------------------------------------------------------------------------


@bp.get(PAGE)
def checkout_page(version: str, token: str) -> Response:
    checkout = _load(version, token)
    return _not_found() if checkout is None else _show(checkout)


@bp.post(f"{PAGE}/pay")
def pay(version: str, token: str) -> BaseResponse:
    return _act(version, token, consumer.pay, "payment")


@bp.post(f"{PAGE}/cancel")
def cancel(version: str, token: str) -> BaseResponse:
    return _act(version, token, consumer.cancel, "cancellation")


@bp.errorhandler(CSRFError)
def _csrf_refused(error: CSRFError) -> Response:
    """A POST without the page's CSRF token (or with a stale one): refused, nothing changed."""
    args = request.view_args or {}
    back = url_for(".checkout_page", **args) if {"version", "token"} <= args.keys() else None
    return _page("csrf.html", 400, back=back, reason=error.description)


@bp.after_request
def _private(response: Response) -> Response:
    # Pages carry a CSRF token and order details: never cached; the token in the URL stays on this site.
    response.headers.setdefault("Cache-Control", "no-store")
    response.headers.setdefault("Referrer-Policy", "same-origin")
    return response
