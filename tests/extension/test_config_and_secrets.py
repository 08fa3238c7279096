from __future__ import annotations

import pytest
from cryptography.fernet import Fernet

from flask_gateway.config import DEFAULTS, GatewayConfig
from flask_gateway.core.wire import OPERATOR, SPEC
from flask_gateway.errors import ConfigurationError, SecretUnreadable
from flask_gateway.secrets import SecretBox, mask


def test_defaults_select_the_local_emulator_and_are_written_back():
    config: dict[str, object] = {}
    parsed = GatewayConfig.from_mapping(config)
    assert parsed.environment == "emulator"
    assert parsed.base_url == "http://127.0.0.1:5050"
    assert parsed.install_url == "http://127.0.0.1:5050/install"
    assert parsed.timeout == (5.0, 30.0)
    assert set(DEFAULTS) <= set(config)


def test_explicit_urls_override_the_environment():
    parsed = GatewayConfig.from_mapping({"GATEWAY_BASE_URL": "https://gw.example/", "GATEWAY_TIMEOUT": 7})
    assert parsed.base_url == "https://gw.example"
    assert parsed.install_url == "http://127.0.0.1:5050/install"
    assert parsed.timeout == (7.0, 7.0)


def test_sandbox_uses_the_documented_addresses_without_typing_them():
    config = GatewayConfig.from_mapping({"GATEWAY_ENVIRONMENT": "sandbox"})
    assert config.base_url == "https://sandbox-checkout.payjustnow.io"
    assert config.install_url == "https://install.sandbox-checkout.payjustnow.io"
    assert config.v1_base_url == "https://sandbox.payjustnow.com"
    # Each can still be overridden.
    other = GatewayConfig.from_mapping(
        {"GATEWAY_ENVIRONMENT": "sandbox", "GATEWAY_BASE_URL": "https://gw.test"}
    )
    assert (other.base_url, other.install_url) == (
        "https://gw.test",
        "https://install.sandbox-checkout.payjustnow.io",
    )


def test_production_without_urls_names_the_missing_key_and_says_why():
    with pytest.raises(ConfigurationError, match="GATEWAY_BASE_URL is not set") as info:
        GatewayConfig.from_mapping({"GATEWAY_ENVIRONMENT": "production"})
    assert "documentation gives no production address" in str(info.value)
    assert "docs/configuration.md" in str(info.value)


def test_wire_names_default_to_the_operators_and_are_checked():
    assert GatewayConfig.from_mapping({}).wire_names is OPERATOR
    assert GatewayConfig.from_mapping({"GATEWAY_WIRE_NAMES": "spec"}).wire_names is SPEC
    with pytest.raises(ConfigurationError, match=r"GATEWAY_WIRE_NAMES='neutral'.*'operator'.*'spec'"):
        GatewayConfig.from_mapping({"GATEWAY_WIRE_NAMES": "neutral"})


@pytest.mark.parametrize(
    ("key", "value", "fragment"),
    [
        ("GATEWAY_ENVIRONMENT", "staging", "GATEWAY_ENVIRONMENT"),
        ("GATEWAY_API_VERSION", "v3", "GATEWAY_API_VERSION"),
        ("GATEWAY_ORDER_EXPIRY_MINUTES", 5, "10 to 7200"),
        ("GATEWAY_TIMEOUT", "fast", "GATEWAY_TIMEOUT"),
        ("GATEWAY_PUBLIC_URL", "shop.example", "absolute"),
        ("GATEWAY_URL_PREFIX", "gateway", "must start with"),
        ("GATEWAY_WAF", "off", "'strict' \\(default\\) or 'allow-local'"),
    ],
)
def test_bad_values_are_explained(key, value, fragment):
    with pytest.raises(ConfigurationError, match=fragment):
        GatewayConfig.from_mapping({key: value})


def test_only_the_emulator_may_allow_local_addresses():
    assert GatewayConfig.from_mapping({}).waf == "strict"
    assert GatewayConfig.from_mapping({"GATEWAY_WAF": "allow-local"}).waf == "allow-local"
    sandbox = {
        "GATEWAY_ENVIRONMENT": "sandbox",
        "GATEWAY_BASE_URL": "https://gw.example",
        "GATEWAY_INSTALL_URL": "https://install.gw.example",
        "GATEWAY_V1_BASE_URL": "https://v1.gw.example",
    }
    with pytest.raises(ConfigurationError, match="real gateway's firewall always refuses"):
        GatewayConfig.from_mapping({**sandbox, "GATEWAY_WAF": "allow-local"})


