"""``flask gateway ...`` through a test runner that keeps stderr apart from stdout, on every click.

Every command prints one line to stderr first (what it uses: the database, the gateway, the account),
so a test reads a command's own answer from ``result.stdout`` and that line from ``result.stderr``.
click 8.1 mixes the two unless told (``mix_stderr=False``); click 8.2 and later always keep them apart
(``result.output`` is then both, interleaved) and no longer take the argument.
"""

from __future__ import annotations

from typing import Any

from click.testing import Result
from flask import Flask
from flask.testing import FlaskCliRunner


def cli_runner(app: Flask) -> FlaskCliRunner:
    try:
        return app.test_cli_runner(mix_stderr=False)
    except TypeError:  # click >= 8.2: stderr is always kept apart
        return app.test_cli_runner()


def run_gateway(app: Flask, *args: str, **kwargs: Any) -> Result:
    """``flask gateway ARGS`` in ``app``."""
    return cli_runner(app).invoke(args=["gateway", *args], **kwargs)
