"""(being written)"""

from flask import Blueprint

bp = Blueprint("emulator_deliveries", __name__)
