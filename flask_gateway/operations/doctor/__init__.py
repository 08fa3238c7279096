"""``flask gateway doctor``: every check, one module per area, run in order by ``runner`` (its
docstring lists the checks). Imports run one way: ``runner`` -> ``configuration``, ``database``, ``gateway``,
``schedules``, ``package`` -> ``report``, ``wording``; the package imports services (floor 3) and below,
never the CLI, the views or the extension. The names below are the ones importers use.
"""

from __future__ import annotations

from flask_gateway.operations.doctor.database import probe_urls
from flask_gateway.operations.doctor.package import check_package
from flask_gateway.operations.doctor.report import DEFAULT_TIMEOUT, DoctorReport, Finding, Level, Options
from flask_gateway.operations.doctor.runner import CHECKS, Check, run_checks
from flask_gateway.operations.doctor.schedules import check_broker
from flask_gateway.operations.doctor.wording import USER_AGENT

__all__ = [
    "CHECKS",
    "DEFAULT_TIMEOUT",
    "USER_AGENT",
    "Check",
    "DoctorReport",
    "Finding",
    "Level",
    "Options",
    "check_broker",
    "check_package",
    "probe_urls",
    "run_checks",
]
