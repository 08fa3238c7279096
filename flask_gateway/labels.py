"""The words people read for the gateway's codes: checkout statuses, callback outcomes, event sources.

One place for every screen that shows a status to a person (the extension's admin screens, and a shop's
own pages: ``from flask_gateway.labels import status_label``). The gateway's code is never lost: each
label carries it, and the admin screens show it in a tooltip and on the detail lines.

Keyed by the status *string*, so a status this version does not know (a new one from the gateway) is
shown as its own code, never a crash.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

from flask_gateway.core.money import format_money
from flask_gateway.models import CallbackOutcome, LocalStatus, RefundState

__all__ = [
    "CALLBACK_OUTCOME_LABELS",
    "STATUS_LABELS",
    "Label",
    "Tone",
    "api_label",
    "callback_outcome_label",
    "describe_detail",
    "refund_state_label",
    "source_label",
    "status_label",
]

#: How a status reads at a glance (the admin screens colour their badges by it):
#: ``ok`` money is in, ``open`` waiting for the shopper, ``closed`` ended unpaid, ``refund`` money went
#: back, ``problem`` needs a person, ``unknown`` a code this version does not know.
Tone = Literal["ok", "open", "closed", "refund", "problem", "unknown"]


@dataclass(frozen=True)
class Label:
    """A code as a person reads it: a short ``text``, a sentence ``description``, and the ``code`` itself."""

    code: str
    text: str
    description: str
    tone: Tone

    def __str__(self) -> str:
        return self.text


def _labels(*rows: tuple[str, str, str, Tone]) -> Mapping[str, Label]:
    return {code: Label(code, text, description, tone) for code, text, description, tone in rows}


#: Every checkout status the shop can record: the gateway's (including ``PENDING_PAYMENT``, which the real
#: gateway reports while the shopper is paying) and the extension's own (``LocalStatus``).
STATUS_LABELS: Final = _labels(
    (
        LocalStatus.CREATING.value,
        "Being created",
        "Saved by the shop; the gateway has not confirmed creating the checkout yet.",
        "open",
    ),
    (
        LocalStatus.FAILED.value,
        "Not created",
        "The gateway refused to create the checkout: nothing exists there, and nothing was paid.",
        "problem",
    ),
    ("PENDING_ORDER", "Awaiting payment", "Created; the shopper has not paid yet.", "open"),
    (
        "PENDING_PAYMENT",
        "Payment in progress",
        "The shopper is paying on the gateway's page; the payment is not complete yet.",
        "open",
    ),
    (
        "CANCELLED_BY_CONSUMER",
        "Cancelled by the shopper",
        "The shopper cancelled on the gateway's page. Nothing was paid; an update can reopen it.",
        "closed",
    ),
    (
        "CANCELLED_BY_MERCHANT",
        "Cancelled by the shop",
        "The shop cancelled the checkout. Nothing was paid.",
        "closed",
    ),
    ("PAID", "Paid", "The shopper paid, and the gateway knows the shop has recorded it.", "ok"),
    (
        "PAID_PENDING_CALLBACK",
        "Paid - confirming",
        "The shopper paid; the gateway says Paid once the shop has acknowledged its callback.",
        "ok",
    ),
    ("PARTIALLY_REFUNDED", "Partly refunded", "Paid; part of the amount was refunded.", "refund"),
    ("FULLY_REFUNDED", "Refunded", "Paid, then refunded in full.", "refund"),
    ("EXPIRED", "Expired", "The shopper did not pay in time. Nothing was paid.", "closed"),
)

#: ``CallbackLog.outcome`` values, worded for the owner reading the callback log.
CALLBACK_OUTCOME_LABELS: Final = _labels(
    (
        CallbackOutcome.RECEIVED.value,
        "Received, not processed",
        "Stored, but processing did not finish; the gateway sends it again.",
        "problem",
    ),
    (CallbackOutcome.ACCEPTED.value, "Recorded", "Verified and recorded.", "ok"),
    (
        CallbackOutcome.DUPLICATE.value,
        "Already recorded",
        "The shop knew this already (the gateway repeated it); acknowledged, nothing changed.",
        "ok",
    ),
    (
        CallbackOutcome.IGNORED.value,
        "Noted, no change",
        "Verified, but not a change the shop makes from a callback (or an older status).",
        "ok",
    ),
    (
        CallbackOutcome.MISMATCH.value,
        "Flagged for review",
        "Signed by the gateway, but its amount or account does not match the checkout: a person should look.",
        "problem",
    ),
    (
        CallbackOutcome.UNCONFIRMED.value,
        "Not confirmed by the gateway",
        "Signed, but the gateway's own status says otherwise: nothing of the claim was applied, what the "
        "gateway says was recorded instead.",
        "problem",
    ),
    (
        CallbackOutcome.CONFIRM_FAILED.value,
        "Waiting: gateway not reachable",
        "Signed, but the gateway could not be asked to confirm it; it was answered 503 so the gateway sends "
        "it again.",
        "problem",
    ),
    (
        CallbackOutcome.REJECTED_SIGNATURE.value,
        "Refused: not signed by the gateway",
        "The signature or the account was wrong or missing; nothing in it was trusted.",
        "problem",
    ),
    (
        CallbackOutcome.UNKNOWN_CHECKOUT.value,
        "Refused: unknown checkout",
        "Signed, but about a checkout this shop does not have.",
        "problem",
    ),
    (
        CallbackOutcome.INVALID_BODY.value,
        "Refused: not a status",
        "Signed, but the body is not a checkout status.",
        "problem",
    ),
    (
        CallbackOutcome.TOO_LARGE.value,
        "Refused: too large",
        "The body was over the size limit and was not read.",
        "problem",
    ),
    (
        CallbackOutcome.ERROR.value,
        "Failed in the shop",
        "An error in the shop while processing it (see the server log); the gateway sends it again.",
        "problem",
    ),
    (
        CallbackOutcome.DOCTOR_PROBE.value,
        "Checked by flask gateway doctor",
        "The doctor's own unsigned test request, answered as any unsigned request is: not a refusal.",
        "ok",
    ),
)

_SOURCE_LABELS: Final[Mapping[str, str]] = {
    "create": "Checkout created",
    "update": "Checkout updated",
    "cancel": "Cancelled by the shop",
    "refund": "Refund",
    "callback": "Gateway callback",
    "return": "Shopper came back",
    "v1": "Classic checkout's outcome",
    "poll": "Status check",
    "reconcile": "Reconciliation",
    "admin": "Admin screens",
}

_REFUND_STATE_LABELS: Final = _labels(
    (RefundState.PENDING.value, "Pending", "Sent; the gateway's answer is not known yet.", "open"),
    (RefundState.SUCCEEDED.value, "Refunded", "The gateway refunded the amount.", "refund"),
    (RefundState.FAILED.value, "Refused", "The gateway refused the refund; nothing was refunded.", "problem"),
)


def _unknown(code: str, what: str) -> Label:
    return Label(code, code or "(none)", f"A {what} this version of Flask-Gateway does not know.", "unknown")


def status_label(status: str | None) -> Label:
    """The label of a checkout status; an unknown status string is shown as its own code."""
    code = str(status or "")
    return STATUS_LABELS.get(code) or _unknown(code, "status")


def callback_outcome_label(outcome: str | None) -> Label:
    """The label of a ``CallbackLog.outcome``; an unknown value is shown as it is."""
    code = str(outcome or "")
    return CALLBACK_OUTCOME_LABELS.get(code) or _unknown(code, "callback outcome")


def refund_state_label(state: str | None) -> Label:
    """The label of a refund's state; an unknown state string is shown as its own code."""
    code = str(state or "")
    return _REFUND_STATE_LABELS.get(code) or _unknown(code, "refund state")


