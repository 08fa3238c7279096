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
from flask_gateway.testing.records import GatewayEmulatorError, SignalRecord, token_of


class Observed(Protocol):
    """What the assertions read of a :class:`GatewayEmulator`."""

    signals: list[SignalRecord]

    def control(self, path: str, body: Mapping[str, Any] | None = None, *, method: str = "POST") -> Any: ...

    def status(self, checkout: object) -> str: ...

    def callbacks(self, checkout: object | None = None) -> list[dict[str, Any]]: ...

    def confirmations(self, checkout: object) -> list[SignalRecord]: ...


def records_of(signals: list[SignalRecord], signal: str, checkout: object) -> list[SignalRecord]:
    """The records of ``signal`` among ``signals`` for ``checkout`` (a checkout, its token, its payment URL,
    the shop's redirect to it, or the order's reference)."""
    key = _key(checkout)
    return [r for r in signals if r.signal == signal and key in (r.token, r.order_reference)]


def assert_fulfilled_once(gateway: Observed, checkout: object) -> SignalRecord:
    """:meth:`GatewayEmulator.assert_fulfilled_once`."""
    found = gateway.confirmations(checkout)
    if len(found) == 1:
        return found[0]
    what = _describe(gateway, checkout)
    if not found:
        raise AssertionError(
            f"Expected {what} to be fulfilled exactly once, but payment_confirmed was never sent for "
            f"it.\n{_diagnosis(gateway, checkout)}"
        )
    sources = ", ".join(str(record.source) for record in found)
    raise AssertionError(
        f"Expected {what} to be fulfilled exactly once, but payment_confirmed was sent {len(found)} "
        f"times (sources: {sources}).\n{_diagnosis(gateway, checkout)}"
    )


def assert_not_fulfilled(gateway: Observed, checkout: object) -> None:
    """:meth:`GatewayEmulator.assert_not_fulfilled`."""
    found = gateway.confirmations(checkout)
    if found:
        sources = ", ".join(str(record.source) for record in found)
        raise AssertionError(
            f"Expected {_describe(gateway, checkout)} not to be fulfilled, but payment_confirmed was sent "
            f"{len(found)} time(s) (sources: {sources}).\n{_diagnosis(gateway, checkout)}"
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


def _key(checkout: object) -> str:
    try:
        return token_of(checkout)
    except GatewayEmulatorError:
        if isinstance(checkout, str):
            return checkout
        raise


def _token_for(gateway: Observed, checkout: object) -> str | None:
    """The token of ``checkout``, also when it is an order reference the emulator knows."""
    key = _key(checkout)
    for record in gateway.signals:
        if key in (record.token, record.order_reference) and record.token:
            return record.token
    rows = gateway.control("checkouts", method="GET")["checkouts"]
    for row in rows:  # newest first
        if key in (row["checkoutToken"], row["merchantOrderReference"]):
            return str(row["checkoutToken"])
    return None


def _describe(gateway: Observed, checkout: object) -> str:
    key = _key(checkout)
    token = _token_for(gateway, checkout)
    if token is None:
        return f"the order or checkout {key!r}"
    if token == key:
        return f"checkout {key}"
    return f"order {key} (checkout {token})"


def _diagnosis(gateway: Observed, checkout: object) -> str:
    token = _token_for(gateway, checkout)
    if token is None:
        return (
            "The gateway has no checkout by that token or order reference: did the shop create one "
            "(start_checkout) with this emulator?"
        )
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
