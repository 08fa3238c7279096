"""Creating a checkout on the gateway, for an order and the merchant account already chosen for it.

:func:`create` is the unit of work behind ``start_checkout`` and ``create_checkout``: one create per order
(a row lock, the reusable checkout), the local record committed before the request, the request sent by
the API version's object (:class:`V2Creation` or :class:`V1Creation`, chosen once from
``GATEWAY_API_VERSION``), its answer applied through :func:`flask_gateway.payments.transitions.apply`.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from datetime import timedelta
from typing import ClassVar, Final, Generic, TypeVar

from pydantic import ValidationError
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from flask_gateway import signals
from flask_gateway.config import GatewayConfig
from flask_gateway.core.client import GatewayClient, V1Client, new_request_id
from flask_gateway.core.errors import (
    ConflictError,
    FirewallRejectedError,
    GatewayError,
    InvalidResponseError,
    definite_refusal,
)
from flask_gateway.core.http import describe_validation_error
from flask_gateway.core.sql import commit_keeping_loaded
from flask_gateway.core.timestamps import utcnow
from flask_gateway.core.wire import CheckoutStatus, CreateCheckoutRequest, V1CheckoutRequest
from flask_gateway.models import GatewayCheckout, Installation, LocalStatus
from flask_gateway.payments.mapping import (
    check_reference,
    order_snapshot,
    v1_checkout_request,
    v2_create_request,
)
from flask_gateway.payments.orders import OrderDraft
from flask_gateway.payments.transitions import Observation, apply
from flask_gateway.signals import sender
from flask_gateway.state import GatewayState, get_state

__all__ = ["REUSE_WINDOW", "VERSIONS", "Creation", "V1Creation", "V2Creation", "create"]

log = logging.getLogger("flask_gateway.checkouts")

S = CheckoutStatus

#: A ``CREATING`` checkout is retried with its ``requestId`` only within this window: the gateway keeps
#: idempotency keys 24 hours, so after that a resend could create a second checkout.
REUSE_WINDOW: Final = timedelta(hours=23)
#: Pauses (seconds, about 8 in all) of a create that meets its own requestId in flight (409): a concurrent
#: call for the same order sent it; once that request is done the gateway replays its answer.
_IN_FLIGHT_WAITS: Final = (0.25, 0.5, 1.0, 2.0, 4.0)
#: An open checkout is handed out again (double click on "Pay") only if it stays open this much longer.
_REUSE_OPEN_MARGIN: Final = timedelta(minutes=5)
#: The first key of the advisory locks taken by :func:`_one_create_per_order` (the second: the order's hash).
_CREATE_LOCK_NAMESPACE: Final = 7_305_214

BodyT = TypeVar("BodyT", CreateCheckoutRequest, V1CheckoutRequest)
ClientT = TypeVar("ClientT", GatewayClient, V1Client)


class Creation(ABC, Generic[BodyT, ClientT]):
    """One API version's create: its request built from the order, its client, its call, its answer read
    as an :class:`Observation`. :data:`VERSIONS` holds one per version."""

    #: ``GATEWAY_API_VERSION`` and ``GatewayCheckout.api_version``.
    version: ClassVar[str]
    #: The operation as the refusal's detail and the log lines name it.
    operation: ClassVar[str]
    #: Whether a record left ``CREATING`` may be sent again (the request carries an idempotency key).
    resends: ClassVar[bool]

    @abstractmethod
    def reference_field(self, config: GatewayConfig) -> str:
        """The order reference's field, as the wire spells it (for the error that refuses it)."""

    @abstractmethod
    def request(self, order: OrderDraft, checkout: GatewayCheckout) -> BodyT:
        """The request for ``order`` and its record; raises ``ValidationError`` or ``InvalidOrderError``."""

    @abstractmethod
    def client(self, state: GatewayState, installation: Installation) -> ClientT:
        """The client of the checkout's account."""

    @abstractmethod
    def call(self, client: ClientT, checkout_id: int, body: BodyT) -> Observation:
        """Send ``body``, read the answer; raises its ``GatewayError`` (logged unless a definite refusal)."""

    def send(
        self, state: GatewayState, installation: Installation, order: OrderDraft, checkout: GatewayCheckout
    ) -> Observation:
        """Build the request, commit the record (the ``requestId`` is safe before anything leaves), send it.

        Raises ``ValueError`` or ``InvalidOrderError`` for an order the API cannot take (the record rolled
        back, nothing sent), or the call's ``GatewayError`` (the record committed ``CREATING``).
        """
        session = state.session
        try:
            body = self.request(order, checkout)
        except ValidationError as exc:
            session.rollback()
            raise ValueError(
                f"order {order.reference!r} cannot be sent to the gateway: {describe_validation_error(exc)}"
            ) from None
        except BaseException:
            session.rollback()
            raise
        # The client is built first (it reads the installation): no transaction, and on SQLite no write lock,
        # stays open while the gateway answers.
        client = self.client(state, installation)
        # Keeping what the session holds loaded: a checkout the shop was handed before (another order's,
        # another account's) stays readable.
        commit_keeping_loaded(session)
        return self.call(client, checkout.id, body)


