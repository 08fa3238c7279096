"""Private links never reach the access log (issue 12, point 6): werkzeug's request lines and gunicorn's."""

from __future__ import annotations

import logging

import pytest

from example_shop.links import order_token
from tests.shop.conftest import ShopHarness

REQUEST_LINE = "GET /orders/view/{token}/status.json HTTP/1.1"


def test_werkzeug_request_lines_hide_order_links_and_v1_refs(
    shop: ShopHarness, caplog: pytest.LogCaptureFixture
) -> None:
    with shop.app.app_context():
        token = order_token("STP-ABCD1234")
    caplog.set_level(logging.INFO, logger="werkzeug")
    logger = logging.getLogger("werkzeug")
    # As werkzeug.serving.WSGIRequestHandler.log_request writes a line.
    logger.info('%s - - [%s] "%s" %s %s', "127.0.0.1", "now", REQUEST_LINE.format(token=token), "200", "-")
    logger.info(
        '%s - - [%s] "%s" %s %s',
        "127.0.0.1",
        "now",
        "GET /gateway/v1/success?ref=SIGNED&token=abc&status=SUCCESS HTTP/1.1",
        "200",
        "-",
    )

    text = caplog.text
    assert token not in text and "SIGNED" not in text and "token=abc" not in text
    assert "/orders/view/[redacted]/status.json" in text
    assert "ref=[redacted]&token=[redacted]&status=SUCCESS" in text


def test_gunicorn_access_lines_hide_order_links(shop: ShopHarness, caplog: pytest.LogCaptureFixture) -> None:
    with shop.app.app_context():
        token = order_token("STP-ABCD1234")
    caplog.set_level(logging.INFO, logger="gunicorn.access")
    # As gunicorn.glogging.Logger.access logs: the format, and the atoms as a mapping.
    atoms = {"r": REQUEST_LINE.format(token=token), "U": f"/orders/view/{token}/status.json", "s": "200"}
    logging.getLogger("gunicorn.access").info("%(r)s %(U)s %(s)s", atoms)

    assert token not in caplog.text
    assert caplog.text.count("/orders/view/[redacted]") == 2
