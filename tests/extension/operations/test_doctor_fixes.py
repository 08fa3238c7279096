"""``flask gateway doctor`` on a database without the gateway's tables says one thing, with its fix, and
skips the checks that read them; and every finding it can print that is not ``ok`` has a fix line
(issue 28, point 7).
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
import responses
from flask import Flask
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy import text

from flask_gateway import Gateway
from flask_gateway.operations import doctor
from flask_gateway.operations.doctor import CHECKS, DoctorReport, Finding, run_checks
from flask_gateway.state import get_state
from flask_gateway.testing import gateway_config
from tests.conftest import Databases
from tests.extension.operations.cli_support import run_gateway
from tests.extension.operations.test_doctor import findings

#: The checks that read the gateway's tables: skipped while they are missing.
NEED_TABLES = [
    "public-url",
    "installation",
    "settings",
    "callback",
    "reconcile",
    "outbox",
    "background-work",
    "readiness",
]


def bare_shop(database_url: str, **config: Any) -> Flask:
    """A shop with the extension whose database has none of its tables (nothing ran ``init-db`` or the
    migrations), configured well otherwise: the database is its only problem."""
    app = Flask("empty_shop")
    app.config.update(
        SECRET_KEY="a-long-random-secret-key-for-the-doctor-tests",
        SQLALCHEMY_DATABASE_URI=database_url,
        GATEWAY_ORDER_ENDPOINT="order_page",
        **gateway_config(),
    )
    app.config.update(config)
    db = SQLAlchemy()
    db.init_app(app)
    Gateway(app, db=db)

    @app.get("/orders/<reference>")
    def order_page(reference: str) -> str:
        return reference

    return app


@pytest.fixture
def empty_shop(databases: Databases) -> Flask:
    return bare_shop(databases.url("main"))


@pytest.mark.backends  # the schema as each database reports it
def test_an_empty_database_is_one_finding_with_its_fix(empty_shop: Flask) -> None:
    result = run_gateway(empty_shop, "doctor", "--timeout", "2")

    assert result.exit_code == 1, result.output
    found = findings(result.stdout)
    not_ok = [(check, mark, said) for check, items in found.items() for mark, said in items if mark != "ok"]
    assert len(not_ok) == 1, result.stdout
    [(check, mark, said)] = not_ok
    assert (check, mark) == ("database", "PROBLEM")
    message, _, fix = said.partition(" fix: ")
    assert "has none of the gateway's" in message
    assert "run flask gateway init-db, or your migrations: flask db upgrade" in fix
    # the checks that read the tables are not run, and the one finding says so
    assert not set(NEED_TABLES) & set(found), result.stdout
    assert "Skipped until the tables exist: " + ", ".join(NEED_TABLES) + "." in message
    assert sorted(found) == ["broker", "configuration", "csrf", "database", "package"]
    assert "report it as a bug" not in result.output
    assert "could not run" not in result.output
    assert result.stdout.strip().splitlines()[-1].startswith("1 problem, ")


@pytest.mark.backends
def test_a_table_missing_after_an_upgrade_skips_the_checks_that_read_them(databases: Databases) -> None:
    """One table missing (an upgrade without its migration): the same one finding, the fix first naming
    the migrations (the other tables hold data)."""
    shop = bare_shop(databases.url("main"))
    with shop.app_context():
        get_state().db.create_all()
        get_state().db.session.execute(text("DROP TABLE gateway_refunds"))
        get_state().db.session.commit()
        report = run_checks(network=False)
    [problem] = [f for f in report.findings if f.level != "ok"]
    assert problem.check == "database"
    assert "table(s) gateway_refunds" in problem.message
    assert "Skipped until the tables exist: public-url, installation" in problem.message
    assert "flask db upgrade" in problem.fix
    assert not {f.check for f in report.findings} & set(NEED_TABLES)


def test_init_db_then_the_doctor_runs_every_check(empty_shop: Flask) -> None:
    """The fix the finding names works: after ``init-db`` the skipped checks run again."""
    assert run_gateway(empty_shop, "init-db").exit_code == 0
    result = run_gateway(empty_shop, "doctor", "--no-network")
    found = findings(result.stdout)
    assert set(NEED_TABLES) <= set(found), result.stdout
    assert [mark for mark, _said in found["database"]] == ["ok"]


# --- every finding has a fix ------------------------------------------------------------------------------

DOCTOR = Path(doctor.__file__).parent


def _level(call: ast.Call) -> ast.expr | None:
    if len(call.args) >= 2:
        return call.args[1]
    return next((k.value for k in call.keywords if k.arg == "level"), None)


def _fix(call: ast.Call) -> ast.expr | None:
    if len(call.args) >= 4:
        return call.args[3]
    return next((k.value for k in call.keywords if k.arg == "fix"), None)


def _findings_in(module: Path) -> list[tuple[int, ast.Call]]:
    """Every ``Finding(...)`` the module makes whose level may be other than ``ok``."""
    calls = []
    for node in ast.walk(ast.parse(module.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Finding":
            level = _level(node)
            if isinstance(level, ast.Constant) and level.value == "ok":
                continue
            calls.append((node.lineno, node))
    return calls


def _empty(fix: ast.expr | None) -> bool:
    return fix is None or (isinstance(fix, ast.Constant) and not str(fix.value).strip())


#: The checks whose findings are written in a module another change owns: their fix-less findings get
#: their check's own fix (``Check.fix``), which must exist.
_FALLBACK_MODULES = {"schedules.py": ("reconcile", "outbox", "background-work", "broker")}


@pytest.mark.parametrize("module", sorted(p.name for p in DOCTOR.glob("*.py")))
def test_every_finding_the_doctor_can_make_has_a_fix(module: str) -> None:
    """Read from the source, so that no finding escapes a test that would have to provoke it: every
    ``Finding`` whose level can be ``warn``, ``problem`` or ``unknown`` names its fix."""
    missing = [line for line, call in _findings_in(DOCTOR / module) if _empty(_fix(call))]
    if module in _FALLBACK_MODULES:
        by_name = {check.name: check for check in CHECKS}
        assert all(by_name[name].fix for name in _FALLBACK_MODULES[module])
        return
    assert missing == [], f"{module}: a Finding without a fix at line(s) {missing}"


def _without_fix_line(report: DoctorReport) -> list[Finding]:
    """The printed findings that are not ``ok`` and print no fix line."""
    return [
        f
        for f in report.shown
        if f.level != "ok" and not any(x.strip().startswith("fix: ") for x in f.lines())
    ]


@pytest.mark.parametrize(
    "config",
    [
        pytest.param({"GATEWAY_PUBLIC_URL": None}, id="emulator-no-public-url"),
        pytest.param({}, id="emulator-public-url-unreachable"),
        pytest.param(
            {"GATEWAY_ENVIRONMENT": "sandbox", "GATEWAY_PUBLIC_URL": None, "SECRET_KEY": "short"},
            id="sandbox-no-public-url",
        ),
    ],
)
@pytest.mark.parametrize("network", [True, False], ids=["network", "no-network"])
def test_every_finding_printed_has_a_fix_line(
    databases: Databases, config: dict[str, Any], network: bool
) -> None:
    """Setups that provoke the findings that had no fix (``public-url`` and ``callback`` without a public
    URL, ``settings`` and ``reconcile`` not installed, the checks ``--no-network`` skips), on an empty
    database and then with the tables: every finding printed that is not ``ok`` has its fix line."""
    shop = bare_shop(databases.url("main"), **config)
    with responses.RequestsMock(assert_all_requests_are_fired=False), shop.app_context():  # no request leaves
        empty = run_checks(network=network, timeout=1)
        get_state().db.create_all()
        tables = run_checks(network=network, timeout=1)
    for report in (empty, tables):
        assert _without_fix_line(report) == []
    not_ok = {f.check for f in tables.shown if f.level != "ok"}
    assert {"installation", "settings", "callback", "reconcile"} <= not_ok, tables.shown
    if config.get("GATEWAY_PUBLIC_URL", "set") is None:
        assert "public-url" in not_ok


def test_a_check_that_breaks_still_names_a_fix(empty_shop: Flask, monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(_options: Any) -> list[Finding]:
        raise RuntimeError("boom")

    from flask_gateway.operations.doctor import runner

    broken = tuple(
        runner.Check(c.name, boom, c.network, c.reads, c.tables, c.fix) if c.name == "package" else c
        for c in runner.CHECKS
    )
    monkeypatch.setattr(runner, "CHECKS", broken)
    with empty_shop.app_context():
        report = run_checks(network=False)
    [package] = [f for f in report.findings if f.check == "package"]
    assert package.level == "unknown"
    assert "RuntimeError: boom" in package.message
    assert package.fix
