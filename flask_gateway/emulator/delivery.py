"""Outbox delivery (being written): callbacks, v1 ABANDONED notices, failure e-mails, the worker."""

from __future__ import annotations

from flask import Flask

__all__ = ["run_due", "start_worker"]


def run_due(*, limit: int = 100) -> int:
    """Run every due delivery attempt now, synchronously; returns how many attempts were made."""
    return 0


def start_worker(app: Flask) -> None:
    """Start the background delivery thread of this server process."""
