"""Secrets not readable in the raw database, on SQLite and on PostgreSQL.

tests/extension/web/test_admin.py::test_install_through_the_screen checks the installation made through
the admin screen against every column's text and the database's files (``Databases.raw_bytes``: the
SQLite file and its WAL, or PostgreSQL's data files after a CHECKPOINT). Here the same, and what
PostgreSQL hands out to anyone who can read the tables: ``COPY ... TO STDOUT`` of every table of the
shop, text and binary format. Only the Fernet ciphertexts may be there, never a key in any encoding.
"""

from __future__ import annotations

import base64
from typing import Any

import pytest
from sqlalchemy import create_engine, inspect
from sqlalchemy.pool import NullPool

from flask_gateway.state import get_state
from tests.conftest import Databases
from tests.extension.conftest import API_KEY, Harness
from tests.extension.inbound.inbound_support import create_v2_checkout, signing_key

# Each backend's own data files (and PostgreSQL's COPY) are what is searched.
pytestmark = pytest.mark.backends


def _encodings(secret: str) -> list[bytes]:
    raw = secret.encode()
    return [raw, base64.b64encode(raw), base64.urlsafe_b64encode(raw), raw.hex().encode()]


def _copy_out(url: str) -> bytes:
    """Every table of the database, as ``COPY ... TO STDOUT`` gives it (text and binary)."""
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as connection:
            tables = inspect(connection).get_table_names()
            raw: Any = connection.connection.dbapi_connection  # psycopg 3: cursor.copy()
            assert raw is not None
            out = bytearray()
            with raw.cursor() as cursor:
                for table in tables:
                    for options in ("", " WITH (FORMAT binary)"):
                        with cursor.copy(f'COPY "{table}" TO STDOUT{options}') as copy:
                            for chunk in copy:
                                out += bytes(chunk)
            return bytes(out)
    finally:
        engine.dispose()


def test_no_secret_is_readable_in_the_raw_database(harness: Harness, databases: Databases) -> None:
    harness.install()
    create_v2_checkout(harness)  # a checkout, its events: more rows around the secrets
    key = signing_key(harness)
    with harness.shop.app_context():
        installation = get_state().require_installation()
        ciphertexts = [installation.api_key_encrypted, installation.signing_key_encrypted]

    dumps = [databases.raw_bytes("main")]
    if databases.backend == "postgresql":
        copied = _copy_out(databases.url("main"))
        assert all(text.encode() in copied for text in ciphertexts)  # the dump does hold the rows
        dumps.append(copied)
    for dump in dumps:
        for secret in (API_KEY, key):
            for encoded in _encodings(secret):
                assert encoded not in dump
    assert ciphertexts[0].encode() in dumps[0]