class V2Creation(Creation[CreateCheckoutRequest, GatewayClient]):
    """The v2 create: its ``requestId`` makes a resend safe for 24 hours (the gateway replays its answer)."""

    version = "v2"
    operation = "create"
    resends = True

    def reference_field(self, config: GatewayConfig) -> str:
        return f"{config.wire_names.order_details}.merchantOrderReference"

    def request(self, order: OrderDraft, checkout: GatewayCheckout) -> CreateCheckoutRequest:
        return v2_create_request(order, checkout.id, checkout.request_id)

    def client(self, state: GatewayState, installation: Installation) -> GatewayClient:
        return state.client(installation)

    def call(self, client: GatewayClient, checkout_id: int, body: CreateCheckoutRequest) -> Observation:
        """Asked again for about 8 seconds while the same ``requestId`` is in flight (409)."""
        waits = iter(_IN_FLIGHT_WAITS)
        while True:
            try:
                answer = client.create_checkout(body)
                break
            except ConflictError as error:
                # This requestId is still in flight: a concurrent call for the same order (a double
                # click) sent it a moment ago. Its answer is stored by the gateway and replayed to us
                # once it is done.
                delay = next(waits, None)
                if delay is None:
                    log.warning(
                        "checkout #%s: create still in flight elsewhere, kept CREATING: %s",
                        checkout_id,
                        error,
                    )
                    raise
                log.info(
                    "checkout #%s: the same create is in flight; asking again in %s s", checkout_id, delay
                )
                client.transport.sleep(delay)
            except GatewayError as error:
                if not definite_refusal(error):
                    log.warning("checkout #%s: create outcome unknown, kept CREATING: %s", checkout_id, error)
                raise
        data = answer.data
        replay = " (idempotent replay)" if answer.idempotent_replay else ""
        return Observation(
            status=str(data.checkoutPaymentStatus),
            source="create",
            token=data.checkoutToken,
            payment_url=data.paymentUrl,
            expires_at=data.expiresAt,
            total_cents=data.checkoutTotalCents,
            merchant_account_id=data.merchantAccountId,
            detail=f"created{replay}",
        )


class V1Creation(Creation[V1CheckoutRequest, V1Client]):
    """The v1 checkout: it has no idempotency key, so a record left ``CREATING`` is never sent again."""

    version = "v1"
    operation = "v1 checkout"
    resends = False

    def reference_field(self, config: GatewayConfig) -> str:
        return "order.merchant_reference"

    def request(self, order: OrderDraft, checkout: GatewayCheckout) -> V1CheckoutRequest:
        return v1_checkout_request(order, checkout.id)

    def client(self, state: GatewayState, installation: Installation) -> V1Client:
        return state.v1_client(installation)

    def call(self, client: V1Client, checkout_id: int, body: V1CheckoutRequest) -> Observation:
        try:
            answer = client.checkout(body)
        except GatewayError as error:
            if not definite_refusal(error):
                log.warning(
                    "checkout #%s: v1 checkout outcome unknown, kept CREATING: %s", checkout_id, error
                )
            raise
        return Observation(
            status=S.PENDING_ORDER.value,
            source="create",
            token=answer.data.token,
            payment_url=answer.data.redirect_to,
            expires_at=answer.data.expires_at,
            total_cents=body.order.amount,
            detail="created (v1)",
        )


#: The create of each ``GATEWAY_API_VERSION``.
VERSIONS: Final[dict[str, V2Creation | V1Creation]] = {"v2": V2Creation(), "v1": V1Creation()}


