"""``GET /gateway/livez`` and ``GET /gateway/readyz`` (issue 23): each readiness check failing and passing,
what the answer never says, and that neither probe is behind the admin guard or CSRF."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from flask_gateway.core.outages import RETRY_AFTER_SECONDS
from flask_gateway.state import get_state
from tests.extension.conftest import ACCOUNT, API_KEY, Harness

pytestmark = pytest.mark.backends  # the schema's inspection and the installation's query


def ready_answer(harness: Harness) -> tuple[int, dict[str, object], str]:
    answer = harness.client.get("/gateway/readyz")
    return answer.status_code, answer.get_json(), answer.headers.get("Retry-After", "")


def test_ready_when_the_database_answers_the_schema_is_current_and_the_gateway_installed(
    harness: Harness,
) -> None:
    harness.install()
    status, body, retry_after = ready_answer(harness)
    assert (status, retry_after) == (200, "")
    assert body == {
        "status": "ready",
        "checks": {"database": {"ok": True}, "schema": {"ok": True}, "installation": {"ok": True}},
        # Informational (tests/extension/payments/test_heartbeats.py): nothing ran yet, installed just now.
        "background": {
            "deliver": {"age_seconds": None, "overdue": False},
            "reconcile": {"age_seconds": None, "overdue": False},
        },
    }


def test_not_installed_is_not_ready_until_it_is(harness: Harness) -> None:
    status, body, retry_after = ready_answer(harness)
    assert (status, retry_after) == (503, str(RETRY_AFTER_SECONDS))
    assert body["status"] == "unavailable"
    assert body["failing"] == ["installation"]
    assert body["checks"]["installation"] == {
        "ok": False,
        "detail": "not installed for the emulator environment",
    }
    assert body["checks"]["database"] == {"ok": True}
    assert body["checks"]["schema"] == {"ok": True}
    assert body["message"] == "Not ready: installation (not installed for the emulator environment)."

    harness.install()  # a failure is not kept: the next probe asks again
    assert ready_answer(harness)[0] == 200


def test_a_missing_table_is_not_ready_until_the_migrations_ran(harness: Harness) -> None:
    harness.install()
    with harness.shop.app_context():
        harness.db.session.execute(text("DROP TABLE gateway_refunds"))
        harness.db.session.commit()

    status, body, _ = ready_answer(harness)
    assert status == 503
    assert body["failing"] == ["schema"]
    detail = body["checks"]["schema"]["detail"]  # type: ignore[index]
    assert detail == "missing gateway_refunds: run the migrations or flask gateway init-db"
    assert body["checks"]["installation"] == {
        "ok": None,
        "detail": "not checked: the schema is not current",
    }

    with harness.shop.app_context():
        harness.db.create_all()
    assert ready_answer(harness)[0] == 200


def test_a_missing_column_is_not_ready(harness: Harness) -> None:
    harness.install()
    with harness.shop.app_context():
        harness.db.session.execute(text("ALTER TABLE gateway_callback_log DROP COLUMN detail"))
        harness.db.session.commit()

    status, body, _ = ready_answer(harness)
    assert status == 503
    assert body["failing"] == ["schema"]
    assert "gateway_callback_log.detail" in body["checks"]["schema"]["detail"]  # type: ignore[index]


def test_a_success_is_kept_for_the_process(harness: Harness) -> None:
    """Once the schema and the installation were found, a probe asks the database only whether it answers
    (a column dropped afterwards is the migrations' business, not every probe's)."""
    harness.install()
    assert ready_answer(harness)[0] == 200
    with harness.shop.app_context():
        harness.db.session.execute(text("DROP TABLE gateway_refunds"))
        harness.db.session.commit()
    assert ready_answer(harness)[0] == 200


def test_the_answers_say_nothing_secret(harness: Harness) -> None:
    with harness.shop.app_context():
        database = str(get_state().engine.url.database).rsplit("/", 1)[-1]
    for installed in (False, True):
        if installed:
            harness.install()
        answer = harness.client.get("/gateway/readyz").get_data(as_text=True)
        live = harness.client.get("/gateway/livez").get_data(as_text=True)
        for secret in (ACCOUNT, API_KEY, harness.shop.config["SECRET_KEY"], database):
            assert secret not in answer and secret not in live


def test_the_probes_are_not_behind_the_admin_guard_nor_csrf(harness: Harness) -> None:
    harness.install()
    client = harness.client
    assert client.get("/gateway/admin/").status_code == 403  # no admin guard registered in this shop
    for path in ("/gateway/livez", "/gateway/readyz"):
        answer = client.get(path)
        assert answer.status_code == 200, path
        assert answer.headers["Cache-Control"] == "no-store"
        assert client.head(path).status_code == 200


def test_liveness_touches_no_database(harness: Harness) -> None:
    from sqlalchemy import event

    statements: list[str] = []
    with harness.shop.app_context():
        engines = {get_state().engine, harness.db.engine}

    def seen(*args: object) -> None:
        statements.append(str(args[2]))

    for engine in engines:
        event.listen(engine, "before_cursor_execute", seen)
    try:
        answer = harness.client.get("/gateway/livez")
    finally:
        for engine in engines:
            event.remove(engine, "before_cursor_execute", seen)
    assert (answer.status_code, answer.get_json()) == (200, {"status": "ok"})
    assert statements == []
