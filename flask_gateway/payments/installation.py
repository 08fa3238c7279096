"""Installing the gateway for this shop, adopting a signing key issued before, and changing settings.

The secrets are encrypted before they are stored, and never logged (flask_gateway.secrets).
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from datetime import datetime

from flask_gateway.core.timestamps import utcnow
from flask_gateway.core.wire import InstallRequest, SettingsUpdateRequest
from flask_gateway.errors import SecretUnreadable
from flask_gateway.models import Installation
from flask_gateway.state import get_state, leaves_no_transaction

__all__ = [
    "InstallSettings",
    "adopt_signing_key",
    "install",
    "set_api_key",
    "store_signing_key",
    "update_settings",
]


@dataclass(frozen=True)
class InstallSettings:
    """What :func:`install` sends the gateway: the account, its API key, and the settings to install."""

    merchant_account_id: str
    api_key: str
    callback_url: str
    callback_failures_email: str | None
    minimum_cents: int
    maximum_cents: int

    def __repr__(self) -> str:
        return f"InstallSettings(merchant_account_id={self.merchant_account_id!r}, api_key='****')"


def _store(settings: InstallSettings, signing_key: str) -> Installation:
    """The account's row, created for an account new to this shop (another merchant account: the ones
    installed before keep their rows, keys and checkouts), updated for one installed before."""
    state = get_state()
    now = utcnow()
    installation = state.installation(settings.merchant_account_id) or Installation(
        environment=state.config.environment,
        merchant_account_id=settings.merchant_account_id,
        installed_at=now,
    )
    installation.api_key_encrypted = state.box.encrypt(settings.api_key)
    store_signing_key(installation, signing_key, now)
    installation.callback_url = settings.callback_url
    installation.callback_failures_email = settings.callback_failures_email
    installation.minimum_cents = settings.minimum_cents
    installation.maximum_cents = settings.maximum_cents
    installation.updated_at = now
    # The gateway just answered with these settings: nothing differs now.
    installation.settings_checked_at, installation.settings_drift = now, []
    state.session.add(installation)
    state.session.commit()
    return installation


def store_signing_key(installation: Installation, signing_key: str, now: datetime) -> bool:
    """Keep ``signing_key``, the one the gateway answered, as the account's key (encrypted); True when it
    is a new one.

    The key it replaces becomes the previous key, which still verifies callbacks for
    ``GATEWAY_PREVIOUS_SIGNING_KEY_HOURS`` after ``now`` (``inbound.callbacks``): the gateway's callbacks
    signed before the change, and its retries of them, are not refused. A previous key that can no longer
    be decrypted (``SECRET_KEY`` lost) is not kept. The caller commits.
    """
    box = get_state().box
    current = installation.signing_key_encrypted
    if current:
        try:
            known: str | None = box.decrypt_cached(current)
        except SecretUnreadable:
            known = None
        if known is not None and hmac.compare_digest(known.encode(), signing_key.encode()):
            return False
        installation.previous_signing_key_encrypted = current if known is not None else None
        installation.signing_key_replaced_at = now
    installation.signing_key_encrypted = box.encrypt(signing_key)
    return True


@leaves_no_transaction
def install(settings: InstallSettings) -> Installation:
    """Call the installation operation and store the returned signing key (encrypted).

    Raises ``AlreadyInstalledError`` (403, from ``flask_gateway.core.errors``) when the account was installed
    before: then ask the owner for the signing key they were given and call :func:`adopt_signing_key`.
    """
    request = InstallRequest.model_validate(
        {
            "merchantAccountId": settings.merchant_account_id,
            "merchantAccountApiKey": settings.api_key,
            "checkoutStatusCallbackUrl": settings.callback_url,
            "callbackFailuresEmail": settings.callback_failures_email,
            "minimumCheckoutAmountCents": settings.minimum_cents,
            "maximumCheckoutAmountCents": settings.maximum_cents,
        }
    )
    answer = get_state().install_client(settings.merchant_account_id).install(request)
    return _store(settings, answer.data.secretSigningKey.get_secret_value())


@leaves_no_transaction
def adopt_signing_key(settings: InstallSettings, signing_key: str) -> Installation:
    """Store a signing key the owner already has (after "already installed"), once the gateway accepts it.

    The key is checked with a settings update carrying the same settings: a wrong key gives
    ``AuthenticationError`` and nothing is stored.
    """
    client = get_state().signed_client(settings.merchant_account_id, signing_key)
    answer = client.update_settings(
        SettingsUpdateRequest(
            checkoutStatusCallbackUrl=settings.callback_url,
            callbackFailuresEmail=settings.callback_failures_email,
            minimumCheckoutAmountCents=settings.minimum_cents,
            maximumCheckoutAmountCents=settings.maximum_cents,
        )
    )
    return _store(settings, answer.data.signingKey.get_secret_value())


@leaves_no_transaction
def update_settings(
    *,
    callback_url: str,
    callback_failures_email: str | None,
    minimum_cents: int,
    maximum_cents: int,
    account: str | None = None,
) -> Installation:
    """Send the four settings (PATCH) of ``account`` (default: the default account) and store them with the
    returned ``signingKey``."""
    state = get_state()
    account = state.require_installation(account).merchant_account_id
    client = state.client(account=account)
    # No transaction open while the gateway answers: on SQLite every transaction holds the write lock
    # (BEGIN IMMEDIATE), which would stall callbacks for the whole call. (Like every operation, this
    # commits the caller's pending changes in the shared session.)
    state.session.commit()
    answer = client.update_settings(
        SettingsUpdateRequest(
            checkoutStatusCallbackUrl=callback_url,
            callbackFailuresEmail=callback_failures_email,
            minimumCheckoutAmountCents=minimum_cents,
            maximumCheckoutAmountCents=maximum_cents,
        )
    )
    installation = state.require_installation(account)
    installation.callback_url = answer.data.checkoutStatusCallbackUrl or callback_url
    installation.callback_failures_email = answer.data.callbackFailuresEmail
    installation.minimum_cents = answer.data.minimumCheckoutAmountCents or minimum_cents
    installation.maximum_cents = answer.data.maximumCheckoutAmountCents or maximum_cents
    installation.updated_at = utcnow()
    store_signing_key(installation, answer.data.signingKey.get_secret_value(), installation.updated_at)
    installation.settings_checked_at, installation.settings_drift = installation.updated_at, []
    state.session.commit()
    return installation


@leaves_no_transaction
def set_api_key(account: str | None, api_key: str) -> Installation:
    """Store a new API key for an installed account (the account manager issued one), once the gateway
    accepts it; the stored key is kept when it does not.

    The proof is one authenticated, read-only call made with the new key: the v1 configuration (HTTP Basic
    ``merchantAccountId:apiKey``, the key's only use besides installation). A refused key raises
    ``AuthenticationError``, an unreachable gateway a ``GatewayError``: nothing is stored either way. Only
    the account's row is written (its ``api_key_encrypted`` and ``updated_at``).
    """
    key = api_key.strip()
    if not key:
        raise ValueError("the API key is empty")
    state = get_state()
    installation = state.require_installation(account)
    account = installation.merchant_account_id
    client = state.v1_client(installation, api_key=key)
    state.session.commit()  # no transaction while the gateway answers
    client.configuration()
    installation = state.require_installation(account)
    installation.api_key_encrypted = state.box.encrypt(key)
    installation.updated_at = utcnow()
    state.session.commit()
    return installation
