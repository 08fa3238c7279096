"""The session-wide secret watch (tests/secret_watch.py) catches a planted leak, and sees the secrets."""

from __future__ import annotations

import base64
import logging
import os
import secrets
from pathlib import Path

import pytest

from flask_gateway.secrets import SecretBox
from tests import secret_watch
from tests.emulator.conftest import make_emulator
from tests.emulator.support import Gateway
from tests.secret_watch import SecretWatch

ROOT = Path(__file__).resolve().parents[2]


def test_the_scan_finds_each_form_of_a_secret_and_nothing_else(tmp_path: Path) -> None:
    watch = SecretWatch()
    secret = "planted-signing-key-" + secrets.token_hex(8)
    watch.record_secret(secret)
    watch.record_secret("short")  # too short to be told apart from ordinary words: not a secret
    raw = secret.encode()
    planted = {
        "plain": f"installed with key {secret}",
        "base64": "header " + base64.b64encode(raw).decode(),
        "urlsafe-base64 (unpadded)": base64.urlsafe_b64encode(raw).decode().rstrip("="),
        "basic auth of demo-merchant": "Authorization: Basic "
        + base64.b64encode(f"demo-merchant:{secret}".encode()).decode(),
    }
    for test_id, text in planted.items():
        watch.current = test_id
        watch.record_line("flask_gateway.client", text)
    watch.current = "tests/x.py::test_clean"
    watch.record_line("flask_gateway.client", f"key ****{secret[-4:]}, short, demo-merchant")
    log_file = tmp_path / "server.log"
    log_file.write_text(f"line one\nGET /?k={secret} 200\n")
    watch.current = "tests/x.py::test_server"
    watch.watch_file(log_file)

    leaks = watch.scan()

    found = {(leak.where, leak.form) for leak in leaks}
    assert found >= {(name, name) for name in planted if name != "urlsafe-base64 (unpadded)"}
    assert any(leak.where == "urlsafe-base64 (unpadded)" for leak in leaks)
    assert ("tests/x.py::test_server", "plain") in found
    assert not [leak for leak in leaks if leak.where == "tests/x.py::test_clean"]
    report = watch.report(leaks)
    assert "tests/x.py::test_server" in report and "log file server.log" in report
    assert secret not in report  # the report names the secret by its last 4 characters only


def test_the_session_watch_sees_the_secrets_the_code_handles(database_url: str) -> None:
    """The wiring: what the extension encrypts and the keys the emulator issues are recorded."""
    watch = secret_watch.active
    assert watch is not None, "tests/conftest.py registers the watch for every session"
    api_key = "api-key-" + secrets.token_hex(8)
    SecretBox(None, "k" * 32).encrypt(api_key)
    assert api_key in watch.secrets
    emulator = make_emulator(database_url)
    signing_key = Gateway(emulator.test_client()).install()
    assert signing_key in watch.secrets
    assert {"demo-api-key", "shop-secret-key-for-tests"} <= watch.secrets
    # Log records of the project's loggers reach the watch, DEBUG included.
    logging.getLogger("flask_gateway.test").debug("a harmless line %s", "xyz-marker")
    assert watch.lines[-1][1:] == ("flask_gateway.test", "a harmless line xyz-marker")
    assert watch.lines[-1][0].endswith(
        "test_the_session_watch_sees_the_secrets_the_code_handles["
        + ("sqlite]" if database_url.startswith("sqlite") else "postgresql]")
    )


PLANTED_CONFTEST = """
from tests import secret_watch

def pytest_configure(config):
    secret_watch.register(config)
"""

PLANTED_TESTS = """
import logging
from flask_gateway.secrets import SecretBox

def test_clean():
    logging.getLogger("flask_gateway.x").info("nothing to see")

def test_leaky():
    SecretBox(None, "k" * 32).encrypt("the-planted-api-key-1234")
    logging.getLogger("flask_gateway.x").debug("sending with key the-planted-api-key-1234")
"""


@pytest.mark.parametrize("workers", [(), ("-n", "2")], ids=["one-process", "xdist-workers"])
@pytest.mark.parametrize("leak", [True, False], ids=["planted-leak", "clean"])
def test_a_session_with_a_leak_fails_with_the_test_id(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, leak: bool, workers: tuple[str, ...]
) -> None:
    """Under pytest-xdist (the README's ``make test``) the leak is found in a worker, and the controller,
    whose exit status is the run's, fails the run."""
    pytester.makeconftest(PLANTED_CONFTEST)
    tests = PLANTED_TESTS if leak else PLANTED_TESTS.replace("with key the-planted", "with key ****")
    pytester.makepyfile(test_planted=tests)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-W", "error", *workers)
    if leak:
        assert result.ret == pytest.ExitCode.TESTS_FAILED
        result.stdout.fnmatch_lines(
            [
                "*SECRET LEAK: 1 log line(s) contain a secret:*",
                "*test_planted.py::test_leaky: flask_gateway.x shows a secret (****1234) as plain*",
            ]
        )
        assert "the-planted-api-key-1234" not in result.stdout.str()
    else:
        assert result.ret == pytest.ExitCode.OK
        assert "SECRET LEAK" not in result.stdout.str()
        result.stdout.fnmatch_lines(
            [
                "*secret watch: * secrets, * log records, * server log files*"
                + ("(2 workers)*" if workers else "")
            ]
        )
    result.assert_outcomes(passed=2)
