"""A pytest plugin: no secret may appear in any log line of the whole test run.

- **Secrets.** Every secret the code handles is recorded as it appears: whatever goes into
  ``flask_gateway.secrets.SecretBox.encrypt`` (the API keys and signing keys the extension stores), every
  signing key the emulator issues (``new_signing_key`` in ``flask_gateway.emulator.views.v2``), and
  the known test credentials (``KNOWN_SECRETS``). Each is looked for as it is, in base64 and urlsafe
  base64 (with and without padding), and, for the known accounts, as an HTTP Basic credential.
- **Log lines.** A handler on the root logger at DEBUG keeps every record of every test (message and
  traceback), by test id; the project's own loggers (``flask_gateway``, ``example_shop``) are turned up to
  DEBUG so nothing they could say is dropped before it reaches the handler. The log files of the real
  server processes (``tests.processes.start_flask`` registers each with ``watch_file``) are read at the
  end too.
- **Verdict.** At the end of the session everything is scanned for every secret; any hit fails the run
  (exit status 1) with the test id, the logger and the form of the secret that was found. The secret
  itself is never printed (only its last 4 characters).

Registered by tests/conftest.py; ``tests/security/test_secret_watch.py`` plants a leak to prove it works.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import pytest

#: Credentials the tests use (tests/emulator/support.py, tests/extension/conftest.py, tests/e2e ...).
KNOWN_SECRETS: Final = ("demo-api-key", "fresh-api-key", "shop-secret-key-for-tests")
#: Accounts whose HTTP Basic credential (``account:key``) is looked for as well.
KNOWN_ACCOUNTS: Final = ("demo-merchant", "fresh-merchant")
#: Shorter strings are not treated as secrets (they would match by chance).
MIN_LENGTH: Final = 8
#: Loggers turned up to DEBUG for the run (third-party loggers keep their levels: SQL echo would
#: flood the run, and the emulator's own table keeps its keys in plain text by design).
PROJECT_LOGGERS: Final = ("flask_gateway", "example_shop")


def forms(secret: str) -> dict[str, str]:
    """The ways ``secret`` may be written into a log line: plain, base64, urlsafe base64, Basic."""
    raw = secret.encode("utf-8")
    found = {"plain": secret}
    for name, encode in (("base64", base64.b64encode), ("urlsafe-base64", base64.urlsafe_b64encode)):
        text = encode(raw).decode("ascii")
        found[name] = text
        found[f"{name} (unpadded)"] = text.rstrip("=")
    for account in KNOWN_ACCOUNTS:
        found[f"basic auth of {account}"] = base64.b64encode(f"{account}:{secret}".encode()).decode()
    return found


@dataclass
class Leak:
    where: str
    source: str
    form: str
    secret_tail: str

    def __str__(self) -> str:
        return f"{self.where}: {self.source} shows a secret (****{self.secret_tail}) as {self.form}"


@dataclass
class SecretWatch:
    """The secrets seen, the log lines captured, and the scan."""

    secrets: set[str] = field(default_factory=lambda: set(KNOWN_SECRETS))
    lines: list[tuple[str, str, str]] = field(default_factory=list)  # (test id, logger, text)
    files: list[tuple[str, Path]] = field(default_factory=list)  # (test id, log file)
    current: str = "(session)"

    def record_secret(self, secret: object) -> None:
        if isinstance(secret, str) and len(secret) >= MIN_LENGTH:
            self.secrets.add(secret)

    def record_line(self, logger: str, text: str) -> None:
        self.lines.append((self.current, logger, text))

    def watch_file(self, path: Path) -> None:
        self.files.append((self.current, path))

    def sources(self) -> Iterable[tuple[str, str, str]]:
        yield from self.lines
        for test_id, path in self.files:
            try:
                text = path.read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
            for line in text.splitlines():
                yield test_id, f"log file {path.name}", line

    def scan(self) -> list[Leak]:
        """Every (line, secret form) hit. Thousands of secrets: each form is indexed by its first
        ``MIN_LENGTH`` characters, so a line costs one dictionary lookup per position."""
        by_prefix: dict[str, list[tuple[str, str, str]]] = {}
        for secret in self.secrets:
            for name, text in forms(secret).items():
                if len(text) >= MIN_LENGTH:
                    by_prefix.setdefault(text[:MIN_LENGTH], []).append((text, name, secret[-4:]))
        leaks: list[Leak] = []
        for where, source, text in self.sources():
            for i in range(len(text) - MIN_LENGTH + 1):
                for form_text, name, tail in by_prefix.get(text[i : i + MIN_LENGTH], ()):
                    if text.startswith(form_text, i):
                        leaks.append(Leak(where=where, source=source, form=name, secret_tail=tail))
        return leaks

    def report(self, leaks: list[Leak]) -> str:
        shown = "\n".join(f"  {leak}" for leak in leaks[:50])
        more = f"\n  ... and {len(leaks) - 50} more" if len(leaks) > 50 else ""
        return f"SECRET LEAK: {len(leaks)} log line(s) contain a secret:\n{shown}{more}"


class _Capture(logging.Handler):
    def __init__(self, watch: SecretWatch) -> None:
        super().__init__(level=logging.DEBUG)
        self.watch = watch

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
        except Exception:  # a broken format string: keep the raw parts
            text = f"{record.msg!r} {record.args!r}"
        if record.exc_info and record.exc_info[1] is not None:
            text += "\n" + logging.Formatter().formatException(record.exc_info)
        if record.stack_info:
            text += "\n" + record.stack_info
        self.watch.record_line(record.name, text)


#: The watch of the running session (the wrappers below report to it).
active: SecretWatch | None = None


def _record(secret: object) -> None:
    if active is not None:
        active.record_secret(secret)


def _wrap_encrypt(original: Callable[..., str]) -> Callable[..., str]:
    def encrypt(self: Any, secret: str) -> str:
        _record(secret)
        return original(self, secret)

    encrypt.__wrapped__ = original  # type: ignore[attr-defined]
    return encrypt


def _wrap_new_key(original: Callable[[], str]) -> Callable[[], str]:
    """The emulator's key maker, recording each key it issues."""

    def new_signing_key() -> str:
        key = original()
        _record(key)
        return key

    return new_signing_key


