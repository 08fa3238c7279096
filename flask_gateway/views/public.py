"""(being written) The gateway-facing endpoints: callback, v1 success/fail, return pages."""

from flask import Blueprint

bp = Blueprint("gateway", __name__)
