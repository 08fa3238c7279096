"""(being written)"""

from flask import Blueprint

bp = Blueprint("emulator_hosted", __name__)
