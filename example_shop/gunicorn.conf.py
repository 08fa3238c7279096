"""gunicorn's settings for the example shop (docs/example-shop.md, "Deploying it").

Run from the project folder (the one holding ``example_shop/``), with the shop's environment loaded::

    gunicorn -c example_shop/gunicorn.conf.py example_shop.wsgi:app

Everything comes from the environment (command-line options still win, e.g. ``--bind``):

- ``SHOP_BIND``: where to listen, ``127.0.0.1:8000`` by default (behind the TLS proxy); several addresses
  separated by commas; ``unix:/run/shop/gunicorn.sock`` for a socket.
- ``SHOP_WORKERS``: worker processes, by default twice the CPUs plus one, at most 8.
- ``SHOP_THREADS``: threads per worker, 4 by default (gunicorn's ``gthread`` worker: the order page polls
  its status about once a second, which a worker of one thread would spend its time on).
- ``SHOP_LOG_FORMAT``: ``text`` (default: ``time level [pid] logger: message``, one line each) or ``json``
  (one JSON object a line with the same fields; needs ``pip install python-json-logger``). gunicorn's own
  lines, its access log and the app's (``example_shop``, ``flask_gateway``) share it, INFO and up, on
  stderr.
- ``PROMETHEUS_MULTIPROC_DIR``: prometheus_client's multiprocess mode (docs/operations.md), for the
  gateway-call metrics of every worker in one scrape. The folder's ``*.db`` files are removed when the
  server starts (the counts of a previous run are not this one's), and a worker that exits is marked dead.
  It must be in the environment before gunicorn starts (prometheus_client reads it at import).

This file imports nothing of the shop: gunicorn reads it before it loads the app (and before it puts the
project folder on ``sys.path``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def _count(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        number = int(raw)
    except ValueError:
        number = 0
    if number < 1:
        raise RuntimeError(f"{name}={raw!r}: give a whole number, 1 or more (e.g. {name}=4).")
    return number


def _log_format() -> str:
    raw = os.environ.get("SHOP_LOG_FORMAT", "")
    value = raw.strip().lower() or "text"
    if value not in ("text", "json"):
        raise RuntimeError(f"SHOP_LOG_FORMAT={raw!r}: use 'text' or 'json'.")
    if value == "json":
        try:
            import pythonjsonlogger.json  # noqa: F401
        except ImportError:
            raise RuntimeError(
                "SHOP_LOG_FORMAT=json needs python-json-logger 3.1 or later: pip install python-json-logger "
                "(or set SHOP_LOG_FORMAT=text)."
            ) from None
    return value


bind = [part.strip() for part in os.environ.get("SHOP_BIND", "127.0.0.1:8000").split(",") if part.strip()]
workers = _count("SHOP_WORKERS", min(2 * (os.cpu_count() or 1) + 1, 8))
threads = _count("SHOP_THREADS", 4)

_FIELDS = "%(asctime)s %(levelname)s [%(process)d] %(name)s: %(message)s"
_FORMATTERS: dict[str, dict[str, Any]] = {
    "text": {"format": _FIELDS},
    # The same fields as JSON keys: time, level, process, logger and message.
    "json": {
        "()": "pythonjsonlogger.json.JsonFormatter",
        "fmt": "%(asctime)s %(levelname)s %(process)d %(name)s %(message)s",
        "rename_fields": {"asctime": "time", "levelname": "level", "name": "logger"},
    },
}

#: One handler (stderr) and one format for gunicorn's lines, its access log and the app's; INFO kept
#: (docs/logging.md, "Under gunicorn").
logconfig_dict: dict[str, Any] = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"shop": _FORMATTERS[_log_format()]},
    "handlers": {
        "stderr": {"class": "logging.StreamHandler", "formatter": "shop", "stream": "ext://sys.stderr"}
    },
    "root": {"level": "INFO", "handlers": ["stderr"]},
    "loggers": {
        "gunicorn.error": {"level": "INFO", "handlers": ["stderr"], "propagate": False},
        "gunicorn.access": {"level": "INFO", "handlers": ["stderr"], "propagate": False},
        "flask_gateway": {"level": "INFO"},
    },
}


def _multiprocess_dir() -> Path | None:
    folder = os.environ.get("PROMETHEUS_MULTIPROC_DIR", "").strip()
    return Path(folder) if folder else None


def on_starting(server: Any) -> None:
    """Before the workers start: the multiprocess metrics folder, emptied of a previous run's files."""
    folder = _multiprocess_dir()
    if folder is None:
        return
    try:
        import prometheus_client.multiprocess  # noqa: F401
    except ImportError:
        raise RuntimeError(
            "PROMETHEUS_MULTIPROC_DIR is set but prometheus_client is missing: pip install "
            '"flask-bnpl-gateway[metrics]" (or unset PROMETHEUS_MULTIPROC_DIR).'
        ) from None
    folder.mkdir(parents=True, exist_ok=True)
    # Only prometheus_client's files: the folder may be shared with something else by mistake.
    stale = sorted(folder.glob("*.db"))
    for path in stale:
        path.unlink(missing_ok=True)
    server.log.info("metrics: multiprocess folder %s ready (%d old file(s) removed)", folder, len(stale))


def child_exit(server: Any, worker: Any) -> None:
    """A worker exited (restart, crash, scale down): its live gauges leave the scrape."""
    if _multiprocess_dir() is None:
        return
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)  # type: ignore[no-untyped-call]
