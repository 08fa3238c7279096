"""The database backends: tests whose outcome can depend on the backend run on SQLite and on PostgreSQL.

- ``database_backend`` is ``"sqlite"`` or ``"postgresql"``; a test that uses it (directly or through
  ``databases`` / ``database_url`` or a fixture built on them) is parametrized with it, named
  ``test_x[sqlite]`` / ``test_x[postgresql]``.
- ``@pytest.mark.backends`` (on the test, its class, or its module's ``pytestmark``) says the test's outcome
  can depend on the backend: locking, transactions, concurrency, SQL and statement counts, column types and
  lengths, U+0000, secrets at rest in the data files. Such a test runs on both backends. A test without
  it runs once, on SQLite (still named ``test_x[sqlite]``): the admin guard, CSRF, headers, forms, labels,
  docs and the CLI's output read the same on either. When in doubt, mark it.
- ``pytest --database=sqlite`` runs everything that uses the fixtures on SQLite only (and never starts
  PostgreSQL); ``--database=postgresql`` runs all of it, marked or not, on PostgreSQL only. The default,
  ``both``, is the split above. (Every test on both backends: one run with each of the two options.)
- The mark belongs on a test function, class or module: on a ``pytest.param`` it would come too late to
  add the PostgreSQL run, and on a test that uses no database fixture it means nothing. Both are a usage
  error at collection.
- ``databases`` hands out fresh, empty databases for the test (``databases.url("emulator")``): a file in
  ``tmp_path`` on SQLite, a new database in the session's throwaway cluster (``tests/postgres.py``) on
  PostgreSQL. After the test every engine is disposed and the PostgreSQL databases are dropped (or
  recycled, below).
- ``database_url`` is the test's main database (``databases.url("main")``).
- ``databases.url(name, schema=...)``: the database holds the tables of that :class:`Schema` (and no row),
  as if its app had created them: built once per worker process and backend, then copied for each test
  (a SQLite file copied; PostgreSQL ``CREATE DATABASE ... TEMPLATE``) instead of every test running the
  ``CREATE TABLE``s again. The app's own ``create_all`` then finds them there. On PostgreSQL such a copy
  is, after its test, emptied in the background for a later test instead of dropped, when nothing is
  connected to it and it is still shaped exactly as its template (``PostgresCluster.recycle_database``:
  the tables written to truncated, the sequences restarted; tests/extension/test_recycled_databases.py).

The PostgreSQL cluster starts once per session, on first use (``--database=sqlite`` never starts it), and is
stopped at the end. Missing PostgreSQL binaries fail those tests (``scripts/ensure-system-packages``
installs them); they are never skipped silently.

SQLite without fsync: every SQLite connection the tests' own process opens through SQLAlchemy gets
``PRAGMA synchronous=OFF`` (as the PostgreSQL cluster runs with ``fsync=off``): a commit no longer waits
for the disk, which was half of an in-process request's time. Nothing is lost when a process dies (only
when the machine does), and no test is about surviving a power cut. The tests of ``tests/plugin`` keep
SQLite's own setting: they check what the pytest plugin does to it.

URL builders and templates compiled once per worker process: every Flask app the tests build (a shop, an
emulator, the example shop: several a test) takes ``flask_gateway.core.routing.SharedBuilderRule`` as its
rule class, so the functions Werkzeug compiles for each URL rule are compiled once per distinct rule, not
once per app; and its Jinja environment takes ``flask_gateway.core.templates.SHARED_TEMPLATE_CODE`` as its
bytecode cache, so a template is compiled once for all the environments that would compile it the same
way. The rules, the URLs they build, the templates and what they render are Werkzeug's and Jinja's own (the
emulator's ``create_app`` does the same).
"""

from __future__ import annotations

import atexit
import re
import shutil
import sqlite3
import tempfile
import uuid
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from sqlalchemy import MetaData, Table, create_engine, event, inspect, select, text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.pool import NullPool, Pool

