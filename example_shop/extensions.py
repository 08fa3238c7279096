"""The shop's extension objects, created once and bound to each app in ``create_app``."""

from __future__ import annotations

from flask_limiter import Limiter
from flask_limiter.util import get_remote_address
from flask_sqlalchemy import SQLAlchemy
from flask_wtf.csrf import CSRFProtect

from flask_gateway import Gateway

__all__ = ["csrf", "db", "gateway", "limiter"]

db = SQLAlchemy()
csrf = CSRFProtect()
gateway = Gateway()
#: Per-client rate limits (the login form); its storage is ``RATELIMIT_STORAGE_URI`` (the shop's database
#: by default, shared by every worker: ``SHOP_RATELIMIT_STORAGE_URI`` chooses Redis or memcached).
limiter = Limiter(get_remote_address)
