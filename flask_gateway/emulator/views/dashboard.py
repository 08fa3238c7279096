"""(being written)"""

from flask import Blueprint

bp = Blueprint("emulator_dashboard", __name__)