def test_production_needs_an_https_public_url():
    urls = {
        "GATEWAY_ENVIRONMENT": "production",
        "GATEWAY_BASE_URL": "https://gw.example",
        "GATEWAY_INSTALL_URL": "https://install.gw.example",
        "GATEWAY_V1_BASE_URL": "https://v1.gw.example",
    }
    with pytest.raises(ConfigurationError, match="https"):
        GatewayConfig.from_mapping({**urls, "GATEWAY_PUBLIC_URL": "http://shop.example"})
    assert (
        GatewayConfig.from_mapping({**urls, "GATEWAY_PUBLIC_URL": "https://shop.example"}).environment
        == "production"
    )


@pytest.mark.parametrize("key", ["GATEWAY_BASE_URL", "GATEWAY_INSTALL_URL", "GATEWAY_V1_BASE_URL"])
def test_production_refuses_plain_http_gateway_urls(key):
    urls = {
        "GATEWAY_ENVIRONMENT": "production",
        "GATEWAY_BASE_URL": "https://gw.example",
        "GATEWAY_INSTALL_URL": "https://install.gw.example",
        "GATEWAY_V1_BASE_URL": "https://v1.gw.example",
        "GATEWAY_PUBLIC_URL": "https://shop.example",
    }
    with pytest.raises(ConfigurationError, match=f"{key}=.*must be https:// in production"):
        GatewayConfig.from_mapping({**urls, key: urls[key].replace("https://", "http://")})


def test_production_needs_gateway_public_url():
    urls = {
        "GATEWAY_ENVIRONMENT": "production",
        "GATEWAY_BASE_URL": "https://gw.example",
        "GATEWAY_INSTALL_URL": "https://install.gw.example",
        "GATEWAY_V1_BASE_URL": "https://v1.gw.example",
    }
    with pytest.raises(ConfigurationError, match="GATEWAY_PUBLIC_URL is not set"):
        GatewayConfig.from_mapping(dict(urls))
    # The sandbox keeps falling back to the request's address.
    assert GatewayConfig.from_mapping({**urls, "GATEWAY_ENVIRONMENT": "sandbox"}).public_url is None


def test_config_repr_hides_the_encryption_key():
    key = Fernet.generate_key().decode()
    assert key not in repr(GatewayConfig.from_mapping({"GATEWAY_ENCRYPTION_KEY": key}))


def test_secret_box_round_trip_and_ciphertext_hides_the_secret():
    box = SecretBox(None, "app-secret-key")
    token = box.encrypt("sk-live-0123456789")
    assert "0123456789" not in token
    assert box.decrypt(token) == "sk-live-0123456789"
    assert SecretBox(None, "app-secret-key").decrypt(token) == "sk-live-0123456789"


def test_decrypt_cached_is_keyed_by_the_ciphertext_and_never_remembers_a_failure(monkeypatch):
    box = SecretBox(None, "app-secret-key")
    first, second = box.encrypt("signing-key-one"), box.encrypt("signing-key-two")
    calls: list[str] = []
    decrypt = box.decrypt

    def counting(token: str) -> str:
        calls.append(token)
        return decrypt(token)

    monkeypatch.setattr(box, "decrypt", counting)
    assert box.decrypt_cached(first) == "signing-key-one"
    assert box.decrypt_cached(first) == "signing-key-one"
    assert calls == [first]  # decrypted once
    assert box.decrypt_cached(second) == "signing-key-two"  # a changed row: a new ciphertext, decrypted
    assert calls == [first, second]
    unreadable = SecretBox(None, "other").encrypt("sk")
    for _ in range(2):
        with pytest.raises(SecretUnreadable):
            box.decrypt_cached(unreadable)
    assert calls == [first, second, unreadable, unreadable]
    assert "signing-key" not in repr(box)


def test_changed_secret_key_is_a_clear_error():
    token = SecretBox(None, "old").encrypt("sk")
    with pytest.raises(SecretUnreadable, match="SECRET_KEY or GATEWAY_ENCRYPTION_KEY changed"):
        SecretBox(None, "new").decrypt(token)


def test_key_rotation_with_a_list_of_keys():
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    token = SecretBox(old, None).encrypt("signing-key")
    rotated_box = SecretBox(f"{new},{old}", None)
    assert rotated_box.decrypt(token) == "signing-key"
    fresh = rotated_box.rotate(token)
    assert SecretBox(new, None).decrypt(fresh) == "signing-key"


def test_missing_keys_and_bad_keys_are_explained():
    with pytest.raises(ConfigurationError, match="SECRET_KEY"):
        SecretBox(None, None)
    with pytest.raises(ConfigurationError, match="Fernet"):
        SecretBox("not-a-key", None)


def test_mask_shows_only_the_last_four():
    assert mask("abcdefghijklmnop") == "****mnop"
    assert mask("short") == "****"
    assert mask(None) == "(not set)"
