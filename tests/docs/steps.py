"""The steps a page of the docs asks a reader to take, in order: files to save and commands to type.

- a fenced block whose info string names a file (```` ```python title="shop.py" ````) is a file to save;
- a ```` ```console ```` block holds commands, each line starting with ``$ ``; the lines under a command are
  its output, as the page shows it;
- every other block is illustration and is not a step.

Tests run the steps as a newcomer would: the files written to an empty folder, the commands typed into a
shell there (``source .venv/bin/activate`` included), servers (``flask ... run``) started in the background.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Command", "File", "section", "steps"]

_FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
_TITLE = re.compile(r'title="([^"]+)"')


@dataclass(frozen=True)
class File:
    name: str
    text: str


@dataclass(frozen=True)
class Command:
    line: str
    #: The lines the page shows under the command (its output, as a reader expects to see it).
    output: tuple[str, ...] = ()

    @property
    def argv(self) -> list[str]:
        return shlex.split(self.line, comments=True)

    @property
    def is_server(self) -> bool:
        """``flask ... run`` (and ``python -m flask ... run``): it runs until stopped."""
        argv = self.argv
        return bool(argv) and "flask" in argv[:3] and "run" in argv

    @property
    def activates(self) -> str | None:
        """The virtualenv ``source .venv/bin/activate`` (or ``. .venv/bin/activate``) activates."""
        argv = self.argv
        if len(argv) == 2 and argv[0] in {"source", "."} and argv[1].endswith("/bin/activate"):
            return argv[1].removesuffix("/bin/activate")
        return None


def section(page: str, heading: str) -> str:
    """The text of ``## heading`` up to the next heading of the same level."""
    match = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", page, flags=re.MULTILINE | re.DOTALL)
    assert match, f"no section {heading!r}"
    return match.group(1)


def steps(text: str) -> list[File | Command]:
    found: list[File | Command] = []
    for info, body in _FENCE.findall(text):
        title = _TITLE.search(info)
        if title:
            found.append(File(Path(title.group(1)).as_posix(), body))
        elif info.strip().split(" ")[0] == "console":
            found.extend(_commands(body))
    return found


def _commands(block: str) -> list[Command]:
    commands: list[Command] = []
    for line in block.splitlines():
        if line.startswith("$ "):
            commands.append(Command(line[2:].strip()))
        elif commands and line.strip():
            last = commands[-1]
            commands[-1] = Command(last.line, (*last.output, line.strip()))
    return commands
