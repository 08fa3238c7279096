"""The seam: a shop app and an emulator app wired to each other in-process, through ``requests`` adapters.

:func:`connect` on two fixed base URLs (:func:`gateway_config`), :func:`connect_configured` on the shop's
configured ones (nothing else leaves the process: :class:`OffTheNetwork`). Imports the extension's state and
the emulator's front; nothing of this package.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit

import requests
from flask import Flask, request
from flask.testing import FlaskClient
from requests.adapters import BaseAdapter

from flask_gateway.core.wsgi import WSGIAdapter
from flask_gateway.emulator import set_merchant_http
from flask_gateway.state import get_state

#: Where the shop's clients find the in-process emulator (any host name works; nothing resolves it).
EMULATOR_URL: Final = "http://emulator.test"
#: Where the emulator finds the in-process shop (its callback URL and v1 URLs are built on it).
SHOP_URL: Final = "https://shop.example"


class FlaskAdapter(WSGIAdapter):
    """A ``requests`` transport that hands each request to a Flask app's test client's app (no sockets):
    :class:`flask_gateway.core.wsgi.WSGIAdapter`, built from a test client.

    Mount it on a ``requests.Session`` for a base URL. The emulator's "drop the answer after the commit"
    fault (``ResponseDropped``) reaches the caller as the ``requests.ConnectionError`` a reset socket gives.
    ``strip_prefix``, ``add_prefix`` and ``script_root`` map the mounted URL's path onto the app's (see
    ``WSGIAdapter``).
    """

    def __init__(
        self, client: FlaskClient, *, strip_prefix: str = "", add_prefix: str = "", script_root: str = ""
    ) -> None:
        super().__init__(
            client.application, strip_prefix=strip_prefix, add_prefix=add_prefix, script_root=script_root
        )
        self.client = client


class OffTheNetwork(BaseAdapter):
    """Mounted on ``http://`` and ``https://`` by :func:`connect_configured`: whatever was not wired to an
    app fails as an unreachable host would, and nothing leaves the process."""

    def send(
        self,
        request: requests.PreparedRequest,
        stream: bool = False,
        timeout: Any = None,
        verify: Any = True,
        cert: Any = None,
        proxies: Any = None,
    ) -> requests.Response:
        raise requests.ConnectionError(
            f"{request.method} {request.url}: not wired in-process (flask_gateway.testing sends nothing over "
            "the network; only the gateway's configured URLs and the shop's public URL are wired)",
            request=request,
        )

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
    _use_session(shop, to_emulator, pause_retries=pause_retries)
    to_shop = requests.Session()
    to_shop.mount(shop_url, FlaskAdapter(shop.test_client()))
    set_merchant_http(emulator, to_shop)
    return Wiring(shop=shop, emulator=emulator, to_emulator=to_emulator, to_shop=to_shop)


def shop_base_url(shop: Flask) -> str:
    """Where the gateway reaches ``shop``: its ``GATEWAY_PUBLIC_URL``, else the address its URLs are built
    on without one (``http://localhost``, or ``SERVER_NAME``), without a trailing slash."""
    public = get_state(shop).config.public_url
    if public:
        return public
    with shop.test_request_context():
        return request.url_root.rstrip("/")


def connect_configured(shop: Flask, emulator: Flask, *, pause_retries: bool = False) -> Wiring:
    """Wire ``shop`` and ``emulator`` on the addresses the shop is configured with.

    The shop's ``GATEWAY_BASE_URL``, ``GATEWAY_INSTALL_URL`` and ``GATEWAY_V1_BASE_URL`` (or its
    ``GATEWAY_ENVIRONMENT``'s: the local emulator's ``http://127.0.0.1:5050`` by default, or the
    sandbox's) lead to ``emulator``, paths mapped (``{install_url}/v2`` is ``/install/v2`` on the emulator);
    the shop's :func:`shop_base_url` leads back to ``shop``. Anything else fails with
    ``requests.ConnectionError`` (:class:`OffTheNetwork`) in both directions. A shop configured for
    ``production`` is refused (``ValueError``): a test has no business with production addresses.
    """
    config = get_state(shop).config
    if config.environment == "production":
        raise ValueError(
            "GATEWAY_ENVIRONMENT='production' in the shop's configuration: a test has no business with "
            "production addresses; wire a test shop configured for 'emulator' (the default) or 'sandbox'."
        )
    emulator_client = emulator.test_client()
    to_emulator = _offline_session()
    for configured, served_at in (
        (config.base_url, ""),
        (config.v1_base_url, ""),
        (config.install_url, "/install"),
    ):
        path = urlsplit(configured).path.rstrip("/")
        adapter = FlaskAdapter(emulator_client, strip_prefix=path, add_prefix=served_at)
        to_emulator.mount(configured.rstrip("/") + "/", adapter)
    _use_session(shop, to_emulator, pause_retries=pause_retries)
    to_shop = _offline_session()
    shop_url = shop_base_url(shop)
    script_root = urlsplit(shop_url).path.rstrip("/")
    adapter = FlaskAdapter(shop.test_client(), strip_prefix=script_root, script_root=script_root)
    to_shop.mount(shop_url + "/", adapter)
    set_merchant_http(emulator, to_shop)
    return Wiring(shop=shop, emulator=emulator, to_emulator=to_emulator, to_shop=to_shop)


def _offline_session() -> requests.Session:
    session = requests.Session()
    session.trust_env = False  # no proxy from the environment: nothing is sent anywhere
    session.mount("http://", OffTheNetwork())
    session.mount("https://", OffTheNetwork())
    return session


def _use_session(shop: Flask, session: requests.Session, *, pause_retries: bool) -> None:
    options: dict[str, Any] = {"session": session}
    if not pause_retries:
        options["sleep"] = _no_pause
    get_state(shop).client_options.update(options)


def _no_pause(_seconds: float) -> None:
    return None