from flask_gateway.core.routing import SharedBuilderRule
from flask_gateway.core.templates import SHARED_TEMPLATE_CODE
from tests import secret_watch
from tests.postgres import PostgresCluster, start_cluster

#: pytester: tests/security/test_secret_watch.py runs a small session of its own.
pytest_plugins = ["pytester"]

BACKENDS = ("sqlite", "postgresql")

# See the module's docstring: every app's URL builders and templates compiled once per process.
Flask.url_rule_class = SharedBuilderRule
Flask.jinja_options = {**Flask.jinja_options, "bytecode_cache": SHARED_TEMPLATE_CODE}

# Every engine that connected during the test (weakly) and every DB-API connection opened: after each test
# the engines are disposed and any connection still open is closed (one a test left checked out, e.g. in
# an app context it never popped), so none keeps a database from being dropped or a SQLite file open, and
# none is left for the garbage collector to complain about in a later test.
_engines: weakref.WeakSet[Engine] = weakref.WeakSet()
_dbapi_connections: list[Any] = []


@event.listens_for(Engine, "engine_connect")
def _track_engine(connection: Connection) -> None:
    _engines.add(connection.engine)


@event.listens_for(Pool, "connect")
def _track_dbapi_connection(dbapi_connection: Any, _record: Any) -> None:
    _dbapi_connections.append(dbapi_connection)


#: False while a test of tests/plugin runs (see the module's docstring).
_sqlite_without_fsync = True
_PLUGIN_TESTS = Path(__file__).resolve().parent / "plugin"


@event.listens_for(Engine, "connect")
def _sqlite_no_fsync(dbapi_connection: Any, _record: Any) -> None:
    if _sqlite_without_fsync and isinstance(dbapi_connection, sqlite3.Connection):
        dbapi_connection.execute("PRAGMA synchronous=OFF")


@pytest.fixture(autouse=True)
def _sqlite_fsync_setting(request: pytest.FixtureRequest) -> Iterator[None]:
    global _sqlite_without_fsync
    _sqlite_without_fsync = not request.path.is_relative_to(_PLUGIN_TESTS)
    yield
    _sqlite_without_fsync = True


def dispose_engines() -> None:
    """Dispose every engine the test used and close every connection it left open."""
    for engine in list(_engines):
        engine.dispose()
    _engines.clear()
    while _dbapi_connections:
        with suppress(Exception):  # already closed, or ended by the server
            _dbapi_connections.pop().close()


def pytest_configure(config: pytest.Config) -> None:
    # No secret in any log line of the run (tests/secret_watch.py): fails the session at the end.
    secret_watch.register(config)
    if not hasattr(config, "workerinput"):  # the controller (or a run without pytest-xdist)
        config.pluginmanager.register(_FailuresAtOnce(config), "failures-at-once")


