"""Signals the extension sends (blinker), after the change is committed.

Connect with ``@payment_confirmed.connect_via(app)`` or ``payment_confirmed.connect(receiver)``. Every
signal sends the app as sender and ``checkout`` (a ``GatewayCheckout``) plus the keyword arguments listed.
A signal about a checkout also sends ``account``: the checkout's merchant account id
(``checkout.merchant_account_id``, which never changes; a shop with one account always gets its one id).
Write receivers with ``**extra`` so that an argument added later does not break them.

The shop-facing events (``payment_confirmed``, ``checkout_cancelled``, ``checkout_expired``,
``refund_succeeded``, ``checkout_flagged``, ``payment_after_close``) go through the outbox
(``flask_gateway.payments.outbox``): written in the same transaction as the change, delivered at least once
(again after a receiver raised), each delivery with the same ``event_id``: do the work once per ``event_id``.
"""

from __future__ import annotations

from blinker import Namespace
from flask import Flask, current_app

__all__ = [
    "callback_rejected",
    "callbacks_silent",
    "checkout_cancelled",
    "checkout_created",
    "checkout_expired",
    "checkout_flagged",
    "fulfilment_failed",
    "payment_after_close",
    "payment_confirmed",
    "refund_succeeded",
    "settings_drift_repaired",
    "settings_under_attack",
]

_signals = Namespace()

#: A checkout was created on the gateway. Sends ``checkout`` and ``account``.
checkout_created = _signals.signal("gateway-checkout-created")

#: The payment is proven (a verified callback, getstatus, or a signed v1 success URL) for the first time:
#: fulfil the order here. Sends ``checkout``, ``account`` and ``source`` (callback, return, poll, reconcile,
#: v1, admin).
payment_confirmed = _signals.signal("gateway-payment-confirmed")

#: The checkout was cancelled (by the consumer or the merchant). Sends ``checkout``, ``account``, ``status``,
#: ``source``.
checkout_cancelled = _signals.signal("gateway-checkout-cancelled")

#: The checkout expired unpaid. Sends ``checkout``, ``account`` and ``source``.
checkout_expired = _signals.signal("gateway-checkout-expired")

#: A refund succeeded. Sends ``checkout``, ``account``, ``refund`` (a ``RefundRecord``) and ``amount_cents``.
refund_succeeded = _signals.signal("gateway-refund-succeeded")

#: A callback was refused (bad signature, unknown checkout, mismatch). Sends ``checkout`` (or None),
#: ``account`` (the checkout's, or None with no checkout), ``reason`` and ``log`` (the ``CallbackLog`` row).
callback_rejected = _signals.signal("gateway-callback-rejected")

#: The gateway's callbacks went silent while payments continued: no verified callback for
#: ``GATEWAY_CALLBACK_SILENCE_MINUTES`` while ``GATEWAY_CALLBACK_SILENCE_PAYMENTS`` or more payments were
#: confirmed another way (``flask_gateway.operations.health``). Sent once per silent spell, with no
#: ``checkout``: ``account`` (the merchant account whose callbacks are silent: with several, each one's
#: callbacks are watched apart; None before installation), ``health`` (a ``CallbackHealth``: that
#: account's figures when the shop has several), ``last_callback_at`` (that account's; None: never) and
#: ``payments``.
callbacks_silent = _signals.signal("gateway-callbacks-silent")

#: A checkout was flagged for a person (amounts or accounts that do not add up, a payment after a
#: cancellation, a refund reported before the shop knew of the payment). Sends ``checkout``, ``account``,
#: ``reason`` and ``source``.
checkout_flagged = _signals.signal("gateway-checkout-flagged")

#: A payment was confirmed for a checkout the shop had already seen cancelled by the merchant or expired
#: (sent beside ``payment_confirmed``; the checkout is flagged too): the shop's policy decides, for example
#: to fulfil anyway or to refund. Sends ``checkout``, ``account``, ``before`` (the status it had) and
#: ``source``.
payment_after_close = _signals.signal("gateway-payment-after-close")

#: Every delivery of a ``payment_confirmed`` event failed (its receivers raised
#: ``GATEWAY_OUTBOX_MAX_ATTEMPTS`` times): the order was paid but could not be fulfilled. The hook for the
#: shop's policy (refund it, tell a person). Sends ``checkout``, ``account``, ``event_id`` and ``error``
#: (what the last attempt raised). Sent directly, not through the outbox; a receiver that raises is logged.
fulfilment_failed = _signals.signal("gateway-fulfilment-failed")


#: The scheduled settings check (``flask_gateway.operations.drift``) found a merchant account's callback URL,
#: e-mail or limits changed at the gateway behind the shop's back and sent the shop's own back. Sent once per
#: check that found something, with no ``checkout``: ``account`` and ``incidents`` (the
#: ``SettingsIncident`` rows: each setting's foreign value, the shop's, when found, and whether the repair
#: worked; ``outcome`` ``repair-failed``: the gateway refused it, the next check tries again).
settings_drift_repaired = _signals.signal("gateway-settings-drift-repaired")

#: A setting the shop had put back was changed again (someone fights the repair, ``flask_gateway.operations.
#: drift``): it is not repaired again until a person acknowledges the admin's banner. Sent once when found,
#: with no ``checkout``: ``account`` and ``incidents`` (the ``SettingsIncident`` rows, ``outcome``
#: ``attack``). Tell a person now: the account's callbacks (and so its orders' details) go elsewhere.
settings_under_attack = _signals.signal("gateway-settings-under-attack")


def sender() -> Flask:
    """The app object itself (not the ``current_app`` proxy): the sender of every signal, as Flask's own
    signals send it."""
    app: Flask = current_app._get_current_object()  # type: ignore[attr-defined]
    return app
