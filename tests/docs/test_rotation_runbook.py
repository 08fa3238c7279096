"""docs/operations.md's "Rotating SECRET_KEY and GATEWAY_ENCRYPTION_KEY", followed as an owner would (#37).

The page's app factory (``myshop/__init__.py``, as written there) in a project folder, its environment file
(``/etc/shop/environment``, a temporary file here) naming a SQLite database and the embedded emulator, and
the gateway installed from the command line under the old ``SECRET_KEY``. Then the runbook's blocks in
order: each ```ini block is what the file says about the keys from then on (its placeholders the test's
keys), each command of a ```sh block is run as a real ``flask`` process with only the file's path
rewritten (a restart restarts nothing here: every command is a new process), and the ```text block's lines
are what they print. The doctor before the command, and ``check-settings`` (a call signed with the stored
signing key) once the old key is gone, show that nothing was lost. Then the ``GATEWAY_ENCRYPTION_KEY``
paragraph, from the key derived from ``SECRET_KEY`` (docs/troubleshooting.md's recipe, run as written) to
a Fernet key of its own.
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.fernet import Fernet

from flask_gateway.operations.cli import ENVIRONMENT_FILE
from tests.conftest import Databases
from tests.docs.steps import section
from tests.processes import WAIT_DEADLINE

ROOT = Path(__file__).resolve().parents[2]
OPERATIONS = ROOT / "docs" / "operations.md"
TROUBLESHOOTING = ROOT / "docs" / "troubleshooting.md"
BIN = Path(sys.executable).parent
HEADING = "Rotating `SECRET_KEY` and `GATEWAY_ENCRYPTION_KEY`"
_FACTORY = re.compile(r"```python\n(# myshop/__init__\.py\n.*?)```", flags=re.DOTALL)
_FENCE = re.compile(r"^```(\w+)\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
#: A command that has not ended by then is stuck.
STUCK = 4 * WAIT_DEADLINE
OLD, NEW = secrets.token_hex(32), secrets.token_hex(32)


@dataclass
class Site:
    project: Path
    environment_file: Path
    #: The file's lines that are not about the keys.
    base: dict[str, str]
    keys: dict[str, str] = field(default_factory=dict)
    said: list[tuple[str, subprocess.CompletedProcess[str]]] = field(default_factory=list)

    def write(self) -> None:
        values = {**self.base, **self.keys}
        self.environment_file.write_text("".join(f"{name}={value}\n" for name, value in values.items()))

    def flask(self, line: str) -> subprocess.CompletedProcess[str]:
        """A documented ``flask --env-file /etc/shop/environment ...`` line, only the file's path changed."""
        assert line.startswith(f"flask --env-file {ENVIRONMENT_FILE} --app myshop gateway "), line
        argv = line.replace(ENVIRONMENT_FILE, str(self.environment_file)).split()
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("FLASK_", "GATEWAY_", "EMULATOR_", "SHOP_"))
        }
        env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
        env["GATEWAY_INSTALL_API_KEY"] = "demo-api-key"
        try:
            done = subprocess.run(
                [str(BIN / "flask"), *argv[1:]],
                cwd=self.project,
                env=env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=STUCK,
                check=False,
            )
        except subprocess.TimeoutExpired as stuck:
            raise AssertionError(f"{line} did not end within {STUCK:.0f} s") from stuck
        output = done.stdout + done.stderr
        assert "Traceback (most recent call last)" not in output, output
        for key in (OLD, NEW):
            assert key not in output, f"{line} showed a key"
        self.said.append((line, done))
        return done

    def gateway(self, words: str) -> subprocess.CompletedProcess[str]:
        return self.flask(f"flask --env-file {ENVIRONMENT_FILE} --app myshop gateway {words}")


def blocks() -> list[tuple[str, str]]:
    """The runbook's fenced blocks, in order: (language, text)."""
    return _FENCE.findall(section(OPERATIONS.read_text(encoding="utf-8"), HEADING))


def ini_keys(block: str) -> dict[str, str]:
    """What an ```ini block says about the keys, its placeholders the test's keys."""
    values = {}
    for line in block.splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, value = line.partition("=")
            values[name] = value.replace("<the new key>", NEW).replace("<the old key>", OLD)
    return values


def flat(text: str) -> str:
    return " ".join(text.split())


def make_site(tmp_path: Path, databases: Databases) -> Site:
    project = tmp_path / "srv" / "shop"
    (project / "myshop").mkdir(parents=True)
    ((factory,),) = [_FACTORY.findall(OPERATIONS.read_text(encoding="utf-8"))]
    (project / "myshop" / "__init__.py").write_text(factory)
    environment_file = tmp_path / "etc" / "shop" / "environment"
    environment_file.parent.mkdir(parents=True)
    base = {"SHOP_DATABASE_URL": databases.url("shop"), "GATEWAY_ENVIRONMENT": "embedded"}
    return Site(project, environment_file, base, keys={"SHOP_SECRET_KEY": OLD})


