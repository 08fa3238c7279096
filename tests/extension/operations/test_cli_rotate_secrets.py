"""``flask gateway rotate-secrets`` and the doctor's count of the stored secrets that still need an older key
(issue 37): what the command changes (only what needs it, in one transaction, twice changing nothing),
when it refuses (a secret no key reads: nothing changed), and that no output shows a secret or a key.

Each shop is a restart of the one before on the same databases (``build_harness`` again, other keys).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

import pytest
from cryptography.fernet import Fernet
from flask import Flask
from sqlalchemy import event, select

from flask_gateway.errors import SecretUnreadable
from flask_gateway.models import GatewayBase, Installation
from flask_gateway.operations.rotation import encrypted_columns
from flask_gateway.secrets import SecretBox
from flask_gateway.state import get_state
from tests.conftest import Databases
from tests.extension.conftest import API_KEY, Harness, build_harness
from tests.extension.operations.cli_support import SECOND, install_account, run_gateway

OLD = "shop-secret-key-for-tests"  # the harness's SECRET_KEY: the key before the rotation
NEW = "the-new-shop-secret-key-0123456789"
ROTATING = {"SECRET_KEY": NEW, "SECRET_KEY_FALLBACKS": [OLD]}

pytestmark = pytest.mark.backends  # one transaction, row locks, what is committed: the database's own


def stored(harness: Harness) -> dict[tuple[str, str], str]:
    """Every installation's ciphertexts, by (account, column)."""
    with harness.shop.app_context():
        state = get_state()
        rows = state.session.scalars(select(Installation).order_by(Installation.id)).all()
        found = {
            (row.merchant_account_id, column): getattr(row, column)
            for row in rows
            for column in ("api_key_encrypted", "signing_key_encrypted")
        }
        state.session.rollback()
        return found


def plaintexts(harness: Harness) -> list[str]:
    """Every stored secret the shop can read."""
    with harness.shop.app_context():
        box = get_state().box
        found = []
        for token in stored(harness).values():
            with suppress(SecretUnreadable):
                found.append(box.decrypt(token))
        return found


