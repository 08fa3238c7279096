import pytest

from flask_gateway import create_checkout, payment_limits
from flask_gateway.core.errors import InvalidRequestError
from flask_gateway.models import GatewayCheckout
from flask_gateway.state import get_state
from tests.extension.conftest import sample_order


def test_payment_limits_before_and_after_installation(harness):
    with harness.shop.app_context():
        assert payment_limits() is None
    harness.install(minimum=5000, maximum=900_000)
    with harness.shop.app_context():
        limits = payment_limits()
        assert limits is not None
        assert (limits.minimum_cents, limits.maximum_cents) == (5000, 900_000)


def test_failed_tells_a_checkout_the_gateway_refused(harness):
    harness.install(minimum=100, maximum=1000)
    with harness.shop.app_context():
        # The shop's copy of the limits is stale (wider than the gateway's): the gateway refuses with 400.
        get_state().require_installation().maximum_cents = 10_000_000
        get_state().session.commit()
        with pytest.raises(InvalidRequestError):
            create_checkout(sample_order())
        checkout = get_state().session.query(GatewayCheckout).one()
        assert checkout.failed
        assert checkout.status == "FAILED"