class _FailuresAtOnce:
    """Name each failing test on its own line as soon as its report arrives: under pytest-xdist the
    controller prints only ``F`` until the end, and a run of half an hour hides which test failed."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if not report.failed or hasattr(report, "wasxfail"):
            return
        terminal = self.config.pluginmanager.get_plugin("terminalreporter")
        if terminal is not None:
            where = "" if report.when == "call" else f" (in its {report.when})"
            terminal.write_line(f"\nFAILED {report.nodeid}{where}", red=True)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--database",
        choices=(*BACKENDS, "both"),
        default="both",
        help="run the database tests on sqlite, postgresql or both (default: both)",
    )


def selected_backends(config: pytest.Config) -> tuple[str, ...]:
    choice = config.getoption("--database")
    return BACKENDS if choice == "both" else (choice,)


#: The mark of a test whose outcome can depend on the database backend (registered in pyproject.toml).
BACKENDS_MARK = "backends"
#: The node ids of the test functions found marked when they were parametrized (see the usage checks).
_MARKED_DEFINITIONS = pytest.StashKey[set[str]]()


def backends_for(metafunc: pytest.Metafunc) -> tuple[str, ...]:
    """Every selected backend for a test marked ``backends``; else one: SQLite, or the one chosen."""
    selected = selected_backends(metafunc.config)
    if metafunc.definition.get_closest_marker(BACKENDS_MARK) is None:
        return selected[:1]  # BACKENDS lists SQLite first
    metafunc.config.stash.setdefault(_MARKED_DEFINITIONS, set()).add(metafunc.definition.nodeid)
    return selected


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "database_backend" in metafunc.fixturenames:
        backends = backends_for(metafunc)
        metafunc.parametrize("database_backend", backends, ids=backends, indirect=True)


#: Session fixtures that start something expensive (a wheel built and installed, a stack of servers, a
#: browser, a broker): the tests that use one run in the same pytest-xdist worker (``--dist loadgroup``),
#: which starts it once. Other tests go to whichever worker is free.
XDIST_GROUPS = {
    "wheel_venv": "wheel",
    "venv_template": "wheel",
    "flask_gateway_wheel": "wheel",
    "flask_gateway_distributions": "wheel",
    "reliability_stack": "reliability",
    "browser": "browser",
    "redis_server": "redis",
}
#: Module fixtures that start something (a PostgreSQL cluster a module stops and starts, the Celery stack):
#: the module's tests that use one run in the same worker (the group is the module), which starts it once;
#: split between two workers, each would start its own.
XDIST_MODULE_GROUPS = {"restartable", "cluster", "task_stack"}

#: Whole scenarios of a minute or so each, not in a group: handed out first (with ``--loadscope-reorder``,
#: pytest-xdist's default, the groups go first, the biggest first, then single tests in this order), so that
#: the run does not end with one worker busy on one of them while the other has nothing left (issue 30).
SLOW_FIRST = (
    "tests/shop/test_demo.py::test_two_demos",
    "tests/tasks/test_broker.py",
    "tests/reliability/",
    "tests/extension/test_quickstart_typed.py",
    "tests/docs/test_quickstart.py",
    "tests/security/test_state_machine.py",
    "tests/security/test_openapi_all_checks.py",
    "tests/packaging/test_migrations.py::test_autogenerate",
)


def _slow_rank(item: pytest.Item) -> int:
    """The index in ``SLOW_FIRST`` of the entry the test's node id starts with; after all of them if none."""
    return next(
        (rank for rank, prefix in enumerate(SLOW_FIRST) if item.nodeid.startswith(prefix)), len(SLOW_FIRST)
    )


