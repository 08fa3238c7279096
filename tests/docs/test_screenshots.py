"""The README's screenshots are never older than the screens they show (issue 36, point 9).

``scripts/take-screenshots.py`` takes them from a real run and writes ``docs/screenshots/sources.json``:
for each picture, the templates and stylesheets it shows with their SHA-256 then. A file changed since
means the picture shows an older screen. Contents, not modification times: a fresh clone gives every file
the time of the checkout.
"""

from __future__ import annotations

import hashlib
import json
import runpy
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "take-screenshots.py"
PICTURES = ROOT / "docs" / "screenshots"
SOURCES = PICTURES / "sources.json"
TAKE_AGAIN = 'take them again: .venv/bin/python scripts/take-screenshots.py (CONTRIBUTING.md, "Screenshots")'


@pytest.fixture(scope="module")
def shows() -> dict[str, tuple[str, ...]]:
    """The script's own list of what each screenshot shows."""
    script: dict[str, Any] = runpy.run_path(str(SCRIPT), run_name="screenshots")
    listed: dict[str, tuple[str, ...]] = script["SHOWS"]
    return listed


def stale(manifest: dict[str, dict[str, str]], root: Path) -> list[str]:
    """Each picture whose recorded file has changed (or gone) since it was taken, with the file."""
    found = []
    for picture, files in sorted(manifest.items()):
        for path, recorded in sorted(files.items()):
            source = root / path
            now = hashlib.sha256(source.read_bytes()).hexdigest() if source.is_file() else None
            if now != recorded:
                found.append(f"docs/screenshots/{picture} is older than {path}")
    return found


def test_every_screenshot_is_newer_than_the_screen_it_shows(shows: dict[str, tuple[str, ...]]) -> None:
    manifest = json.loads(SOURCES.read_text())
    pictures = sorted(path.name for path in PICTURES.glob("*.png"))
    assert sorted(manifest) == pictures == sorted(shows), (
        f"{SOURCES.name} and the pictures differ: {TAKE_AGAIN}"
    )
    for picture, files in manifest.items():
        assert sorted(files) == sorted(shows[picture]), (
            f"{picture} lists other files than the script: {TAKE_AGAIN}"
        )
    assert stale(manifest, ROOT) == [], TAKE_AGAIN


def test_a_changed_template_makes_its_screenshot_stale(tmp_path: Path) -> None:
    template = tmp_path / "checkout.html"
    template.write_text("<h1>Pay</h1>\n")
    manifest = {"payment.png": {"checkout.html": hashlib.sha256(template.read_bytes()).hexdigest()}}
    assert stale(manifest, tmp_path) == []
    template.write_text("<h1>Pay for order</h1>\n")
    assert stale(manifest, tmp_path) == ["docs/screenshots/payment.png is older than checkout.html"]
    template.unlink()
    assert stale(manifest, tmp_path) == ["docs/screenshots/payment.png is older than checkout.html"]


def test_every_screenshot_is_shown_by_a_page() -> None:
    pages = (ROOT / "README.md").read_text() + "".join(
        path.read_text() for path in (ROOT / "docs").glob("*.md")
    )
    for picture in PICTURES.glob("*.png"):
        assert f"screenshots/{picture.name}" in pages, picture.name
