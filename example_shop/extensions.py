"""The shop's extension objects, created once and bound to each app in ``create_app``."""

from __future__ import annotations

import logging
from contextlib import suppress

from flask_limiter import Limiter
from flask_limiter.util import get_remote_address
from flask_sqlalchemy import SQLAlchemy
from flask_wtf.csrf import CSRFProtect
from sqlalchemy.exc import SQLAlchemyError

from flask_gateway import Gateway

__all__ = ["SafeTeardownSQLAlchemy", "csrf", "db", "gateway", "limiter"]

log = logging.getLogger("example_shop.extensions")


class SafeTeardownSQLAlchemy(SQLAlchemy):
    """Flask-SQLAlchemy whose end-of-request cleanup never raises.

    Flask-SQLAlchemy ends every app context with ``session.remove()``, which rolls back an open
    transaction. When the database restarted during the request, that rollback runs on a connection the
    restart killed and raises; an error in a teardown escapes Flask's error handling altogether (the server
    answers a bare 500 and logs a traceback, gunicorn's "500 POST None"). The request has been answered by
    then, and the connection is invalidated by the failed rollback (the pool replaces it), so the error is
    only worth a DEBUG line; the scoped session is cleared all the same, so the next request in this thread
    starts with a fresh session.
    """

    def _teardown_session(self, exc: BaseException | None) -> None:
        try:
            self.session.remove()
        except SQLAlchemyError as error:
            log.debug("the session's rollback at the end of the request failed: %s", error.__class__.__name__)
            registry = self.session.registry
            if registry.has():
                with suppress(SQLAlchemyError):
                    registry().invalidate()  # its connections are not handed out again
            registry.clear()


db = SafeTeardownSQLAlchemy()
csrf = CSRFProtect()
gateway = Gateway()
#: Per-client rate limits (the login form); its storage is ``RATELIMIT_STORAGE_URI`` (the shop's database
#: by default, shared by every worker: ``SHOP_RATELIMIT_STORAGE_URI`` chooses Redis or memcached).
limiter = Limiter(get_remote_address)
