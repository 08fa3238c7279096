"""(being written) The admin screens."""

from flask import Blueprint

bp = Blueprint("gateway_admin", __name__, template_folder="../templates")