@contextmanager
def statements(app: Flask) -> Iterator[list[str]]:
    """What the extension's engine sends while the block runs: each UPDATE's table, and each COMMIT."""
    seen: list[str] = []
    with app.app_context():
        engine = get_state(app).engine

    def cursor(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.lstrip().upper().startswith("UPDATE"):
            seen.append("UPDATE " + statement.split()[1].strip('"'))

    def commit(conn: Any) -> None:
        seen.append("COMMIT")

    event.listen(engine, "before_cursor_execute", cursor)
    event.listen(engine, "commit", commit)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", cursor)
        event.remove(engine, "commit", commit)


def doctor(harness: Harness) -> str:
    result = run_gateway(harness.shop, "doctor", "--no-network")
    return " ".join(result.stdout.split())  # the findings' wrapped lines as one text


def never_shown(harness: Harness, *outputs: str) -> None:
    secrets = [API_KEY, OLD, NEW, *plaintexts(harness), *stored(harness).values()]
    for output in outputs:
        for secret in secrets:
            assert secret not in output, f"a secret ending {secret[-4:]!r} was shown"


@pytest.fixture
def rotated(databases: Databases, monkeypatch: pytest.MonkeyPatch) -> Iterator[Harness]:
    """A shop installed under the old SECRET_KEY, restarted with the new one and the old as a fallback,
    then a second account installed (its keys stored under the new key)."""
    before = build_harness(databases, monkeypatch)
    before.install()
    with before.shop.app_context():
        before.db.engine.dispose()
        get_state(before.shop).dispose()
    during = build_harness(databases, monkeypatch, **ROTATING)
    install_account(during)
    yield during
    with during.shop.app_context():
        during.db.engine.dispose()


def test_only_the_secrets_under_the_older_key_are_re_encrypted_in_one_transaction(rotated: Harness) -> None:
    before = stored(rotated)
    readable = plaintexts(rotated)
    said = doctor(rotated)
    assert (
        "[warn] installation: 2 stored secrets still need an older key: run flask gateway rotate-secrets, "
        "then drop it from SECRET_KEY_FALLBACKS." in said
    ), said
    assert "SECRET_KEY_FALLBACKS holds 1 older key: the return links and v1 outcome URLs" in said

    with statements(rotated.shop) as sent:
        first = run_gateway(rotated.shop, "rotate-secrets")
    assert first.exit_code == 0, first.stdout + first.stderr
    assert first.stderr.startswith("Using database ")
    lines = first.stdout.splitlines()
    assert lines[0] == (
        "Re-encrypted 2 of 4 stored secrets under the current key; none still needs an older key."
    )
    assert "SECRET_KEY_FALLBACKS" in lines[1] and "expired" in lines[1]
    # One row updated, in one transaction (the COMMITs before it end the line's read of the setup).
    assert sent.count("UPDATE gateway_installations") == 1, sent
    assert sent[sent.index("UPDATE gateway_installations") :] == ["UPDATE gateway_installations", "COMMIT"]

    after = stored(rotated)
    assert after[(SECOND, "api_key_encrypted")] == before[(SECOND, "api_key_encrypted")]
    assert after[(SECOND, "signing_key_encrypted")] == before[(SECOND, "signing_key_encrypted")]
    assert after[("demo-merchant", "api_key_encrypted")] != before[("demo-merchant", "api_key_encrypted")]
    assert plaintexts(rotated) == readable
    with rotated.shop.app_context():
        current_only = SecretBox(None, NEW)
        assert [current_only.decrypt(token) for token in after.values()] == readable

    with statements(rotated.shop) as sent:
        again = run_gateway(rotated.shop, "rotate-secrets")
    assert again.exit_code == 0, again.stdout + again.stderr
    assert again.stdout.splitlines()[0] == (
        "Re-encrypted 0 of 4 stored secrets under the current key; none still needs an older key."
    )
    assert "UPDATE gateway_installations" not in sent
    assert stored(rotated) == after
    said_after = doctor(rotated)
    assert "still need an older key" not in said_after
    assert "no stored secret needs an older key of SECRET_KEY_FALLBACKS any more" in said_after, said_after
    never_shown(rotated, first.stdout, first.stderr, again.stdout, said, said_after)


def test_a_secret_no_key_reads_stops_the_command_before_it_changes_anything(rotated: Harness) -> None:
    with rotated.shop.app_context():
        state = get_state()
        lost = SecretBox(None, "a-key-nobody-has-any-more-0123456").encrypt("lost-signing-key")
        state.require_installation(SECOND).signing_key_encrypted = lost
        state.session.commit()
    before = stored(rotated)
    result = run_gateway(rotated.shop, "rotate-secrets")
    assert result.exit_code == 1, result.stdout + result.stderr
    using, error = result.stderr.strip().splitlines()
    assert using.startswith("Using database ")
    assert error.startswith(
        "Error: 1 of 4 stored secrets cannot be decrypted with any key the app has (the signing key of "
        f"merchant account {SECOND} (emulator)): nothing was re-encrypted."
    ), error
    assert result.stdout == ""
    assert stored(rotated) == before  # the account under the old key too: nothing changed
    said = doctor(rotated)
    assert "2 stored secrets still need an older key" in said, said
    assert "(1 cannot be decrypted with any key: flask gateway rotate-secrets refuses" in said, said
    never_shown(rotated, result.stdout, result.stderr, said)
    assert "lost-signing-key" not in result.stdout + result.stderr + said


def test_gateway_encryption_key_new_old_is_finished_by_the_command_too(
    databases: Databases, monkeypatch: pytest.MonkeyPatch
) -> None:
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    before = build_harness(databases, monkeypatch, GATEWAY_ENCRYPTION_KEY=old)
    before.install()
    with before.shop.app_context():
        get_state(before.shop).dispose()
        before.db.engine.dispose()
    # SECRET_KEY rotated at the same time: with GATEWAY_ENCRYPTION_KEY, it protects no stored secret.
    during = build_harness(databases, monkeypatch, GATEWAY_ENCRYPTION_KEY=f"{new},{old}", **ROTATING)
    try:
        said = doctor(during)
        assert (
            "2 stored secrets still need an older key: run flask gateway rotate-secrets, then drop it from "
            "GATEWAY_ENCRYPTION_KEY." in said
        ), said
        result = run_gateway(during.shop, "rotate-secrets")
        assert result.exit_code == 0, result.stdout + result.stderr
        first, keys, links = result.stdout.splitlines()
        assert (
            first
            == "Re-encrypted 2 of 2 stored secrets under the current key; none still needs an older key."
        )
        assert keys.startswith(
            "GATEWAY_ENCRYPTION_KEY's older keys are no longer needed: keep only its first"
        )
        assert links.startswith(
            "SECRET_KEY_FALLBACKS protects no stored secret (GATEWAY_ENCRYPTION_KEY does)"
        )
        box = SecretBox(new, None)
        assert API_KEY in [box.decrypt(token) for token in stored(during).values()]
        never_shown(during, result.stdout, result.stderr, said, old, new)
        for key in (old, new):
            assert key not in result.stdout + said
    finally:
        with during.shop.app_context():
            during.db.engine.dispose()


def test_a_shop_with_no_older_key_hears_nothing_of_one(harness: Harness) -> None:
    harness.install()
    said = doctor(harness)
    assert "older key" not in said, said
    result = run_gateway(harness.shop, "rotate-secrets")
    assert result.exit_code == 0, result.stdout + result.stderr
    assert result.stdout.splitlines() == [
        "Re-encrypted 0 of 2 stored secrets under the current key; none still needs an older key."
    ]


def test_every_encrypted_column_is_one_the_command_rotates() -> None:
    """A new column holding a stored secret is named ``*_encrypted`` and so is rotated with the others."""
    columns = {
        f"{table.name}.{column.name}"
        for table in GatewayBase.metadata.sorted_tables
        for column in table.columns
        if "encrypted" in column.name or "secret" in column.name
    }
    rotated = {
        f"{model.__tablename__}.{model.__mapper__.column_attrs[name].columns[0].name}"
        for model, names in encrypted_columns()
        for name in names
    }
    assert columns == rotated
    assert {
        "gateway_installations.api_key_encrypted",
        "gateway_installations.signing_key_encrypted",
    } <= rotated
