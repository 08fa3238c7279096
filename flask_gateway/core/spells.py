"""Spells of failure: a WARNING when one starts and one when it ends, never one per failure.

:class:`Spells` tracks, per key (``None`` for a single thing), whether it is failing, since when and how
many failures it counted; the callers word the two lines. Used by the database outage watch
(``core.outages``), the rate-limit storage (``operations.ratelimit``), the heartbeats
(``payments.heartbeats``) and the outbox's lease renewal (``payments.outbox``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["Spell", "Spells"]

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True)
class Spell:
    """A spell that just ended: how long it lasted (seconds) and the failures it counted."""

    seconds: float
    failures: int


class Spells(Generic[K]):
    """Failing spells per key, thread-safe; ``clock`` is a monotonic clock in seconds (tests replace it)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        #: key -> (when its spell started, failures counted in it)
        self._open: dict[K, tuple[float, int]] = {}

    def failing(self, key: K) -> bool:
        """True from the first failure of ``key`` until the next success."""
        return key in self._open

    def failures(self, key: K) -> int:
        """The failures counted in ``key``'s current spell (0 when it is not failing)."""
        spell = self._open.get(key)
        return spell[1] if spell is not None else 0

    def failed(self, key: K, *, count: int = 1) -> bool:
        """Count ``count`` failures of ``key``; True when this one started a spell (word the first line)."""
        with self._lock:
            spell = self._open.get(key)
            if spell is None:
                self._open[key] = (self._clock(), count)
                return True
            self._open[key] = (spell[0], spell[1] + count)
            return False

    def succeeded(self, key: K) -> Spell | None:
        """``key`` worked; the spell it ended (word the second line), or None when it was not failing."""
        if key not in self._open:  # the common case: no lock taken
            return None
        with self._lock:
            spell = self._open.pop(key, None)
        if spell is None:
            return None
        return Spell(self._clock() - spell[0], spell[1])
