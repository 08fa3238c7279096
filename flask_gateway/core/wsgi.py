"""A ``requests`` transport that hands each request to a WSGI application in this process (no sockets).

Mounted on a ``requests.Session`` for a base URL, it lets the gateway's clients talk to an emulator that
runs inside the same process (the embedded emulator, ``GATEWAY_ENVIRONMENT="embedded"``), and the emulator
send its callbacks to the shop it is mounted in: the same requests, the same bytes and headers (so the same
signatures), through the same code paths as over HTTP, with no port, thread or server in between. A server
that handles one request at a time (a single sync worker) never waits for itself.

An application that drops the connection raises ``ConnectionError`` (the emulator's "reset after commit"
fault does, where it has no socket to reset); the caller then sees the ``requests.ConnectionError`` a reset
socket gives.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import urlsplit

import requests
from requests.adapters import BaseAdapter
from requests.structures import CaseInsensitiveDict
from werkzeug.test import Client

__all__ = ["WSGIAdapter"]


class WSGIAdapter(BaseAdapter):
    """Send requests to ``app`` (any WSGI application) in-process.

    ``origin``: called for each request; when it returns a base URL (``http://127.0.0.1:5000/``), the request
    is made on that origin instead of the URL's own, so the application sees the address a browser used (the
    embedded emulator builds its ``paymentUrl`` on it). ``None`` keeps the URL's origin.

    When the mounted URL has a path the application does not serve under the same path, ``strip_prefix`` is
    taken off the request's path and ``add_prefix`` put in front (the sandbox's installation address
    ``https://install...`` is ``/install`` on the emulator); ``script_root`` is the path the application is
    mounted at (a shop whose public address has a path). The peer's address is ``127.0.0.1``: it is this
    process.
    """

    def __init__(
        self,
        app: Any,
        *,
        origin: Callable[[], str | None] | None = None,
        strip_prefix: str = "",
        add_prefix: str = "",
        script_root: str = "",
    ) -> None:
        super().__init__()
        # No cookies: each request stands alone, as a server-to-server call does, and threads share nothing.
        self._client = Client(app, use_cookies=False)
        self._origin = origin
        self.strip_prefix = strip_prefix.rstrip("/")
        self.add_prefix = add_prefix.rstrip("/")
        self.script_root = script_root.rstrip("/")

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
        base = (self._origin() if self._origin else None) or f"{url.scheme}://{url.netloc}"
        headers = dict(request.headers)
        if self._origin is not None:
            headers.pop("Host", None)  # the origin's own host, not the configured one
        path = url.path
        if self.strip_prefix and (path == self.strip_prefix or path.startswith(self.strip_prefix + "/")):
            path = path[len(self.strip_prefix) :] or "/"
        try:
            answer = self._client.open(
                self.add_prefix + path,
                base_url=base.rstrip("/") + self.script_root,
                environ_base={"REMOTE_ADDR": "127.0.0.1"},
                method=request.method or "GET",
                query_string=url.query,
                data=request.body,
                headers=headers,
            )
        except ConnectionError as exc:
            raise requests.ConnectionError(str(exc), request=request) from exc
        response = requests.Response()
        response.status_code = answer.status_code
        response.reason = answer.status.partition(" ")[2]
        response.headers = _joined(answer.headers.items())
        response._content = answer.get_data()
        response.url = request.url or ""
        response.request = request
        answer.close()
        return response

    def close(self) -> None:
        pass


def _joined(items: Iterable[tuple[str, str]]) -> CaseInsensitiveDict[str]:
    """The answer's headers as requests gives them over HTTP: one entry a name, repeated values joined with
    ", " (urllib3's ``HTTPHeaderDict``). Built from the (name, value) pairs: Werkzeug 3.1.0's ``Headers``
    cannot be read as a mapping (``CaseInsensitiveDict(headers)`` raises ``TypeError`` there)."""
    headers: CaseInsensitiveDict[str] = CaseInsensitiveDict()
    for name, value in items:
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    return headers
