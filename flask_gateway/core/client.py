"""Clients for the gateway's v2 API (signed) and v1 API (HTTP Basic)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import TypeVar

import requests
from requests.auth import HTTPBasicAuth

from flask_gateway.core.auth import SignatureAuth
from flask_gateway.core.errors import V1RefundFailedError
from flask_gateway.core.http import ApiResponse, RetryMode, RetryPolicy, Transport
from flask_gateway.core.wire import (
    CancelCheckoutRequest,
    CheckoutResponse,
    CheckoutStatusPayload,
    CreateCheckoutRequest,
    GetStatusRequest,
    InstallRequest,
    InstallResponse,
    RefundRequest,
    RefundResponse,
    SettingsResponse,
    SettingsUpdateRequest,
    UpdateCheckoutRequest,
    V1CheckoutData,
    V1CheckoutRequest,
    V1CheckoutResponse,
    V1Configuration,
    V1ConfigurationCustomer,
    V1ConfigurationRequest,
    V1ConfigurationResponse,
    V1RefundRequest,
    V1RefundResult,
    WireModel,
    WireNames,
)
from flask_gateway.core.wire.names import OPERATOR

__all__ = ["GatewayClient", "V1Client", "new_request_id"]

RequestT = TypeVar("RequestT", bound=WireModel)
Timeout = float | tuple[float, float]


def new_request_id() -> str:
    """A fresh idempotency key."""
    return str(uuid.uuid4())


def _with_request_id(request: RequestT) -> tuple[RequestT, str]:
    """The request with its ``requestId`` fixed (generated once, before the first attempt)."""
    current = getattr(request, "requestId", None)
    if current:
        return request, current
    request_id = new_request_id()
    return request.model_copy(update={"requestId": request_id}), request_id


class _BaseClient:
    def __init__(
        self,
        *,
        timeout: Timeout,
        max_retries: int,
        session: requests.Session | None,
        sleep: Callable[[float], None],
        transport: Transport | None,
    ) -> None:
        self.transport = transport or Transport(
            timeout=timeout, retry=RetryPolicy(max_retries=max_retries), session=session, sleep=sleep
        )


class GatewayClient(_BaseClient):
    """The v2 API: installation, settings, and the checkout operations.

    ``base_url`` is ``{base_url}`` of the spec (checkouts at ``/v2/...``), ``install_url`` is
    ``{install_url}`` (installation at ``/v2``). Every checkout operation is signed with ``signing_key``,
    which :meth:`install` returns. Create and refund send a ``requestId`` (yours, or one generated once
    before the first attempt) and retry safely; see :class:`~flask_gateway.core.http.RetryMode`.
    Requests spell the operator-named fields as ``wire_names`` says (the real gateway's, by default).
    """

    def __init__(
        self,
        *,
        base_url: str,
        merchant_account_id: str,
        signing_key: str | None = None,
        install_url: str | None = None,
        timeout: Timeout = (5.0, 30.0),
        max_retries: int = 2,
        session: requests.Session | None = None,
        sleep: Callable[[float], None] = time.sleep,
        transport: Transport | None = None,
        wire_names: WireNames = OPERATOR,
    ) -> None:
        super().__init__(
            timeout=timeout, max_retries=max_retries, session=session, sleep=sleep, transport=transport
        )
        #: How requests spell the operator-named fields; answers are read in either set.
        self.wire_names = wire_names
        self.base_url = base_url.rstrip("/")
        self.install_url = (install_url or f"{self.base_url}/install").rstrip("/")
        self.merchant_account_id = merchant_account_id
        self._auth = SignatureAuth(merchant_account_id, signing_key) if signing_key else None

    def __repr__(self) -> str:
        return (
            f"GatewayClient(base_url={self.base_url!r}, merchant_account_id={self.merchant_account_id!r}, "
            f"signing_key={'****' if self._auth else None!r})"
        )

    @property
    def auth(self) -> SignatureAuth:
        if self._auth is None:
            raise RuntimeError(
                "this GatewayClient has no signing key: install the gateway first (install() returns it) "
                "and pass signing_key=..."
            )
        return self._auth

    def install(self, request: InstallRequest) -> ApiResponse[InstallResponse]:
        """Register the merchant's settings; answers the secret signing key. Succeeds once per account."""
        # Not idempotent (a second call answers 403): repeated only when the request never left.
        return self.transport.call(
            "POST",
            f"{self.install_url}/v2",
            InstallResponse,
            operation="install",
            body=request.to_json(self.wire_names),
            mode=RetryMode.UNSAFE,
        )

    def update_settings(self, request: SettingsUpdateRequest) -> ApiResponse[SettingsResponse]:
        """Change the settings (PATCH); answers them with the ``signingKey``."""
        return self.transport.call(
            "PATCH",
            f"{self.install_url}/v2",
            SettingsResponse,
            operation="update_settings",
            body=request.to_json(self.wire_names),
            auth=self.auth,
        )

    def create_checkout(self, request: CreateCheckoutRequest) -> ApiResponse[CheckoutResponse]:
        """Create a checkout; redirect the consumer (full page) to ``data.paymentUrl``."""
        request, request_id = _with_request_id(request)
        return self.transport.call(
            "POST",
            f"{self.base_url}/v2/create",
            CheckoutResponse,
            operation="create",
            body=request.to_json(self.wire_names),
            auth=self.auth,
            request_id=request_id,
        )

    def update_checkout(self, request: UpdateCheckoutRequest) -> ApiResponse[CheckoutResponse]:
        """Replace the order details of an open checkout (the same update twice has the same effect)."""
        return self.transport.call(
            "POST",
            f"{self.base_url}/v2/update",
            CheckoutResponse,
            operation="update",
            body=request.to_json(self.wire_names),
            auth=self.auth,
        )

    def cancel_checkout(self, checkout_token: str) -> ApiResponse[CheckoutResponse]:
        """Cancel an open checkout. A retry after a lost answer may meet 409: check with get_status."""
        return self.transport.call(
            "POST",
            f"{self.base_url}/v2/cancel",
            CheckoutResponse,
            operation="cancel",
            body=CancelCheckoutRequest(checkoutToken=checkout_token).to_json(self.wire_names),
            auth=self.auth,
            mode=RetryMode.UNSAFE,
        )

    def get_status(self, checkout_token: str) -> ApiResponse[CheckoutStatusPayload]:
        """The checkout's status payload (the same body as the callback)."""
        return self.transport.call(
            "POST",
            f"{self.base_url}/v2/getstatus",
            CheckoutStatusPayload,
            operation="getstatus",
            body=GetStatusRequest(checkoutToken=checkout_token).to_json(self.wire_names),
            auth=self.auth,
        )

    def refund(self, request: RefundRequest) -> ApiResponse[RefundResponse]:
        """Refund all or part of a paid checkout (synchronous). Keep ``requestId`` to retry safely later."""
        request, request_id = _with_request_id(request)
        return self.transport.call(
            "POST",
            f"{self.base_url}/v2/refund",
            RefundResponse,
            operation="refund",
            body=request.to_json(self.wire_names),
            auth=self.auth,
            request_id=request_id,
        )


class V1Client(_BaseClient):
    """The v1 API at ``{v1_base_url}/api/v1/merchant``, authenticated with HTTP Basic."""

    def __init__(
        self,
        *,
        v1_base_url: str,
        merchant_account_id: str,
        api_key: str,
        timeout: Timeout = (5.0, 30.0),
        max_retries: int = 2,
        session: requests.Session | None = None,
        sleep: Callable[[float], None] = time.sleep,
        transport: Transport | None = None,
    ) -> None:
        super().__init__(
            timeout=timeout, max_retries=max_retries, session=session, sleep=sleep, transport=transport
        )
        self.v1_base_url = v1_base_url.rstrip("/")
        self.merchant_account_id = merchant_account_id
        self._auth = HTTPBasicAuth(merchant_account_id, api_key)

    def __repr__(self) -> str:
        return f"V1Client(v1_base_url={self.v1_base_url!r}, merchant_account_id={self.merchant_account_id!r})"

    def _url(self, operation: str) -> str:
        return f"{self.v1_base_url}/api/v1/merchant/{operation}"

    def configuration(
        self, *, amount: int | None = None, customer_email: str | None = None
    ) -> ApiResponse[V1Configuration]:
        """Minimum and maximum amounts, and with ``amount`` the payment plan for it."""
        request = V1ConfigurationRequest(
            amount=amount,
            customer=V1ConfigurationCustomer(email=customer_email) if customer_email else None,
        )
        answer = self.transport.call(
            "POST",
            self._url("configuration"),
            V1ConfigurationResponse,
            operation="v1_configuration",
            body=request.to_json(),
            auth=self._auth,
        )
        return _unwrap(answer, answer.data.data)

    def checkout(self, request: V1CheckoutRequest) -> ApiResponse[V1CheckoutData]:
        """Create a v1 checkout; send the consumer to ``data.redirect_to``."""
        answer = self.transport.call(
            "POST",
            self._url("checkout"),
            V1CheckoutResponse,
            operation="v1_checkout",
            body=request.to_json(),
            auth=self._auth,
            mode=RetryMode.UNSAFE,
        )
        return _unwrap(answer, answer.data.data)

    def refund(self, request: V1RefundRequest) -> ApiResponse[V1RefundResult]:
        """Refund a v1 order; raises :class:`V1RefundFailedError` when the gateway answers ``FAILED``."""
        answer = self.transport.call(
            "POST",
            self._url("refund"),
            V1RefundResult,
            operation="v1_refund",
            body=request.to_json(),
            auth=self._auth,
            mode=RetryMode.UNSAFE,
        )
        if answer.data.status != "REFUNDED":
            raise V1RefundFailedError(
                answer.data.failure_message,
                http_status=answer.status_code,
                body=answer.data.to_wire(),
                headers=answer.headers,
                operation="v1_refund",
            )
        return answer


ModelT = TypeVar("ModelT")


def _unwrap(answer: ApiResponse[object], data: ModelT) -> ApiResponse[ModelT]:
    return ApiResponse(
        data=data,
        status_code=answer.status_code,
        headers=answer.headers,
        request_id=answer.request_id,
        attempts=answer.attempts,
    )
