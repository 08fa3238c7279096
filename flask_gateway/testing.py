"""A shop app wired to an in-process gateway emulator: the seam for tests, benchmarks and examples.

:func:`connect` routes the shop's gateway clients to the emulator app, and the emulator's calls to the
merchant (signed callbacks, v1 success/fail URLs) back to the shop app. Each request is handed to the
other app's test client through a ``requests`` adapter (:class:`FlaskAdapter`): the same code paths and the
same bytes as over HTTP, without sockets, threads or ports. Nothing is monkeypatched: the shop's clients
take their ``requests.Session`` from the extension's state, the emulator takes its own with
:func:`flask_gateway.emulator.set_merchant_http`.

The shop must be configured with the two base URLs the wiring uses (:func:`gateway_config` gives the
``GATEWAY_*`` keys)::

    shop = create_shop({**gateway_config(), "SQLALCHEMY_DATABASE_URI": ...})
    emulator = flask_gateway.emulator.create_app({...})
    wiring = connect(shop, emulator)

This is the one module that sees both the extension and the emulator (docs/architecture.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit

import requests
from flask import Flask
from flask.testing import FlaskClient
from requests.adapters import BaseAdapter
from requests.structures import CaseInsensitiveDict

from flask_gateway.emulator import set_merchant_http
from flask_gateway.emulator.problems import ResponseDropped
from flask_gateway.state import get_state

__all__ = ["EMULATOR_URL", "SHOP_URL", "FlaskAdapter", "Wiring", "connect", "gateway_config"]

#: Where the shop's clients find the in-process emulator (any host name works; nothing resolves it).
EMULATOR_URL: Final = "http://emulator.test"
#: Where the emulator finds the in-process shop (its callback URL and v1 URLs are built on it).
SHOP_URL: Final = "https://shop.example"


class FlaskAdapter(BaseAdapter):
    """A ``requests`` transport that hands each request to a Flask app's test client (no sockets).

    Mount it on a ``requests.Session`` for a base URL. The emulator's "drop the answer after the commit"
    fault (``ResponseDropped``) reaches the caller as the ``requests.ConnectionError`` a reset socket gives.
    """

    def __init__(self, client: FlaskClient) -> None:
        super().__init__()
        self.client = client

    def send(
        self,
        request: requests.PreparedRequest,
        stream: bool = False,
        timeout: Any = None,
        verify: Any = True,
        cert: Any = None,
        proxies: Any = None,
    ) -> requests.Response:
        url = urlsplit(request.url or "")
        try:
            answer = self.client.open(
                url.path,
                base_url=f"{url.scheme}://{url.netloc}",
                method=request.method or "GET",
                query_string=url.query,
                data=request.body,
                headers=dict(request.headers),
            )
        except ResponseDropped as exc:
            raise requests.ConnectionError(str(exc), request=request) from exc
        response = requests.Response()
        response.status_code = answer.status_code
        response.reason = answer.status.partition(" ")[2]
        response.headers = CaseInsensitiveDict(answer.headers)
        response._content = answer.get_data()
        response.url = request.url or ""
        response.request = request
        return response

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class Wiring:
    """The two directions of a :func:`connect`: each a ``requests.Session`` with a :class:`FlaskAdapter`."""

    shop: Flask
    emulator: Flask
    #: The shop's clients to the emulator (installed in the extension's state).
    to_emulator: requests.Session
    #: The emulator's callbacks and v1 outcome calls to the shop (installed in the emulator).
    to_shop: requests.Session


def gateway_config(*, emulator_url: str = EMULATOR_URL, shop_url: str = SHOP_URL) -> dict[str, Any]:
    """The ``GATEWAY_*`` keys of a shop that :func:`connect` wires to an in-process emulator."""
    return {
        "GATEWAY_ENVIRONMENT": "emulator",
        "GATEWAY_BASE_URL": emulator_url,
        "GATEWAY_INSTALL_URL": f"{emulator_url}/install",
        "GATEWAY_V1_BASE_URL": emulator_url,
        "GATEWAY_PUBLIC_URL": shop_url,
    }


def connect(
    shop: Flask,
    emulator: Flask,
    *,
    emulator_url: str = EMULATOR_URL,
    shop_url: str = SHOP_URL,
    pause_retries: bool = False,
) -> Wiring:
    """Wire ``shop`` (an app with the extension) and ``emulator`` (an emulator app) to each other.

    ``pause_retries``: keep the clients' real pauses between retries (off by default: a test does not
    wait out a backoff).
    """
    to_emulator = requests.Session()
    to_emulator.mount(emulator_url, FlaskAdapter(emulator.test_client()))
    options: dict[str, Any] = {"session": to_emulator}
    if not pause_retries:
        options["sleep"] = _no_pause
    get_state(shop).client_options.update(options)
    to_shop = requests.Session()
    to_shop.mount(shop_url, FlaskAdapter(shop.test_client()))
    set_merchant_http(emulator, to_shop)
    return Wiring(shop=shop, emulator=emulator, to_emulator=to_emulator, to_shop=to_shop)


def _no_pause(_seconds: float) -> None:
    return None
