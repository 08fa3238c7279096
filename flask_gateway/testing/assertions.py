"""The assertions on what the shop did ("fulfilled exactly once", "not fulfilled") and the diagnosis their
failures carry: the checkout at the gateway, its callback attempts, its other signals, a callback waiting.

:class:`GatewayEmulator`'s methods of the same names call these; they read it through :class:`Observed`
(its signal record and its control API). Imports :mod:`records` of this package and the core only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Protocol

from flask_gateway.core.timestamps import parse_timestamp
from flask_gateway.testing.records import CheckoutRef, SignalRecord, token_of


class Observed(Protocol):
    """What the assertions read of a :class:`GatewayEmulator`."""

    signals: list[SignalRecord]

    def control(self, path: str, body: Mapping[str, Any] | None = None, *, method: str = "POST") -> Any: ...

    def status(self, checkout: object) -> str: ...

    def callbacks(self, checkout: object | None = None) -> list[dict[str, Any]]: ...

    def find(self, checkout: object) -> CheckoutRef | None: ...


#: The second line of a failure about a checkout the gateway does not have.
NO_CHECKOUT = (
    "The gateway has no checkout by that token or order reference: did the shop create one "
    "(start_checkout) with this emulator?"
)


def records_of(signals: list[SignalRecord], signal: str, checkout: CheckoutRef) -> list[SignalRecord]:
    """The records of ``signal`` among ``signals`` for ``checkout`` (given by its order reference: for every
    checkout of that order)."""
    return [r for r in signals if r.signal == signal and checkout.matches(r)]


def assert_fulfilled_once(gateway: Observed, checkout: object) -> SignalRecord:
    """:meth:`GatewayEmulator.assert_fulfilled_once`."""
    ref = gateway.find(checkout)
    if ref is None:
        raise AssertionError(
            f"Expected {_unknown(checkout)} to be fulfilled exactly once, but payment_confirmed was never "
            f"sent for it.\n{NO_CHECKOUT}"
        )
    found = records_of(gateway.signals, "payment_confirmed", ref)
    if len(found) == 1:
        return found[0]
    what = _describe(ref)
    if not found:
        raise AssertionError(
            f"Expected {what} to be fulfilled exactly once, but payment_confirmed was never sent for "
            f"it.\n{_diagnosis(gateway, ref)}"
        )
    sources = ", ".join(str(record.source) for record in found)
    raise AssertionError(
        f"Expected {what} to be fulfilled exactly once, but payment_confirmed was sent {len(found)} "
        f"times (sources: {sources}).\n{_diagnosis(gateway, ref)}"
    )


def assert_not_fulfilled(gateway: Observed, checkout: object) -> None:
    """:meth:`GatewayEmulator.assert_not_fulfilled`."""
    ref = gateway.find(checkout)
    if ref is None:
        # A misspelt reference would otherwise pass: nothing was sent for a checkout that does not exist.
        raise AssertionError(
            f"Cannot tell whether {_unknown(checkout)} was fulfilled: it names no checkout.\n{NO_CHECKOUT}"
        )
    found = records_of(gateway.signals, "payment_confirmed", ref)
    if found:
        sources = ", ".join(str(record.source) for record in found)
        raise AssertionError(
            f"Expected {_describe(ref)} not to be fulfilled, but payment_confirmed was sent "
            f"{len(found)} time(s) (sources: {sources}).\n{_diagnosis(gateway, ref)}"
        )


def callback_attempts(gateway: Observed, token: str) -> str:
    """The checkout's callback attempts in one line (``#1 HTTP 500 (not acknowledged); #2 OK``), or
    ``none``."""
    attempts = gateway.callbacks(token)
    if not attempts:
        return "none"
    return "; ".join(
        f"#{a['number']} {a['message']}" + ("" if a["ok"] else " (not acknowledged)") for a in attempts
    )


def _unknown(checkout: object) -> str:
    given = checkout if isinstance(checkout, str) else token_of(checkout)
    return f"the order or checkout {given!r}"


def _describe(ref: CheckoutRef) -> str:
    if ref.by_reference:
        return f"order {ref.given} (checkout {ref.token})"
    return f"checkout {ref.token}"


def _diagnosis(gateway: Observed, ref: CheckoutRef) -> str:
    token = ref.token
    status, attempts = gateway.status(token), callback_attempts(gateway, token)
    lines = [f"At the gateway it is {status}; callback attempts: {attempts}."]
    others = [r for r in gateway.signals if r.token == token and r.signal != "payment_confirmed"]
    if others:
        lines.append(
            "Other signals for it: "
            + "; ".join(
                f"{r.signal}" + (f" ({r.reason or r.source})" if r.reason or r.source else "") for r in others
            )
            + "."
        )
    now = parse_timestamp(gateway.control("clock", method="GET")["now"])
    for waiting in gateway.control("deliveries?state=pending", method="GET")["deliveries"]:
        if waiting["checkoutToken"] != token or waiting["kind"] != "callback":
            continue
        due = (parse_timestamp(waiting["nextAttemptAt"]) - now).total_seconds()
        lines.append(
            "A callback for it waits in the gateway's outbox, "
            + (
                f"due in {due:.1f} s of the gateway's clock: advance_clock({math.ceil(due)}) sends it."
                if due > 0
                else "due now: deliver() sends it."
            )
        )
    return "\n".join(lines)