# tryfirst: the marks must be there before pytest-xdist's worker reads them (its own implementation of this
# hook appends ``@group`` to each grouped test's node id, the scope its scheduler groups by).
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Misplaced ``backends`` marks are usage errors: they would silently not do what they say. Tests
    that share an expensive session or module fixture are grouped for pytest-xdist (``XDIST_GROUPS``,
    ``XDIST_MODULE_GROUPS``; a test's own ``xdist_group`` mark wins), and the long scenarios come first
    (``SLOW_FIRST``; the others keep their order)."""
    items[:] = sorted(items, key=_slow_rank)  # stable
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        names = getattr(item, "fixturenames", ())
        group = next((XDIST_GROUPS[name] for name in names if name in XDIST_GROUPS), None)
        if group is None and XDIST_MODULE_GROUPS.intersection(names):
            group = item.nodeid.split("::", 1)[0]
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    marked = config.stash.get(_MARKED_DEFINITIONS, set())
    problems = []
    for item in items:
        if not isinstance(item, pytest.Function) or item.get_closest_marker(BACKENDS_MARK) is None:
            continue
        if "database_backend" not in item.fixturenames:
            if any(mark.name == BACKENDS_MARK for mark in item.own_markers):
                problems.append(f"{item.nodeid}: uses no database fixture (remove the mark)")
            continue
        definition = f"{item.parent.nodeid}::{item.originalname}" if item.parent else item.nodeid
        if definition not in marked:
            problems.append(f"{item.nodeid}: marked on a pytest.param (mark the test function instead)")
    if problems:
        raise pytest.UsageError(f"@pytest.mark.{BACKENDS_MARK} misplaced:\n  " + "\n  ".join(problems))


@pytest.hookimpl(trylast=True, specname="pytest_collection_modifyitems")
def pytest_collection_modifyitems_xdist_group_ids(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The ``@group`` suffix that pytest-xdist's worker gives a grouped test's node id, made to hold.

    pytest-xdist 3.8 writes it to ``item._nodeid``; since pytest 9.2 the node id is read from the structured
    ``item._id``, so the suffix was lost and ``--dist loadgroup`` grouped nothing: each group's tests ran on
    both workers, each starting the session fixture (the wheel and its venv, the reliability stack, the
    browser) for itself (pytest-dev/pytest-xdist#1386; a fix is proposed in #1388). Runs after
    xdist's implementation; does nothing where the suffix is there already (other versions) or when the
    run is not ``--dist loadgroup``."""
    if not getattr(config.option, "loadgroup", False):
        return
    for item in items:
        names = sorted(
            {
                str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
                for mark in item.iter_markers("xdist_group")
            }
        )
        nodeid = item.nodeid
        if not names or nodeid.rfind("@") > nodeid.rfind("]"):
            continue
        grouped = f"{nodeid}@{'_'.join(names)}"
        if isinstance(getattr(item, "_id", None), str) or not hasattr(item, "_id"):
            item._nodeid = grouped  # type: ignore[attr-defined]
        else:
            from _pytest.nodeid import NodeId  # pytest >= 9.2

            item._id = NodeId.parse(grouped)  # type: ignore[attr-defined]


@pytest.fixture
def database_backend(request: pytest.FixtureRequest) -> str:
    backend: str = request.param
    return backend


@pytest.fixture(scope="session")
def postgres_cluster() -> Iterator[PostgresCluster]:
    """A throwaway PostgreSQL cluster for the whole session (started on first use, stopped at the end)."""
    problem = None
    try:
        cluster = start_cluster()
    except RuntimeError as exc:  # never a silent skip: the PostgreSQL half of the suite would be gone
        problem = str(exc)
    if problem is not None:
        pytest.fail(
            f"The PostgreSQL tests cannot run. {problem}\n"
            "(Or run the SQLite half only: pytest --database=sqlite.)",
            pytrace=False,
        )
    try:
        yield cluster
    finally:
        dispose_engines()
        cluster.stop()
    if cluster.drop_errors:
        pytest.fail("Some test databases could not be dropped:\n" + "\n".join(cluster.drop_errors))


@dataclass(frozen=True)
class Schema:
    """The tables an app creates in its empty database (``databases.url(name, schema=...)``).

    ``build(url)`` creates them, as the app does, in the empty database at ``url`` and closes every
    connection it opened; it writes no row. ``key`` names the schema (one template per key and backend).
    """

    key: str
    build: Callable[[str], None]


class SchemaTemplates:
    """Per worker process: each :class:`Schema` built once per backend into a database of its own, the
    template each test's database is copied from. Nothing connects to a template after its build."""

    def __init__(self) -> None:
        self._directory: Path | None = None
        self._sqlite: dict[str, Path] = {}

    def sqlite_copy(self, schema: Schema, target: Path) -> None:
        """``target`` (a new SQLite file): a copy of the schema's template file."""
        template = self._sqlite.get(schema.key)
        if template is None:
            if self._directory is None:
                self._directory = Path(tempfile.mkdtemp(prefix="flask-gateway-schemas-"))
                atexit.register(shutil.rmtree, self._directory, ignore_errors=True)
            template = self._directory / f"{schema.key}.sqlite3"
            try:
                schema.build(f"sqlite:///{template}")
            except BaseException:
                template.unlink(missing_ok=True)
                raise
            # Everything in the main file (the WAL checkpointed and removed): the copy is the whole database.
            connection = sqlite3.connect(template)
            try:
                connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            finally:
                connection.close()
            leftovers = [p.name for p in template.parent.glob(f"{template.name}-*")]
            assert not leftovers, f"the template {template} is still in use: {leftovers}"
            self._sqlite[schema.key] = template
        shutil.copyfile(template, target)

    @staticmethod
    def postgres_copy(schema: Schema, cluster: PostgresCluster) -> str:
        """A database of ``cluster`` shaped as the schema's template database there and holding no row: one
        an earlier test used and the cluster emptied since (``PostgresCluster.recycle_database``: only when
        it was still shaped exactly as the template), else a new copy of the template."""
        template = cluster.templates.get(schema.key)
        if template is None:
            name = f"template_{re.sub(r'[^a-z0-9_]', '_', schema.key.lower())}_{uuid.uuid4().hex[:8]}"
            schema.build(cluster.create_database(name))
            cluster.template_shapes[schema.key] = cluster.shape_of(name)
            template = cluster.templates[schema.key] = name
        return cluster.reuse_database(schema.key) or cluster.create_database(template=template)


#: The worker's templates (``Databases.url(name, schema=...)``).
SCHEMA_TEMPLATES = SchemaTemplates()


@dataclass
class Databases:
    """Fresh databases for one test on one backend; ``url(name)`` creates one per name (then reuses it)."""

    backend: str
    directory: Path
    cluster: PostgresCluster | None
    urls: dict[str, str] = field(default_factory=dict)
    #: The schema key of each PostgreSQL database copied from a template (recycled after the test).
    schemas: dict[str, str] = field(default_factory=dict)

    def url(self, name: str = "main", *, schema: Schema | None = None) -> str:
        """The database ``name``, created empty on first use; with ``schema`` (on first use), holding that
        schema's tables and no row (a copy of its template: see :class:`SchemaTemplates`)."""
        if name not in self.urls:
            if self.cluster is None:
                safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name)
                path = self.directory / f"{safe}.sqlite3"
                if schema is not None:
                    SCHEMA_TEMPLATES.sqlite_copy(schema, path)
                self.urls[name] = f"sqlite:///{path}"
            elif schema is not None:
                self.urls[name] = SCHEMA_TEMPLATES.postgres_copy(schema, self.cluster)
                self.schemas[name] = schema.key
            else:
                self.urls[name] = self.cluster.create_database()
        return self.urls[name]

    def drop(self, name: str) -> None:
        """Dispose every engine and remove the database ``name`` (PostgreSQL, in the background while the
        tests go on: a copy of a template is emptied for another test when it is still shaped as the
        template, any other database dropped; SQLite: forget the name, ``tmp_path`` goes with its files)."""
        dispose_engines()
        url = self.urls.pop(name, None)
        key = self.schemas.pop(name, None)
        if url is not None and self.cluster is not None:
            database = url.rsplit("/", 1)[1]
            if key is not None:
                self.cluster.recycle_database(database, key)
            else:
                self.cluster.drop_database(database, wait=False)

    def drop_all(self) -> None:
        for name in list(self.urls):
            self.drop(name)

    def raw_bytes(self, name: str = "main") -> bytes:
        """Everything the database ``name`` keeps on disk: the SQLite file and its WAL, or (PostgreSQL,
        after a checkpoint) the database's own data files in the cluster's data directory."""
        url = self.url(name)
        if self.cluster is None:
            path = Path(url.removeprefix("sqlite:///"))
            return b"".join(p.read_bytes() for p in sorted(path.parent.glob(f"{path.name}*")))
        with new_connection(url) as connection:
            connection.exec_driver_sql("CHECKPOINT")  # the changes reach the data files
            oid = connection.exec_driver_sql(
                "SELECT oid FROM pg_database WHERE datname = current_database()"
            ).scalar_one()
        files = (self.cluster.data_dir / "base" / str(oid)).rglob("*")
        return b"".join(p.read_bytes() for p in sorted(files) if p.is_file())

    def text_values(self, name: str = "main", *, prefix: str = "gateway_") -> list[str]:
        """Every value of every column of every table named ``prefix*``, as text (None left out)."""
        engine = create_engine(self.url(name), poolclass=NullPool)
        try:
            with engine.connect() as connection:
                values: list[str] = []
                for table_name in inspect(connection).get_table_names():
                    if not table_name.startswith(prefix):
                        continue
                    table = Table(table_name, MetaData(), autoload_with=connection)
                    for row in connection.execute(select(table)):
                        values.extend(str(value) for value in row if value is not None)
                return values
        finally:
            engine.dispose()


