"""A throwaway PostgreSQL cluster for the tests: initdb + pg_ctl on a free loopback port, removed afterwards.

Uses the installed PostgreSQL binaries (``/usr/lib/postgresql/<version>/bin`` or ``pg_config --bindir``);
``scripts/ensure-system-packages`` installs PostgreSQL when it is missing. initdb refuses to run as root,
so as root the cluster runs as the ``postgres`` system user.

The session's cluster trades durability for speed (``fsync=off``). A fault test that crashes the server
(``restart("immediate")``: no checkpoint, crash recovery at the start) wants a cluster of its own that keeps
what it acknowledged: ``start_cluster(durable=True)`` (fsync, synchronous commit and full page writes on,
as in production). ``stop_server``/``start_server``/``restart`` take the server away and bring it back on
the same port and data directory, as an operator's ``pg_ctl`` does.
"""

from __future__ import annotations

import os
import pwd
import queue
import shutil
import subprocess
import tempfile
import threading
import uuid
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from tests.processes import free_port

#: The cluster's ``TimeZone``: sessions see timestamps in it unless the application takes care.
TIMEZONE = "America/St_Johns"

#: ``pg_ctl``'s shutdown modes: ``smart`` waits for the clients to leave, ``fast`` ends their sessions
#: (a clean shutdown, with a checkpoint), ``immediate`` kills the server (crash recovery at the next start).
ShutdownMode = Literal["smart", "fast", "immediate"]


#: Everything a database holds besides its rows, one text a line, in a stable order: its schemas, relations
#: (kind, persistence, owner, privileges), columns (type, nullability, default, identity, generation),
#: indexes, constraints, triggers, functions, types, sequences' parameters, extensions, rules, policies,
#: comments, large objects, publications and its own settings. Two databases that answer the same are
#: shaped the same (``PostgresCluster.recycle_database`` compares a used one with its template's).
_SHAPE_SQL = """
WITH user_ns AS (
    SELECT oid, nspname FROM pg_namespace
    WHERE nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast') AND nspname NOT LIKE 'pg_temp_%'
      AND nspname NOT LIKE 'pg_toast_temp_%'
), rels AS (
    SELECT c.oid, c.relname, c.relkind, n.nspname FROM pg_class c JOIN user_ns n ON n.oid = c.relnamespace
)
SELECT 'namespace ' || nspname || ' ' || pg_get_userbyid(n.nspowner) || ' ' || coalesce(n.nspacl::text, '')
FROM pg_namespace n JOIN user_ns USING (nspname)
UNION ALL
SELECT 'relation ' || n.nspname || '.' || c.relname || ' ' || c.relkind::text || ' ' || c.relpersistence::text || ' '
       || pg_get_userbyid(c.relowner) || ' ' || coalesce(c.relacl::text, '') || ' ' || c.relhasrules::text
FROM pg_class c JOIN user_ns n ON n.oid = c.relnamespace
UNION ALL
SELECT 'column ' || r.nspname || '.' || r.relname || '.' || a.attname || ' '
       || format_type(a.atttypid, a.atttypmod) || ' ' || a.attnotnull::text || ' ' || a.attidentity::text
       || ' ' || a.attgenerated::text || ' ' || a.attcollation::text || ' '
       || coalesce(pg_get_expr(d.adbin, d.adrelid), '')
FROM pg_attribute a JOIN rels r ON r.oid = a.attrelid
LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE a.attnum > 0 AND NOT a.attisdropped
UNION ALL
SELECT 'index ' || pg_get_indexdef(i.indexrelid) FROM pg_index i JOIN rels r ON r.oid = i.indrelid
UNION ALL
SELECT 'constraint ' || n.nspname || ' ' || conname || ' ' || contype::text || ' ' || pg_get_constraintdef(c.oid)
FROM pg_constraint c JOIN user_ns n ON n.oid = c.connamespace
UNION ALL
SELECT 'trigger ' || pg_get_triggerdef(t.oid) FROM pg_trigger t JOIN rels r ON r.oid = t.tgrelid
WHERE NOT t.tgisinternal
UNION ALL
SELECT 'function ' || p.oid::regprocedure::text || ' ' || md5(coalesce(p.prosrc, ''))
FROM pg_proc p JOIN user_ns n ON n.oid = p.pronamespace
UNION ALL
SELECT 'type ' || n.nspname || '.' || t.typname || ' ' || t.typtype::text
FROM pg_type t JOIN user_ns n ON n.oid = t.typnamespace
UNION ALL
SELECT 'sequence ' || r.nspname || '.' || r.relname || ' ' || s.seqtypid::regtype::text || ' ' || s.seqstart || ' '
       || s.seqincrement || ' ' || s.seqmin || ' ' || s.seqmax || ' ' || s.seqcache || ' ' || s.seqcycle::text
FROM pg_sequence s JOIN rels r ON r.oid = s.seqrelid
UNION ALL
SELECT 'extension ' || extname || ' ' || extversion FROM pg_extension
UNION ALL
SELECT 'rule ' || r.nspname || '.' || r.relname || ' ' || w.rulename FROM pg_rewrite w JOIN rels r ON r.oid = w.ev_class
UNION ALL
SELECT 'policy ' || r.nspname || '.' || r.relname || ' ' || p.polname FROM pg_policy p JOIN rels r ON r.oid = p.polrelid
UNION ALL
SELECT 'comment ' || d.classoid::regclass::text || ' ' || d.objoid || ' ' || d.objsubid || ' ' || md5(d.description)
FROM pg_description d JOIN rels r ON r.oid = d.objoid
UNION ALL
SELECT 'large objects ' || count(*) FROM pg_largeobject_metadata
UNION ALL
SELECT 'publications ' || count(*) FROM pg_publication
UNION ALL
SELECT 'settings ' || coalesce(array_to_string(s.setconfig, ','), '') FROM pg_db_role_setting s
JOIN pg_database d ON d.oid = s.setdatabase WHERE d.datname = current_database()
UNION ALL
SELECT 'database ' || datconnlimit || ' ' || pg_get_userbyid(datdba) || ' ' || coalesce(datacl::text, '')
FROM pg_database WHERE datname = current_database()
"""

