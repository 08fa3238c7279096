"""``core.wsgi.WSGIAdapter``: an app reached in-process answers as it would over HTTP through requests."""

from __future__ import annotations

import requests
from werkzeug.wrappers import Request, Response

from flask_gateway.core.wsgi import WSGIAdapter


@Request.application
def _app(request: Request) -> Response:
    response = Response(request.get_data(), status=201, mimetype="application/json")
    response.headers.add("X-Seen", "first")
    response.headers.add("x-seen", "second")  # the same header twice, in another case
    response.headers["Retry-After"] = "5"
    return response


def test_the_answer_reads_as_over_http_repeated_headers_joined() -> None:
    session = requests.Session()
    session.mount("https://gateway.test", WSGIAdapter(_app))
    answer = session.post("https://gateway.test/v2/getstatus", data=b'{"a":1}', timeout=5)
    assert (answer.status_code, answer.reason, answer.content) == (201, "CREATED", b'{"a":1}')
    # One entry a name, values joined as urllib3 joins them; names case-insensitive.
    assert answer.headers["x-seen"] == "first, second"
    assert answer.headers["Retry-After"] == "5"
    assert answer.headers["content-type"] == "application/json"
