"""What a check gets and what it finds: :class:`Options` (the run's settings), :class:`Finding` (a check's
name, its :data:`Level`, what is true or wrong, and the fix) and :class:`DoctorReport`, the findings of a run
as the command prints and sums them up. Imports nothing of the doctor's.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field
from typing import Final, Literal

import requests

#: ``info``: nothing is wrong yet, but production will need it (a schedule that nothing runs in development),
#: with its command; never counted as a problem.
Level = Literal["ok", "info", "warn", "problem", "unknown"]


#: Seconds to wait for the shop's public URL (``--timeout``).
DEFAULT_TIMEOUT: Final = 10.0


_MARKS: Final[dict[Level, str]] = {
    "ok": "[ok]",
    "info": "[info]",
    "warn": "[warn]",
    "problem": "[PROBLEM]",
    "unknown": "[unknown]",
}


@dataclass(frozen=True)
class Finding:
    """One thing a check found: ``ok`` (true and fine), ``info`` (fine for now, production will need it:
    the command says how), ``warn`` (works, but should change), ``problem`` (breaks payments or callbacks:
    the command exits 1) or ``unknown`` (could not tell, or skipped)."""

    check: str
    level: Level
    #: What is true, or what is wrong and what it breaks.
    message: str
    #: How to fix it (a ``warn`` or ``problem``): the config key, the screen, the docs page.
    fix: str = ""

    @property
    def mark(self) -> str:
        return _MARKS[self.level]

    def lines(self, width: int = 100) -> list[str]:
        """The finding for a terminal: a marked line (wrapped), then its fix, indented under it."""
        indent = " " * 10
        wrap = textwrap.TextWrapper(
            width=width,
            subsequent_indent=indent,
            break_long_words=False,
            break_on_hyphens=False,
        )
        lines = wrap.wrap(f"{self.mark:<10}{self.check}: {self.message}")
        if self.fix and self.level != "ok":
            wrap.initial_indent = indent
            lines += wrap.wrap(f"fix: {self.fix}")
        return lines


@dataclass
class DoctorReport:
    #: Every finding of every check, in the order of :data:`CHECKS`.
    findings: list[Finding] = field(default_factory=list)

    @property
    def shown(self) -> list[Finding]:
        """What the command prints: per check, its findings that are not ``ok``; or, when all are, one
        ``ok`` line that says what was found fine."""
        shown: list[Finding] = []
        checks = list(dict.fromkeys(finding.check for finding in self.findings))
        for check in checks:
            mine = [finding for finding in self.findings if finding.check == check]
            trouble = [finding for finding in mine if finding.level != "ok"]
            shown += trouble or [Finding(check, "ok", "; ".join(finding.message for finding in mine))]
        return shown

    def count(self, level: Level) -> int:
        """How many of the printed lines (:attr:`shown`) have ``level``."""
        return sum(1 for finding in self.shown if finding.level == level)

    @property
    def ok(self) -> bool:
        """No problem (warnings and unknowns allowed)."""
        return not self.problems

    @property
    def problems(self) -> list[Finding]:
        return [finding for finding in self.findings if finding.level == "problem"]

    def summary(self) -> str:
        words: tuple[tuple[Level, str, str], ...] = (
            ("problem", "problem", "problems"),
            ("warn", "warning", "warnings"),
            ("ok", "ok", "ok"),
            ("info", "note for production", "notes for production"),
            ("unknown", "unknown", "unknown"),
        )
        counts = ", ".join(
            f"{n} {one if n == 1 else many}" for level, one, many in words if (n := self.count(level))
        )
        if self.ok:
            return f"No problem found ({counts})."
        return f"{counts}: fix the problems above, then run flask gateway doctor again."


@dataclass(frozen=True)
class Options:
    #: Seconds to wait for the shop's public URL.
    timeout: float = DEFAULT_TIMEOUT
    #: The HTTP session for the callback check (default: a new ``requests.Session``).
    http: requests.Session | None = None
