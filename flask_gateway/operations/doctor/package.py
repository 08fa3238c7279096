"""The ``package`` check: ``flask-bnpl-gateway`` is the only installed distribution that provides
``flask_gateway``, at the version that runs.
"""

from __future__ import annotations

import importlib.metadata
import re
from contextlib import suppress
from typing import Final

from flask_gateway._version import DISTRIBUTION, __version__
from flask_gateway.operations.doctor.report import Finding, Options

# --- the installed distribution ---------------------------------------------------------------------------

_DOCS_TWO: Final = "docs/packaging.md#two-distributions-one-flask_gateway"


def _normalised(name: str) -> str:
    """A distribution's name as the index compares names (PEP 503): ``Flask_Gateway`` is ``flask-gateway``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _providers(package: str = "flask_gateway") -> dict[str, importlib.metadata.Distribution]:
    """The installed distributions that put ``package`` on ``sys.path``, by normalised name (their
    ``top_level.txt``, or the files of their ``RECORD``)."""
    found = {}
    for name in importlib.metadata.packages_distributions().get(package, []):
        with suppress(importlib.metadata.PackageNotFoundError):
            distribution = importlib.metadata.distribution(name)
            found[_normalised(distribution.name)] = distribution
    return found


def check_package(_options: Options) -> list[Finding]:
    """No other installed distribution provides ``flask_gateway`` (the index's ``flask-gateway`` is an
    unrelated project whose wheel does), and the installed metadata is the version that runs."""
    name = "package"
    providers = _providers()
    findings = []
    for other, distribution in sorted(providers.items()):
        if other == DISTRIBUTION:
            continue
        summary = next(iter(distribution.metadata.get_all("Summary") or []), "no summary")
        findings.append(
            Finding(
                name,
                "problem",
                f"{distribution.name} {distribution.version} ({summary!r}) is installed too and puts its own "
                f"flask_gateway package in the same place as {DISTRIBUTION}: the files of one overwrite the "
                "other's, and uninstalling either deletes files the other needs",
                f"pip uninstall {other} {DISTRIBUTION}, then pip install {DISTRIBUTION} ({_DOCS_TWO})",
            )
        )
    ours = providers.get(DISTRIBUTION)
    if ours is None:
        findings.append(
            Finding(
                name,
                "unknown",
                f"flask_gateway {__version__} runs, but no installed {DISTRIBUTION} provides it (a copy on "
                "sys.path?): which release this is cannot be told",
                f"pip install {DISTRIBUTION} ({_DOCS_TWO})",
            )
        )
    elif ours.version != __version__:
        findings.append(
            Finding(
                name,
                "problem",
                f"the installed {DISTRIBUTION} says {ours.version}, but the flask_gateway that runs is "
                f"{__version__}: the files of two installs are mixed",
                f"pip install --force-reinstall {DISTRIBUTION}=={ours.version} ({_DOCS_TWO})",
            )
        )
    elif not findings:
        findings.append(
            Finding(
                name, "ok", f"{DISTRIBUTION} {__version__}, the only installed distribution of flask_gateway"
            )
        )
    return findings