#: The tables and sequences of a database (schema-qualified, quoted), and whether each was written to since
#: it was copied: a table whose heap or TOAST table has a page (a template's tables have none), a sequence
#: that handed out a value. Only those a recycled database truncates and restarts.
_TABLES_SQL = """
SELECT format('%I.%I', n.nspname, c.relname), c.relkind = 'S',
       CASE WHEN c.relkind = 'S' THEN pg_sequence_last_value(c.oid) IS NOT NULL
            ELSE pg_relation_size(c.oid) + coalesce(pg_total_relation_size(nullif(c.reltoastrelid, 0)), 0) > 0
       END
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'p', 'S')
  AND n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast') AND n.nspname NOT LIKE 'pg_temp_%'
  AND n.nspname NOT LIKE 'pg_toast_temp_%'
"""


@dataclass(frozen=True)
class DatabaseShape:
    """What ``_SHAPE_SQL`` answered for a database, and its tables and sequences."""

    lines: tuple[str, ...]
    tables: tuple[str, ...]
    sequences: tuple[str, ...]


def database_shape(connection: Any) -> DatabaseShape:
    """The shape of the database of ``connection`` (a psycopg connection)."""
    lines = tuple(sorted(str(row[0]) for row in connection.execute(_SHAPE_SQL).fetchall()))
    found = connection.execute(_TABLES_SQL).fetchall()
    tables = tuple(sorted(name for name, sequence, _written in found if not sequence))
    sequences = tuple(sorted(name for name, sequence, _written in found if sequence))
    return DatabaseShape(lines=lines, tables=tables, sequences=sequences)


def written_to(connection: Any) -> tuple[list[str], list[str]]:
    """The tables and the sequences of the database of ``connection`` written to since it was copied."""
    found = connection.execute(_TABLES_SQL).fetchall()
    tables = sorted(name for name, sequence, written in found if written and not sequence)
    sequences = sorted(name for name, sequence, written in found if written and sequence)
    return tables, sequences


def find_bindir() -> Path | None:
    candidates = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parent.name), reverse=True
    )
    for candidate in candidates:
        if (candidate / "initdb").exists():
            return candidate
    pg_config = shutil.which("pg_config")
    if pg_config:
        bindir = Path(
            subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=True).stdout.strip()
        )
        if (bindir / "initdb").exists():
            return bindir
    return None


