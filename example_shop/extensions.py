"""The shop's extension objects, created once and bound to each app in ``create_app``."""

from __future__ import annotations

from flask_sqlalchemy import SQLAlchemy
from flask_wtf.csrf import CSRFProtect

from flask_gateway import Gateway

__all__ = ["csrf", "db", "gateway"]

db = SQLAlchemy()
csrf = CSRFProtect()
gateway = Gateway()