def create(order: OrderDraft, installation: Installation) -> GatewayCheckout:
    """Create (or hand out again) the checkout for ``order`` on ``installation``'s account, in the current
    app context; the behaviour is :func:`flask_gateway.payments.checkouts.create_checkout`'s.

    Raises ``InvalidOrderError`` or ``ValueError`` for an order the API cannot take (nothing saved), the
    ``GatewayError`` of the request (the record ``FAILED`` after a definite refusal, else kept ``CREATING``),
    ``InvalidResponseError`` for an answer that does not fit the record.
    """
    state = get_state()
    session = state.session
    version = VERSIONS[state.config.api_version]
    checkout = _one_create_per_order(session, order, version, installation.merchant_account_id, state.config)
    if checkout.status != LocalStatus.CREATING:
        commit_keeping_loaded(session)
        return checkout
    checkout_id = checkout.id
    try:
        observation = version.send(state, installation, order, checkout)
    except GatewayError as error:
        if definite_refusal(error):
            _refused(session, checkout_id, error, version.operation)
        raise
    transition = apply(session, checkout_id, observation)
    created = transition.checkout
    if transition.flagged or created.payment_url is None:
        raise InvalidResponseError(
            f"the gateway's answer to create does not fit checkout #{checkout_id}: "
            f"{transition.reason or 'no paymentUrl'}",
            operation="create",
        )
    if transition.applied and transition.before == LocalStatus.CREATING:
        signals.checkout_created.send(sender(), checkout=created, account=created.merchant_account_id)
    return created


def _one_create_per_order(
    session: Session, order: OrderDraft, version: V2Creation | V1Creation, account: str, config: GatewayConfig
) -> GatewayCheckout:
    """The order's reusable checkout (``CREATING`` to send again, or still open), else a new ``CREATING``
    record (flushed: its id goes into the signed redirect URLs). A reference the gateway would refuse is
    refused first (``InvalidOrderError``), before anything is written.

    One create for an order runs at a time: until this transaction ends, a concurrent call (a double click
    on "Pay") waits, then finds this call's ``CREATING`` row and reuses it. PostgreSQL: a transaction-level
    advisory lock on (account, reference); SQLite needs none (``BEGIN IMMEDIATE`` runs one at a time).
    """
    check_reference(order, version.reference_field(config))
    if session.connection().dialect.name == "postgresql":
        # Rows that do not exist yet cannot be locked, and READ COMMITTED would let both calls see "no
        # checkout yet": the lock is on the order's key instead.
        key = func.hashtext(f"{account}\n{order.reference}")
        session.execute(select(func.pg_advisory_xact_lock(_CREATE_LOCK_NAMESPACE, key)))
    snapshot = order_snapshot(order)
    now = utcnow()
    candidates = session.scalars(
        select(GatewayCheckout)
        .where(
            GatewayCheckout.order_reference == order.reference,
            GatewayCheckout.api_version == version.version,
            GatewayCheckout.merchant_account_id == account,
            GatewayCheckout.total_cents == order.amount_cents,
            GatewayCheckout.status.in_([LocalStatus.CREATING.value, S.PENDING_ORDER.value]),
            GatewayCheckout.flagged.is_(False),
        )
        .order_by(GatewayCheckout.id.desc())
    ).all()
    for checkout in candidates:
        if checkout.order != snapshot:
            continue
        if checkout.status == LocalStatus.CREATING:
            if version.resends and checkout.created_at > now - REUSE_WINDOW:
                return checkout
        elif (
            checkout.payment_url
            and checkout.expires_at is not None
            and checkout.expires_at > now + _REUSE_OPEN_MARGIN
        ):
            return checkout
    checkout = GatewayCheckout(
        api_version=version.version,
        order_reference=order.reference,
        request_id=new_request_id(),
        merchant_account_id=account,
        status=LocalStatus.CREATING.value,
        total_cents=order.amount_cents,
        paid_cents=0,
        refunded_cents=0,
        order=snapshot,
        created_at=now,
        updated_at=now,
        flagged=False,
    )
    session.add(checkout)
    session.flush()
    return checkout


def _refused(session: Session, checkout_id: int, error: GatewayError, operation: str) -> None:
    """Mark a checkout ``FAILED`` after a definite refusal of its creation."""
    if isinstance(error, FirewallRejectedError):
        # The key first: a one-line summary (pytest's, a log line) shows the start of the message.
        error.message = (
            "GATEWAY_PUBLIC_URL: the gateway's firewall refuses redirect URLs on localhost or an IP "
            f"address; set it to the shop's public address ({error.message})"
        )
    session.rollback()
    apply(
        session,
        checkout_id,
        Observation(status=LocalStatus.FAILED.value, source="create", detail=f"{operation} refused: {error}"),
    )
