"""The gateway-facing endpoints: the signed status callback, the v1 success/fail URLs, the return pages.

Registered at ``GATEWAY_URL_PREFIX`` (default ``/gateway``) and exempt from CSRF: each request is proven
by a signature (HMAC of the callback body, or the itsdangerous-signed ``ref`` of a URL we handed out).
The logic lives in :mod:`flask_gateway.inbound`; these views only read the request and shape the answer.

===========================  ===========================================================================
``POST /callback[/<account>]``  200 ``{"status": "ok", "outcome": ...}``; 400/401/404/413 ``{"message": ...}``
``GET /v1/success``          200 ``{"token", "return_url"}``; 400/403/404 ``{"message": ...}``
``GET /v1/fail``             200 ``{"token", "return_url", "cancel_on_payjustnow"}``; 400/403/404 JSON
``GET /return/<kind>``       303 to ``GATEWAY_ORDER_ENDPOINT`` (or 200, the built-in ``gateway/return.html``);
                             400 page for a forged link; 404 for another ``kind``
``GET /livez``               200 ``{"status": "ok"}``: the process answers (no database, no check at all)
``GET /readyz``              200 ``{"status": "ready", "checks": {...}}``; 503 ``{"status": "unavailable",
                             "checks", "failing", "message"}`` with ``Retry-After`` (:mod:`..readiness`)
===========================  ===========================================================================

While the database is away, every endpoint but the probes answers 503 with ``Retry-After``: JSON
``{"message": ...}`` for the gateway's (it retries), the ``gateway/unavailable.html`` page for the return
pages (``views.answer_outages``). The probes are not behind the admin guard: they say nothing secret.
"""

from __future__ import annotations

from typing import Any, Literal

from flask import (
    Blueprint,
    Response,
    abort,
    current_app,
    jsonify,
    make_response,
    redirect,
    render_template,
    request,
    url_for,
)
from werkzeug.exceptions import RequestEntityTooLarge
from werkzeug.wrappers import Response as BaseResponse

from flask_gateway.core.outages import RETRY_AFTER_SECONDS
from flask_gateway.core.wire import CheckoutStatus
from flask_gateway.inbound import (
    MAX_CALLBACK_BYTES,
    check_rate_limit,
    process_callback,
    process_return,
    process_v1_outcome,
    refuse_oversize,
)
from flask_gateway.models import GatewayCheckout, LocalStatus
from flask_gateway.operations.readiness import readiness
from flask_gateway.state import get_state
from flask_gateway.web.pages import answer_outages, deny_framing

__all__ = ["bp"]

bp = Blueprint("gateway", __name__, template_folder="templates")

S = CheckoutStatus

#: The endpoints a person's browser opens (an outage shows a page); the others are called by the gateway
#: and answer JSON (a 503 the gateway retries).
_PAGES = frozenset({"gateway.return_page"})
answer_outages(bp, pages=lambda: request.endpoint in _PAGES)


@bp.after_request
def _private(response: Response) -> Response:
    # Signed references and order states: never cached, never leaked through a Referer header; the
    # return page (and every error page here) is never framed.
    response.headers.setdefault("Cache-Control", "no-store")
    response.headers.setdefault("Referrer-Policy", "no-referrer")
    return deny_framing(response)


def _json(body: dict[str, Any], status: int = 200) -> Response:
    response = jsonify(body)
    response.status_code = status
    return response


def _read_callback_body(client: str | None) -> bytes:
    """The raw body, read once: 413 for one over ``MAX_CALLBACK_BYTES``, also when it comes chunked (no
    ``Content-Length``: werkzeug would cut it at the limit silently, and the cut body answer 401)."""
    length = request.content_length
    if length is not None and length > MAX_CALLBACK_BYTES:
        refuse_oversize(request.headers, length, client)
    request.max_content_length = MAX_CALLBACK_BYTES + 1  # one byte more tells an oversize chunked body
    chunks: list[bytes] = []
    size = 0
    try:
        while size <= MAX_CALLBACK_BYTES:
            chunk = request.stream.read(MAX_CALLBACK_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except RequestEntityTooLarge:
        size = MAX_CALLBACK_BYTES + 1
    if size > MAX_CALLBACK_BYTES:
        refuse_oversize(request.headers, length, client)
    return b"".join(chunks)


@bp.post("/callback")
@bp.post("/callback/<path:account>")
def callback(account: str | None = None) -> Response:
    """The gateway's signed status callback (``checkoutStatusCallbackUrl``); ``/callback/<account>`` is an
    account's own callback path (several merchant accounts), which takes that account's callbacks only."""
    client = request.remote_addr
    check_rate_limit(client)
    # Read once, uncached: the signature is checked over exactly these bytes.
    body = _read_callback_body(client)
    result = process_callback(request.headers, body, client, account=account)
    return _json({"status": "ok", "outcome": result.outcome.value})


@bp.get("/v1/success")
def v1_success() -> Response:
    """The v1 ``success_callback_url``: the gateway reports a payment."""
    return _json(process_v1_outcome("v1-success", request.args).to_json(get_state().config.wire_names))


@bp.get("/v1/fail")
def v1_fail() -> Response:
    """The v1 ``fail_callback_url``: the consumer cancelled (CANCELLED) or the order expired (ABANDONED)."""
    return _json(process_v1_outcome("v1-fail", request.args).to_json(get_state().config.wire_names))


@bp.get("/return/<kind>")
def return_page(kind: str) -> BaseResponse:
    """Where the gateway sends the shopper back (v2 confirm/cancel redirect URLs; v1 ``return_url``)."""
    if kind not in ("confirm", "cancel"):
        abort(404)
    which: Literal["confirm", "cancel"] = "confirm" if kind == "confirm" else "cancel"
    checkout = process_return(which, request.args.get("ref", ""))
    endpoint = get_state().config.order_endpoint
    if endpoint:
        return redirect(url_for(endpoint, reference=checkout.order_reference), 303)
    return make_response(
        render_template(
            "gateway/return.html",
            checkout=checkout,
            kind=which,
            state=shopper_state(checkout),
            amount=get_state().money(checkout.total_cents),
        )
    )


@bp.get("/livez")
def livez() -> Response:
    """Liveness: the process answers requests. Touches nothing (a database outage is not a reason to kill
    the process: readiness takes it out of the load balancer instead)."""
    return _json({"status": "ok"})


@bp.get("/readyz")
def readyz() -> Response:
    """Readiness: the database answers, the extension's schema is current, the gateway is installed."""
    answer = readiness(current_app._get_current_object(), get_state())  # type: ignore[attr-defined]
    if answer.ready:
        return _json(answer.to_json())
    response = _json(answer.to_json(), 503)
    response.headers["Retry-After"] = str(RETRY_AFTER_SECONDS)
    return response


def shopper_state(checkout: GatewayCheckout) -> str:
    """What the shopper is told: paid, review, cancelled, expired, failed or processing."""
    if checkout.flagged:
        return "review"
    if checkout.payment_confirmed_at is not None:
        return "paid"
    if checkout.status in (S.CANCELLED_BY_CONSUMER, S.CANCELLED_BY_MERCHANT):
        return "cancelled"
    if checkout.status == S.EXPIRED:
        return "expired"
    if checkout.status == LocalStatus.FAILED:
        return "failed"
    return "processing"