@contextmanager
def new_connection(url: str) -> Iterator[Connection]:
    """A connection of its own (not the app's pool), autocommit: it sees only committed data."""
    engine = create_engine(url, poolclass=NullPool, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as connection:
            yield connection
    finally:
        engine.dispose()


def fetch_all(url: str, sql: str, **params: Any) -> list[tuple[Any, ...]]:
    """Run ``sql`` (``:name`` parameters) on a connection of its own; the rows as tuples."""
    with new_connection(url) as connection:
        return [tuple(row) for row in connection.execute(text(sql), params)]


@pytest.fixture
def databases(database_backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Databases]:
    cluster: PostgresCluster | None = None
    if database_backend == "postgresql":
        cluster = request.getfixturevalue("postgres_cluster")
    found = Databases(backend=database_backend, directory=tmp_path, cluster=cluster)
    try:
        yield found
    finally:
        dispose_engines()
        found.drop_all()


@pytest.fixture
def database_url(databases: Databases) -> str:
    """The test's main database: a SQLite file in ``tmp_path`` or a fresh PostgreSQL database."""
    return databases.url("main")


# Flask-Gateway as a package index serves it, and a Python with nothing of the repository
# (tests/packaging/wheel.py). Built on first use, once per session.

from tests.packaging.wheel import (  # noqa: E402 (appended)
    Distributions,
    build_distributions,
    copy_venv,
    fresh_venv,
)


@pytest.fixture(scope="session")
def flask_gateway_distributions(tmp_path_factory: pytest.TempPathFactory) -> Distributions:
    """The checkout's sdist and wheel (``.sdist``, ``.wheel``): ``python -m build`` on a copy of its files,
    the wheel built from the sdist."""
    return build_distributions(tmp_path_factory.mktemp("flask-gateway-dist"))


@pytest.fixture(scope="session")
def flask_gateway_wheel(flask_gateway_distributions: Distributions) -> Path:
    """The path of the checkout's wheel (``flask_bnpl_gateway-<version>-py3-none-any.whl``)."""
    return flask_gateway_distributions.wheel


@pytest.fixture(scope="session")
def venv_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtual environment with nothing installed, made once (``python -m venv``, several seconds of
    ``ensurepip``): the tests that need a fresh one get a copy (``copy_venv(venv_template, path)``)."""
    template = tmp_path_factory.mktemp("venv-template") / "venv"
    fresh_venv(template)
    return template


@pytest.fixture(scope="session")
def wheel_venv(
    flask_gateway_wheel: Path, venv_template: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The bin folder of a fresh virtual environment that has the wheel installed, with its dependencies
    from the package index, and nothing of the repository: ``wheel_venv / "python"``, ``wheel_venv /
    "flask"``, ``wheel_venv / "pip"``. Shared by the whole session: a test that installs more into it
    (``pip install flask-migrate``) does so for the tests after it. Run things there from a folder outside
    the repository (``tmp_path``), and with ``python -I`` where ``PYTHONPATH`` might lead back to it."""
    python = copy_venv(
        venv_template, tmp_path_factory.mktemp("wheel-venv") / "venv", str(flask_gateway_wheel)
    )
    return python.parent