@dataclass
class PostgresCluster:
    bindir: Path
    root: Path
    port: int
    user: str = "gateway"
    #: fsync, synchronous commit and full page writes on (else off: fast, and lost in a crash).
    durable: bool = False
    _as_user: list[str] = field(default_factory=list)
    _connections: dict[str, Any] = field(default_factory=dict)
    _to_drop: queue.Queue[Callable[[], None] | None] = field(default_factory=queue.Queue)
    _dropper: threading.Thread | None = None
    #: Databases the background thread could not drop (reported, never raised).
    drop_errors: list[str] = field(default_factory=list)
    #: Template databases by schema key (``tests/conftest.py``'s ``SchemaTemplates``): never dropped.
    templates: dict[str, str] = field(default_factory=dict)
    #: The shape of each template (by schema key): what a database copied from it is recycled against.
    template_shapes: dict[str, DatabaseShape] = field(default_factory=dict)
    #: Databases used by a test and emptied since, by schema key: ready for another test
    #: (``recycle_database``, ``reuse_database``). No connection is allowed to them while they wait.
    _recycled: dict[str, list[str]] = field(default_factory=dict)
    _recycled_lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://{self.user}@127.0.0.1:{self.port}/{database}"

    def _run(self, *args: str) -> None:
        result = subprocess.run([*self._as_user, *args], capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(args[:2])} failed:\n{result.stdout}\n{result.stderr}")

    def start(self) -> None:
        """initdb, then start the server."""
        self._run(
            str(self.bindir / "initdb"), "-D", str(self.data_dir), "-U", self.user, "-A", "trust",
            "-E", "UTF8", "--no-sync", "--locale=C",
        )  # fmt: skip
        self.start_server()

    @property
    def options(self) -> str:
        """The server's command-line options (``pg_ctl -o``)."""
        durability = (
            "-c fsync=on -c synchronous_commit=on -c full_page_writes=on"
            if self.durable
            else "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        )
        return (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 {durability} -c max_connections=200 "
            # Not UTC (and not a whole hour off): a timestamp that loses its zone on the way shows.
            f"-c timezone={TIMEZONE}"
        )

    def _pg_ctl(self, *args: str) -> None:
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data_dir), *args)

    def start_server(self) -> None:
        """Start the server (its data directory exists); returns once it accepts connections."""
        self._pg_ctl("-o", self.options, "-l", str(self.root / "log"), "-w", "-t", "60", "start")

    def stop_server(self, mode: ShutdownMode = "fast") -> None:
        """Stop the server (``pg_ctl stop -m mode``); the data directory stays, ``start_server`` resumes."""
        self._forget_connections()
        self._pg_ctl("-m", mode, "-w", "-t", "60", "stop")

    def restart(self, mode: ShutdownMode = "fast") -> None:
        """``pg_ctl restart -m mode``: every client's connection is broken; returns once the server accepts
        connections again (after crash recovery, for ``immediate``)."""
        self._forget_connections()
        self._pg_ctl(
            "-m", mode, "-o", self.options, "-l", str(self.root / "log"), "-w", "-t", "60", "restart"
        )  # fmt: skip

    def is_running(self) -> bool:
        """Whether the server runs (``pg_ctl status``: 0 running, 3 not)."""
        result = subprocess.run(
            [*self._as_user, str(self.bindir / "pg_ctl"), "-D", str(self.data_dir), "status"],
            capture_output=True,
            text=True,
        )
        return result.returncode == 0

    def _forget_connections(self) -> None:
        """Close the kept admin connections: a restart breaks them, and ``_admin`` opens new ones."""
        for connection in self._connections.values():
            with suppress(Exception):
                connection.close()
        self._connections.clear()

    def _admin(self, slot: str) -> Any:
        """A kept-open autocommit connection to the ``postgres`` database (one per ``slot``: per thread)."""
        import psycopg

        connection = self._connections.get(slot)
        if connection is None or connection.closed:
            connection = self._connections[slot] = psycopg.connect(
                host="127.0.0.1", port=self.port, user=self.user, dbname="postgres", autocommit=True
            )
        return connection

    def create_database(self, name: str | None = None, *, template: str | None = None) -> str:
        """A fresh, empty database; returns its SQLAlchemy URL. ``template``: a copy of that database
        instead (``CREATE DATABASE ... TEMPLATE``: no connection may be open to it meanwhile)."""
        name = name or f"t_{uuid.uuid4().hex[:16]}"
        copy_of = f' TEMPLATE "{template}"' if template else ""
        self._admin("create").execute(f'CREATE DATABASE "{name}"{copy_of}')
        return self.url(name)

    def shape_of(self, name: str) -> DatabaseShape:
        """The shape of the database ``name`` (``_SHAPE_SQL``), on a connection of its own, closed after."""
        import psycopg

        with psycopg.connect(
            host="127.0.0.1", port=self.port, user=self.user, dbname=name, autocommit=True
        ) as connection:
            return database_shape(connection)

    def drop_database(self, name: str, *, wait: bool = True) -> None:
        """Drop a database made by ``create_database`` (connections still open to it are ended).

        ``wait=False``: dropped by a background thread while the caller goes on (``stop`` waits for it).
        """
        if wait:
            self._admin("create").execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            return
        self._in_background(lambda: self._drop_now(name))

    def _drop_now(self, name: str) -> None:
        try:
            self._admin("dropper").execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        except Exception as exc:  # the cluster is thrown away anyway: never stop dropping the rest
            self.drop_errors.append(f"{name}: {exc}")

    def recycle_database(self, name: str, key: str) -> None:
        """A test is done with ``name``, a copy of the template of ``key`` (``template_shapes[key]``): in the
        background, empty it for another test, or drop it.

        It is kept only when nothing is connected to it any more (connections are refused from the
        start: none can come back), no prepared transaction is left, and it is shaped exactly as the
        template (``_SHAPE_SQL``: every table, column, index, constraint, sequence, function, type,
        setting). Then every table written to is truncated (new, empty data files) and every sequence that
        handed out a value restarted, as in a fresh copy, and it waits for ``reuse_database``. Anything
        else, or any error: dropped.
        """
        self._in_background(lambda: self._recycle_now(name, key))

    def _recycle_now(self, name: str, key: str) -> None:
        import psycopg

        expected = self.template_shapes.get(key)
        kept = False
        try:
            if expected is not None:
                with psycopg.connect(
                    host="127.0.0.1", port=self.port, user=self.user, dbname=name, autocommit=True
                ) as connection:
                    admin = self._admin("dropper")
                    admin.execute(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS false')
                    others = admin.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> %s",
                        (name, connection.info.backend_pid),
                    ).fetchone()
                    prepared = admin.execute(
                        "SELECT count(*) FROM pg_prepared_xacts WHERE database = %s", (name,)
                    ).fetchone()
                    if others == (0,) and prepared == (0,) and database_shape(connection) == expected:
                        tables, sequences = written_to(connection)
                        with connection.transaction():
                            if tables:  # CASCADE: with the tables whose foreign keys point at them
                                connection.execute(f"TRUNCATE {', '.join(tables)} CASCADE")
                            for sequence in sequences:
                                connection.execute(f"ALTER SEQUENCE {sequence} RESTART")
                        kept = True
        except Exception:  # dropped below, as a database nobody recycles would be
            kept = False
        if kept:
            with self._recycled_lock:
                self._recycled.setdefault(key, []).append(name)
        else:
            self._drop_now(name)

    def reuse_database(self, key: str) -> str | None:
        """A database recycled from the template of ``key`` (connections allowed again), or None."""
        with self._recycled_lock:
            waiting = self._recycled.get(key)
            name = waiting.pop() if waiting else None
        if name is None:
            return None
        self._admin("create").execute(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS true')
        return self.url(name)

    def _in_background(self, job: Callable[[], None]) -> None:
        if self._dropper is None:
            self._dropper = threading.Thread(target=self._drop_queued, name="drop-databases", daemon=True)
            self._dropper.start()
        self._to_drop.put(job)

    def _drop_queued(self) -> None:
        while (job := self._to_drop.get()) is not None:
            try:
                job()
            finally:
                self._to_drop.task_done()

    def stop(self) -> None:
        try:
            if self._dropper is not None:
                self._to_drop.put(None)
                self._dropper.join(60)
            self._forget_connections()
            if self.is_running():  # a fault test may have left it stopped
                self._pg_ctl("-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


def start_cluster(*, durable: bool = False) -> PostgresCluster:
    """A new cluster, started (``durable``: fsync and synchronous commit on, see the module's docstring)."""
    bindir = find_bindir()
    if bindir is None:
        raise RuntimeError("PostgreSQL is not installed: run scripts/ensure-system-packages (make test does)")
    root = Path(tempfile.mkdtemp(prefix="flask-gateway-pg-"))
    as_user: list[str] = []
    if os.geteuid() == 0:
        owner = pwd.getpwnam("postgres")
        os.chown(root, owner.pw_uid, owner.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    cluster = PostgresCluster(bindir=bindir, root=root, port=free_port(), durable=durable, _as_user=as_user)
    try:
        cluster.start()
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    return cluster
