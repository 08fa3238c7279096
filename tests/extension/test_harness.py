import pytest

from flask_gateway.core.errors import NotFoundError
from flask_gateway.state import get_state


@pytest.mark.backends
def test_install_stores_encrypted_keys_and_the_shop_can_sign(harness):
    harness.install()
    with harness.shop.app_context():
        state = get_state()
        installation = state.require_installation()
        assert installation.merchant_account_id == "demo-merchant"
        assert "demo-api-key" not in installation.api_key_encrypted
        key = state.box.decrypt(installation.signing_key_encrypted)
        assert key not in installation.signing_key_encrypted
        # The stored key works: the gateway accepts the signed call (an unknown token is 404, not 401).
        with pytest.raises(NotFoundError):
            state.client().get_status("v2.demo-merchant.unknown")