class SecretWatchPlugin:
    def __init__(self, watch: SecretWatch) -> None:
        self.watch = watch
        self.handler = _Capture(watch)
        self.levels: dict[str, int] = {}
        self.patches: list[tuple[Any, str, Any]] = []
        #: Under pytest-xdist, on the controller: each worker's verdict (its leaks' report, its counts).
        self.worker_verdicts: list[dict[str, Any]] = []

    def _patch(self, owner: Any, name: str, value: Any) -> None:
        self.patches.append((owner, name, getattr(owner, name)))
        setattr(owner, name, value)

    @pytest.hookimpl
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        global active
        active = self.watch
        from flask_gateway.emulator.views import v2
        from flask_gateway.secrets import SecretBox

        self._patch(SecretBox, "encrypt", _wrap_encrypt(SecretBox.encrypt))
        self._patch(v2, "new_signing_key", _wrap_new_key(v2.new_signing_key))
        logging.getLogger().addHandler(self.handler)
        for name in PROJECT_LOGGERS:
            logger = logging.getLogger(name)
            self.levels[name] = logger.level
            if logger.level == logging.NOTSET or logger.level > logging.DEBUG:
                logger.setLevel(logging.DEBUG)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> Any:
        self.watch.current = item.nodeid
        try:
            return (yield)
        finally:
            self.watch.current = "(session)"

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        global active
        logging.getLogger().removeHandler(self.handler)
        for name, level in self.levels.items():
            logging.getLogger(name).setLevel(level)
        for owner, name, value in reversed(self.patches):
            setattr(owner, name, value)
        active = None
        leaks = self.watch.scan()
        message = self.watch.report(leaks) if leaks else None
        counts = (len(self.watch.secrets), len(self.watch.lines), len(self.watch.files))
        worker_output = getattr(session.config, "workeroutput", None)
        if worker_output is not None:
            # A pytest-xdist worker: its verdict goes to the controller (pytest_testnodedown below), whose
            # exit status is the run's; a worker's own exit status is not.
            worker_output["secret_watch"] = {"leaks": message, "counts": counts}
        else:
            for verdict in self.worker_verdicts:
                counts = tuple(a + b for a, b in zip(counts, verdict["counts"], strict=True))
                if verdict["leaks"]:
                    message = "\n".join(filter(None, (message, verdict["leaks"])))
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if message:
            if reporter is not None:
                reporter.write_sep("=", "secret watch", red=True, bold=True)
                reporter.write_line(message)
            else:
                print(message)  # noqa: T201 - no terminal reporter (e.g. -p no:terminal)
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        elif reporter is not None:
            reporter.write_sep(
                "-",
                f"secret watch: {counts[0]} secrets, {counts[1]} log records, {counts[2]} server log files"
                + (f" ({len(self.worker_verdicts)} workers)" if self.worker_verdicts else "")
                + ": no secret found",
            )

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: object) -> None:
        """pytest-xdist's controller: a worker ended; keep its verdict for the session's end. A worker
        that died without one is an error of the run already (xdist reports it)."""
        verdict = getattr(node, "workeroutput", {}).get("secret_watch")
        if verdict is not None:
            self.worker_verdicts.append(verdict)


def watch_file(path: Path) -> None:
    """Scan ``path`` (a server's log file) at the end of the session."""
    if active is not None:
        active.watch_file(path)


def register(config: pytest.Config) -> None:
    """Called from tests/conftest.py ``pytest_configure``."""
    if not config.pluginmanager.has_plugin("secret-watch"):
        config.pluginmanager.register(SecretWatchPlugin(SecretWatch()), "secret-watch")