def test_the_runbook_rotates_secret_key_and_then_gateway_encryption_key(
    tmp_path: Path, databases: Databases
) -> None:
    site = make_site(tmp_path, databases)
    site.write()
    assert site.gateway("init-db").returncode == 0
    installed = site.gateway("install --account demo-merchant --minimum-cents 100 --maximum-cents 1000000")
    assert installed.returncode == 0, installed.stdout + installed.stderr

    found = blocks()
    kinds = [kind for kind, _ in found]
    assert kinds == ["ini", "sh", "text", "ini", "sh"], kinds
    (_, during), (_, first_commands), (_, expected), (_, after), (_, last_commands) = found

    # During: the new key, the old one beside it; the doctor counts what still needs the old one.
    site.keys = ini_keys(during)
    assert site.keys == {"SHOP_SECRET_KEY": NEW, "SHOP_SECRET_KEY_FALLBACKS": OLD}
    site.write()
    before = site.gateway("doctor")
    assert (
        "[warn] installation: 2 stored secrets still need an older key: run flask gateway rotate-secrets, "
        "then drop it from SECRET_KEY_FALLBACKS." in flat(before.stdout)
    ), before.stdout
    outputs = run_block(site, first_commands)
    rotated, doctor = outputs["rotate-secrets"], outputs["doctor"]
    assert rotated.returncode == 0, rotated.stdout + rotated.stderr
    said, ok = expected.strip().splitlines()
    assert rotated.stdout.splitlines()[0] == said
    wanted = ok.split("; ")[-1]  # the page elides the account's own details
    assert wanted == "no stored secret needs an older key of SECRET_KEY_FALLBACKS any more"
    assert wanted in flat(doctor.stdout), doctor.stdout
    assert "still need an older key" not in flat(doctor.stdout)
    again = site.gateway("rotate-secrets")
    assert again.stdout.startswith("Re-encrypted 0 of 2 stored secrets"), again.stdout

    # After: the old key dropped; the stored secrets read with the new one alone.
    site.keys = ini_keys(after)
    assert site.keys == {"SHOP_SECRET_KEY": NEW}
    site.write()
    doctor = run_block(site, last_commands)["doctor"]
    assert "installation:" in doctor.stdout
    assert "cannot be decrypted" not in doctor.stdout and "older key" not in doctor.stdout, doctor.stdout
    settings = site.gateway("check-settings --no-repair")  # signed with the stored signing key
    assert settings.returncode == 0, settings.stdout + settings.stderr

    # GATEWAY_ENCRYPTION_KEY: from the key derived from SECRET_KEY (troubleshooting.md's recipe) to its own.
    derived = derived_key(NEW)
    fernet = Fernet.generate_key().decode()
    site.base["GATEWAY_ENCRYPTION_KEY"] = f"{fernet},{derived}"
    site.write()
    counted = site.gateway("doctor")
    assert (
        "2 stored secrets still need an older key: run flask gateway rotate-secrets, then drop it from "
        "GATEWAY_ENCRYPTION_KEY." in flat(counted.stdout)
    ), counted.stdout
    moved = site.gateway("rotate-secrets")
    assert moved.stdout.splitlines()[:2] == [
        "Re-encrypted 2 of 2 stored secrets under the current key; none still needs an older key.",
        "GATEWAY_ENCRYPTION_KEY's older keys are no longer needed: keep only its first key, then restart "
        "every process (docs/operations.md#rotating-secret_key-and-gateway_encryption_key).",
    ], moved.stdout
    assert "no stored secret needs an older key of GATEWAY_ENCRYPTION_KEY any more" in flat(
        site.gateway("doctor").stdout
    )
    site.base["GATEWAY_ENCRYPTION_KEY"] = fernet
    site.keys = {"SHOP_SECRET_KEY": secrets.token_hex(32)}  # SECRET_KEY now protects no stored secret
    site.write()
    settings = site.gateway("check-settings --no-repair")
    assert settings.returncode == 0, settings.stdout + settings.stderr
    for line, done in site.said:
        for key in (fernet, derived):
            assert key not in done.stdout + done.stderr, f"{line} showed a key"


def run_block(site: Site, block: str) -> dict[str, subprocess.CompletedProcess[str]]:
    """Each command of a ```sh block, by its ``gateway`` subcommand; a restart restarts nothing here."""
    ran = {}
    for raw in block.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("sudo systemctl restart "):
            continue  # every command below is a new process, with the file as it is now
        done = site.flask(line)
        ran[line.split(" gateway ", 1)[1].split()[0]] = done
    assert ran, block
    return ran


def derived_key(secret_key: str) -> str:
    """docs/troubleshooting.md's recipe, run as written with ``old`` set to ``secret_key``."""
    page = TROUBLESHOOTING.read_text(encoding="utf-8")
    (recipe,) = [
        body
        for kind, body in _FENCE.findall(section(page, "`SecretUnreadable` after changing `SECRET_KEY`"))
        if kind == "python"
    ]
    code = re.sub(r'^old = b".*"$', f"old = {secret_key.encode()!r}", recipe, count=1, flags=re.MULTILINE)
    assert code != recipe
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=STUCK, check=True
    )
    return done.stdout.strip()
