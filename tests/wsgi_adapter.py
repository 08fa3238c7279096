"""A ``requests`` transport that hands requests to a Flask app in-process (no sockets)."""

from __future__ import annotations

from urllib.parse import urlsplit

import requests
from flask.testing import FlaskClient
from requests.adapters import BaseAdapter
from requests.structures import CaseInsensitiveDict


class FlaskAdapter(BaseAdapter):
    """Mount on a ``requests.Session`` for a base URL; every request goes to the Flask test client."""

    def __init__(self, client: FlaskClient) -> None:
        super().__init__()
        self.client = client

    def send(self, request, stream=False, timeout=None, verify=True, cert=None, proxies=None):  # type: ignore[no-untyped-def]
        url = urlsplit(request.url)
        answer = self.client.open(
            url.path,
            base_url=f"{url.scheme}://{url.netloc}",
            method=request.method,
            query_string=url.query,
            data=request.body,
            headers=dict(request.headers),
        )
        response = requests.Response()
        response.status_code = answer.status_code
        response.reason = answer.status.partition(" ")[2]
        response.headers = CaseInsensitiveDict(answer.headers)
        response._content = answer.get_data()
        response.url = request.url
        response.request = request
        return response

    def close(self) -> None:
        pass
