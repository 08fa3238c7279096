"""docs/extension.md's "Several merchant accounts": its ``sh`` block typed as written, on the quickstart's own
shop (the embedded emulator, SQLite): the emulator told of the second account, then the second account
installed beside the first. Without the block's ``EMULATOR_ACCOUNTS`` the same install is refused, as the
page says."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.docs.steps import File, section, steps

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)


def _second_account_lines() -> list[str]:
    """The block's commands, continuation lines joined, but the server it starts (``flask ... run``)."""
    page = (DOCS / "extension.md").read_text(encoding="utf-8")
    [block] = [
        b for b in _blocks(section(page, "Several merchant accounts"), "sh") if "EMULATOR_ACCOUNTS" in b
    ]
    joined = block.replace("\\\n", " ")
    return [
        line.split("  #", 1)[0].strip()
        for line in joined.splitlines()
        if line.strip() and not line.lstrip().startswith("#") and not re.search(r"\bflask\b.*\brun\b", line)
    ]


def _quickstart_shop(folder: Path) -> None:
    page = (DOCS / "extension.md").read_text(encoding="utf-8")
    quickstart = section(page, "Quickstart: a paid order in one process")
    shop = next(s for s in steps(quickstart) if isinstance(s, File) and s.name == "shop.py")
    (folder / shop.name).write_text(shop.text, encoding="utf-8")


def _bash(folder: Path, script: str) -> subprocess.CompletedProcess[str]:
    # The project's interpreter first on PATH, as `source .venv/bin/activate` puts a venv's first.
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("EMULATOR_ACCOUNTS", None)
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


FIRST_ACCOUNT = (
    "flask --app shop init-db\n"
    "GATEWAY_INSTALL_API_KEY=demo-api-key flask --app shop gateway install --account demo-merchant "
    "--callback-url http://127.0.0.1:5000/gateway/callback --minimum-cents 100 --maximum-cents 1000000\n"
)


def test_the_second_account_block_installs_brand_b_beside_the_first(tmp_path: Path) -> None:
    lines = _second_account_lines()
    assert lines[0] == "export EMULATOR_ACCOUNTS=demo-merchant:demo-api-key,brand-b:brand-b-api-key"
    assert any("gateway install --account brand-b" in line for line in lines)
    _quickstart_shop(tmp_path)
    done = _bash(tmp_path, FIRST_ACCOUNT + "\n".join(lines) + "\nflask --app shop gateway accounts --json\n")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Installed merchant account brand-b (embedded)" in done.stdout
    assert '"brand-b"' in done.stdout and '"demo-merchant"' in done.stdout


def test_without_the_emulator_told_the_install_is_refused_as_the_page_says(tmp_path: Path) -> None:
    install = [line for line in _second_account_lines() if "gateway install --account brand-b" in line]
    _quickstart_shop(tmp_path)
    done = _bash(tmp_path, FIRST_ACCOUNT + install[0] + "\n")
    assert done.returncode != 0
    assert "the gateway refused the merchant account id or API key" in done.stderr + done.stdout
