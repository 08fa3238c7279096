"""What the gateway sends the shop: signed status callbacks, v1 outcome calls, shoppers coming back.
Imports the ground floor, the core and ``payments``; never ``operations``, ``web`` or a view."""

# Inside, imports run one way: callbacks -> applying -> claims -> intake -> probe (the doctor's probe mark);
# v1 and returns stand alone. No view code here: web/public.py reads the request and hands its parts over.

from __future__ import annotations

from flask_gateway.inbound.applying import CallbackResult
from flask_gateway.inbound.callbacks import process_callback, replay_callback
from flask_gateway.inbound.intake import (
    EXCERPT_CHARS,
    MAX_CALLBACK_BYTES,
    check_rate_limit,
    loggable_headers,
    refuse_oversize,
)
from flask_gateway.inbound.probe import PROBE_HEADER, PROBE_WINDOW_SECONDS, doctor_probe_mark
from flask_gateway.inbound.returns import RETURN_POLL_INTERVAL, process_return
from flask_gateway.inbound.v1 import V1Reply, process_v1_outcome, shop_return_url
from flask_gateway.models import CallbackOutcome

__all__ = [
    "EXCERPT_CHARS",
    "MAX_CALLBACK_BYTES",
    "PROBE_HEADER",
    "PROBE_WINDOW_SECONDS",
    "RETURN_POLL_INTERVAL",
    "CallbackOutcome",
    "CallbackResult",
    "V1Reply",
    "check_rate_limit",
    "doctor_probe_mark",
    "loggable_headers",
    "process_callback",
    "process_return",
    "process_v1_outcome",
    "refuse_oversize",
    "replay_callback",
    "shop_return_url",
]
