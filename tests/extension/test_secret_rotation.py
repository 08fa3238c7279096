"""``SECRET_KEY_FALLBACKS`` (Flask 3.1's older keys) wherever the extension and the embedded emulator use
``SECRET_KEY`` (issue 37): the secrets at rest (``SecretBox``), the signed return and v1 outcome URLs, the
doctor's probe mark, the emulator's own keys; and how the setting is read (a list, as Flask reads it).

The whole rotation in a shop is tests/extension/test_secret_rotation_shop.py; the command and the doctor's
count, tests/extension/operations/test_cli_rotate_secrets.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from cryptography.fernet import Fernet
from flask import Flask
from flask_sqlalchemy import SQLAlchemy
from werkzeug.datastructures import Headers

from flask_gateway import ConfigurationError, Gateway
from flask_gateway.core.secret_keys import SecretKeyFallbacksError, fallback_keys
from flask_gateway.emulator import EmbeddingRefused, mount
from flask_gateway.errors import SecretUnreadable
from flask_gateway.inbound.probe import PROBE_HEADER, _is_doctor_probe, doctor_probe_mark
from flask_gateway.secrets import SecretBox, signing_keys
from flask_gateway.urls import _sign, load_signed_reference

OLD, NEW, OLDER = "old-secret-key-0123456789", "new-secret-key-9876543210", "older-secret-key-5555555555"

# --- how SECRET_KEY_FALLBACKS is read ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "keys"),
    [
        (None, ()),
        ([], ()),
        ([OLD], (OLD,)),
        ((OLD, OLDER), (OLD, OLDER)),
        ([b"raw-bytes-key"], (b"raw-bytes-key",)),
    ],
)
def test_fallbacks_are_a_list_of_keys_as_flask_reads_them(value: object, keys: tuple[object, ...]) -> None:
    assert fallback_keys(value) == keys


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (OLD, "is a string, not a list of keys"),  # Flask's sessions would take each character for a key
        (f"{OLD},{OLDER}", "is a string, not a list of keys"),  # never split on commas: Flask does not
        (b"old", "is a string, not a list of keys"),
        ([OLD, ""], "key number 2 is empty"),
        ([OLD, 42], "key number 2 is a int"),
        (42, "is a int, not a list of keys"),
    ],
)
def test_anything_but_a_list_of_keys_is_refused_without_showing_a_key(value: object, says: str) -> None:
    with pytest.raises(SecretKeyFallbacksError, match=says) as refused:
        fallback_keys(value)
    assert OLD not in str(refused.value) and OLDER not in str(refused.value)


def _app(**config: Any) -> Flask:
    app = Flask("fallbacks_shop")
    app.config.update(SQLALCHEMY_DATABASE_URI="sqlite://", **config)
    Gateway(app, db=SQLAlchemy(app))
    return app


def test_init_app_refuses_a_string_with_how_to_give_the_list() -> None:
    with pytest.raises(ConfigurationError, match=r"FLASK_SECRET_KEY_FALLBACKS='\[\"<old key>\"\]'"):
        _app(SECRET_KEY=NEW, SECRET_KEY_FALLBACKS=OLD)


def test_flasks_own_environment_loading_gives_the_list_the_extension_reads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FLASK_SECRET_KEY_FALLBACKS", f'["{OLD}", "{OLDER}"]')
    app = Flask("env_shop")
    app.config.from_prefixed_env()
    assert app.config["SECRET_KEY_FALLBACKS"] == [OLD, OLDER]  # JSON: a list
    assert signing_keys({**app.config, "SECRET_KEY": NEW}) == [OLD, OLDER, NEW]
    monkeypatch.setenv("FLASK_SECRET_KEY_FALLBACKS", OLD)  # not JSON: Flask keeps the string
    plain = Flask("env_shop")
    plain.config.from_prefixed_env()
    with pytest.raises(ConfigurationError, match="is a string"):
        signing_keys({**plain.config, "SECRET_KEY": NEW})


# --- the secrets at rest -------------------------------------------------------------------------------


def test_a_secret_stored_under_the_old_key_reads_with_it_as_a_fallback_and_is_moved_to_the_new() -> None:
    token = SecretBox(None, OLD).encrypt("signing-key")
    with pytest.raises(SecretUnreadable):
        SecretBox(None, NEW).decrypt(token)  # a rotation without the fallback
    rotating = SecretBox(None, NEW, [OLD])
    assert (rotating.older_keys, rotating.older_keys_in) == (1, "SECRET_KEY_FALLBACKS")
    assert rotating.decrypt(token) == "signing-key"
    assert rotating.needs_older_key(token)
    moved = rotating.rotate(token)
    assert not rotating.needs_older_key(moved)
    assert SecretBox(None, NEW).decrypt(moved) == "signing-key"  # the fallback can go
    with pytest.raises(SecretUnreadable):
        SecretBox(None, OLD).decrypt(moved)


def test_the_current_key_encrypts_and_every_fallback_decrypts() -> None:
    older, old = SecretBox(None, OLDER).encrypt("a"), SecretBox(None, OLD).encrypt("b")
    box = SecretBox(None, NEW, [OLD, OLDER])
    assert (box.decrypt(older), box.decrypt(old)) == ("a", "b")
    assert SecretBox(None, NEW).decrypt(box.encrypt("c")) == "c"
    assert not box.needs_older_key(box.encrypt("c"))
    with pytest.raises(SecretUnreadable):
        box.needs_older_key(SecretBox(None, "another-key-entirely").encrypt("d"))
    with pytest.raises(SecretUnreadable, match="SECRET_KEY_FALLBACKS"):
        box.rotate(SecretBox(None, "another-key-entirely").encrypt("d"))


def test_a_fallback_equal_to_the_current_key_is_no_older_key() -> None:
    assert SecretBox(None, NEW, [NEW]).older_keys == 0
    assert SecretBox(None, NEW.encode(), [NEW]).older_keys == 0


def test_with_gateway_encryption_key_secret_key_and_its_fallbacks_protect_no_stored_secret() -> None:
    first, second = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    derived = SecretBox(None, OLD).encrypt("api-key")
    box = SecretBox(f"{second},{first}", NEW, [OLD])
    assert (box.older_keys, box.older_keys_in) == (1, "GATEWAY_ENCRYPTION_KEY")
    with pytest.raises(SecretUnreadable):
        box.decrypt(derived)  # as before: GATEWAY_ENCRYPTION_KEY is the whole story
    token = SecretBox(first, None).encrypt("api-key")
    assert box.needs_older_key(token)
    assert SecretBox(second, None).decrypt(box.rotate(token)) == "api-key"
    assert SecretBox(second, NEW, [OLD]).older_keys == 0


# --- the signed return links and v1 outcome URLs --------------------------------------------------------


def _signed(config: dict[str, Any], checkout_id: int, kind: Any = "confirm") -> str:
    app = Flask("links")
    app.config.update(config)
    with app.app_context():
        return _sign(checkout_id, kind)


def _loads(config: dict[str, Any], value: str, kind: Any = "confirm") -> int | None:
    app = Flask("links")
    app.config.update(config)
    with app.app_context():
        return load_signed_reference(value, kind)


@pytest.mark.parametrize("kind", ["confirm", "cancel", "v1-success", "v1-fail"])
def test_a_link_signed_with_the_old_key_holds_while_it_is_a_fallback(kind: Any) -> None:
    before = _signed({"SECRET_KEY": OLD}, 7, kind)
    rotating = {"SECRET_KEY": NEW, "SECRET_KEY_FALLBACKS": [OLDER, OLD]}
    assert _loads(rotating, before, kind) == 7
    assert _loads({"SECRET_KEY": NEW}, before, kind) is None  # the fallback dropped: refused as forged
    other = "v1-fail" if kind == "v1-success" else "v1-success"
    assert _loads(rotating, before, other) is None  # still bound to its kind


def test_new_links_are_signed_with_the_current_key_only() -> None:
    during = _signed({"SECRET_KEY": NEW, "SECRET_KEY_FALLBACKS": [OLD]}, 8)
    assert during == _signed({"SECRET_KEY": NEW}, 8)
    assert _loads({"SECRET_KEY": NEW}, during) == 8
    assert _loads({"SECRET_KEY": OLD}, during) is None


# --- the doctor's probe mark ---------------------------------------------------------------------------


def _probe_app(config: dict[str, Any]) -> Flask:
    app = Flask("probe")
    app.config.update(config)
    return app


def test_the_probe_mark_is_made_with_the_current_key_and_checked_with_the_fallbacks_too() -> None:
    body = b'{"probe": true}'
    with _probe_app({"SECRET_KEY": OLD}).app_context():
        old_mark = doctor_probe_mark(body)
    rotating = _probe_app({"SECRET_KEY": NEW, "SECRET_KEY_FALLBACKS": [OLD]})
    with rotating.app_context():
        assert _is_doctor_probe(Headers({PROBE_HEADER: old_mark}), body)
        new_mark = doctor_probe_mark(body)
        assert not _is_doctor_probe(Headers({PROBE_HEADER: old_mark}), b"another body")
    with _probe_app({"SECRET_KEY": NEW}).app_context():
        assert _is_doctor_probe(Headers({PROBE_HEADER: new_mark}), body)
        assert not _is_doctor_probe(Headers({PROBE_HEADER: old_mark}), body)  # the fallback dropped


# --- the embedded emulator's own keys ------------------------------------------------------------------


def _emulator_config(tmp_path: Any, **config: Any) -> dict[str, Any]:
    host = Flask("host", instance_path=str(tmp_path))
    host.config.update(GATEWAY_ENVIRONMENT="embedded", **config)
    return dict(mount(host).app.config)


def test_the_emulator_derives_its_fallbacks_from_the_hosts_never_using_the_hosts_keys(tmp_path: Any) -> None:
    before = _emulator_config(tmp_path / "a", SECRET_KEY=OLD)
    during = _emulator_config(tmp_path / "b", SECRET_KEY=NEW, SECRET_KEY_FALLBACKS=[OLD])
    after = _emulator_config(tmp_path / "c", SECRET_KEY=NEW)
    assert during["SECRET_KEY"] == after["SECRET_KEY"] != before["SECRET_KEY"]
    assert during["SECRET_KEY_FALLBACKS"] == [before["SECRET_KEY"]]  # what it signed before verifies
    assert during["WTF_CSRF_SECRET_KEY"] == [before["SECRET_KEY"], during["SECRET_KEY"]]  # newest last
    assert not after.get("SECRET_KEY_FALLBACKS") and "WTF_CSRF_SECRET_KEY" not in after
    assert not {OLD, NEW} & {during["SECRET_KEY"], *during["SECRET_KEY_FALLBACKS"]}


def test_a_host_whose_fallbacks_are_a_string_is_refused_by_the_emulator_too(tmp_path: Any) -> None:
    host = Flask("host", instance_path=str(tmp_path))
    host.config.update(GATEWAY_ENVIRONMENT="embedded", SECRET_KEY=NEW, SECRET_KEY_FALLBACKS=OLD)
    with pytest.raises(EmbeddingRefused, match="is a string"):
        mount(host)
