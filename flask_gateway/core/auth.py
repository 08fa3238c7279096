"""Request authentication for ``requests``: the v2 signature headers."""

from __future__ import annotations

from requests import PreparedRequest
from requests.auth import AuthBase

from flask_gateway.core.signing import sign

__all__ = ["ACCOUNT_HEADER", "SIGNATURE_HEADER", "SignatureAuth"]

ACCOUNT_HEADER = "X-Merchant-Account-ID"
SIGNATURE_HEADER = "X-Signature"


class SignatureAuth(AuthBase):
    """Adds ``X-Merchant-Account-ID`` and ``X-Signature`` (HMAC of the exact body bytes sent)."""

    def __init__(self, merchant_account_id: str, signing_key: str) -> None:
        if not merchant_account_id:
            raise ValueError("a merchant account id is required to sign requests")
        if not signing_key:
            raise ValueError("a signing key is required to sign requests: install the gateway first")
        self.merchant_account_id = merchant_account_id
        self._signing_key = signing_key

    def __call__(self, request: PreparedRequest) -> PreparedRequest:
        body = request.body if request.body is not None else b""
        request.headers[ACCOUNT_HEADER] = self.merchant_account_id
        request.headers[SIGNATURE_HEADER] = sign(body, self._signing_key)
        return request

    def __repr__(self) -> str:
        return f"SignatureAuth(merchant_account_id={self.merchant_account_id!r}, signing_key='****')"
