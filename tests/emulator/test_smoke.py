import pytest

from tests.emulator.support import create_body


@pytest.mark.backends
def test_create_pay_and_status(installed):
    created = installed.create(create_body())
    assert created["checkoutPaymentStatus"] == "PENDING_ORDER"
    assert installed.pay(created["checkoutToken"]).json["checkoutPaymentStatus"] == "PAID_PENDING_CALLBACK"
    assert installed.status(created["checkoutToken"])["checkoutPaymentStatus"] == "PAID_PENDING_CALLBACK"