def source_label(source: str | None) -> str:
    """Where a timeline event came from (``CheckoutEvent.source``), in words."""
    code = str(source or "")
    return _SOURCE_LABELS.get(code, code)


_API_LABELS: Final[Mapping[str, str]] = {"v2": "Standard checkout", "v1": "Classic checkout"}


def api_label(version: str | None) -> str:
    """The gateway API a checkout was made with, in words: ``v2`` the standard checkout (callbacks), ``v1``
    the classic one (its outcome comes back with the shopper); an unknown version as it is."""
    code = str(version or "")
    return _API_LABELS.get(code, code)


#: Words of the stored details that are the gateway's or the code's, not the owner's.
_PHRASES: Final[Mapping[str, str]] = {
    "getstatus": "status check",
    "expiresAt": "its expiry time",
    "REFUSED": "Refused",
    "NOT CONFIRMED": "not confirmed",
    "NOT verified": "not verified",
    "v1 success URL": "classic checkout's success address",
    "v1 fail URL": "classic checkout's failure address",
    "v2 checkout": "standard checkout",
    "v1 checkout": "classic checkout",
    "ABANDONED": "left without paying",
    "CANCELLED": "cancelled",
    "->": "→",
}
_CODES: Final = {
    **{code: label.text for code, label in _REFUND_STATE_LABELS.items()},
    **{code: label.text for code, label in STATUS_LABELS.items()},
    **_PHRASES,
}
_WORD: Final = re.compile(
    "|".join(
        rf"(?<![\w-]){re.escape(code)}(?![\w-])" if code[0].isalnum() else re.escape(code)
        for code in sorted(_CODES, key=len, reverse=True)
    )
)
_CENTS: Final = re.compile(r"(?<![\w.,])(-?\d+) cents\b|(?<=the checkout's )(-?\d+)\b")
_SOURCE: Final = re.compile(
    r"\((" + "|".join(map(re.escape, [*_SOURCE_LABELS, "v2"])) + r")\)|(?<=seen by )(\w+)"
)
_REPEATED: Final = re.compile(r"([\w -]+?) \(([^()]+)\)")


def describe_detail(text: str | None, symbol: str = "R") -> str:
    """A stored detail line (``CheckoutEvent.detail``, a callback's detail, a flag's reason) as a person
    reads it: every status code as its label, every amount in cents as money, every event source and API
    version in words. ``getstatus: PAID_PENDING_CALLBACK`` -> ``status check: Paid - confirming``;
    ``refund #1: 10050 cents`` -> ``refund #1: R 100.50``; ``payment confirmed (return)`` -> ``payment
    confirmed (Shopper came back)``. What is stored stays as it is (show it in a tooltip); a text this
    version does not know keeps its unknown parts."""
    if not text:
        return ""

    def money(match: re.Match[str]) -> str:
        return format_money(int(match.group(1) or match.group(2)), symbol)

    def source(match: re.Match[str]) -> str:
        code = match.group(1) or match.group(2)
        if code in _API_LABELS:
            words = api_label(code)
        elif code in _SOURCE_LABELS:
            words = source_label(code)
        else:
            return match.group(0)
        words = words[:1].lower() + words[1:]
        return f"({words})" if match.group(1) else words

    shown = _CENTS.sub(money, text)
    shown = _SOURCE.sub(source, shown)
    shown = _WORD.sub(lambda match: _CODES[match.group(0)], shown)

    def once(match: re.Match[str]) -> str:
        # "the gateway says cancelled by the shopper (Cancelled by the shopper)": said once is enough.
        before, inside = match.group(1), match.group(2)
        return before if before.lower().endswith(inside.lower()) else match.group(0)

    return _REPEATED.sub(once, shown)
