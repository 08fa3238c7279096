"""Keep private links out of the server's access log.

An order link (``/orders/view/<token>``) is the shopper's key to the order, and a v1 outcome URL's ``ref``
with the order ``token`` is what the gateway uses to report a payment: neither belongs in a log that
operators, log shippers and support tools read. :class:`RedactPrivateLinks` rewrites them in the request
lines of werkzeug's development server (``flask run``, ``make demo``) and of gunicorn's access log; the
shop installs it on both loggers (``create_app``).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any, Final

__all__ = ["ACCESS_LOGGERS", "RedactPrivateLinks", "install", "redact"]

#: The loggers of the servers' request lines.
ACCESS_LOGGERS: Final = ("werkzeug", "gunicorn.access")
_ORDER_LINK: Final = re.compile(r"(/orders/view/)[^/\s?\"#]+")
_SECRET_QUERY: Final = re.compile(r"([?&](?:ref|token)=)[^&\s\"#]+")


def redact(text: str) -> str:
    """``text`` with order-link tokens and ``ref``/``token`` query values replaced by ``[redacted]``."""
    return _SECRET_QUERY.sub(r"\1[redacted]", _ORDER_LINK.sub(r"\1[redacted]", text))


def _clean(value: Any) -> Any:
    return redact(value) if isinstance(value, str) else value


class RedactPrivateLinks(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        if isinstance(record.args, Mapping):  # gunicorn: the access log format's atoms
            record.args = {key: _clean(value) for key, value in record.args.items()}
        elif isinstance(record.args, tuple):  # werkzeug: the request line among the arguments
            record.args = tuple(_clean(value) for value in record.args)
        return True


_FILTER: Final = RedactPrivateLinks()


def install() -> None:
    """Add the filter to the access loggers (once)."""
    for name in ACCESS_LOGGERS:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
