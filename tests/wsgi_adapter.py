"""A ``requests`` transport that hands requests to a Flask app in-process (no sockets)."""

from __future__ import annotations

from urllib.parse import urlsplit

import requests
from flask.testing import FlaskClient
from requests.adapters import BaseAdapter
from requests.structures import CaseInsensitiveDict

from flask_gateway.emulator.problems import ResponseDropped


class FlaskAdapter(BaseAdapter):
    """Mount on a ``requests.Session`` for a base URL; every request goes to the Flask test client."""

    def __init__(self, client: FlaskClient) -> None:
        super().__init__()
        self.client = client

    def send(self, request, stream=False, timeout=None, verify=True, cert=None, proxies=None):  # type: ignore[no-untyped-def]
        url = urlsplit(request.url)
        try:
            answer = self._open(request, url)
        except ResponseDropped as exc:  # the emulator's "drop the answer after commit" fault
            raise requests.ConnectionError(str(exc), request=request) from exc
        response = requests.Response()
        response.status_code = answer.status_code
        response.reason = answer.status.partition(" ")[2]
        response.headers = CaseInsensitiveDict(answer.headers)
        response._content = answer.get_data()
        response.url = request.url
        response.request = request
        return response

    def _open(self, request, url):  # type: ignore[no-untyped-def]
        return self.client.open(
            url.path,
            base_url=f"{url.scheme}://{url.netloc}",
            method=request.method,
            query_string=url.query,
            data=request.body,
            headers=dict(request.headers),
        )

    def close(self) -> None:
        pass
