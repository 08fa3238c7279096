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
    _to_drop: queue.Queue[str | None] = field(default_factory=queue.Queue)
    _dropper: threading.Thread | None = None
    #: Databases the background thread could not drop (reported, never raised).
    drop_errors: list[str] = field(default_factory=list)
    #: Template databases by schema key (``tests/conftest.py``'s ``SchemaTemplates``): never dropped.
    templates: dict[str, str] = field(default_factory=dict)

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

    def drop_database(self, name: str, *, wait: bool = True) -> None:
        """Drop a database made by ``create_database`` (connections still open to it are ended).

        ``wait=False``: dropped by a background thread while the caller goes on (``stop`` waits for it).
        """
        if wait:
            self._admin("create").execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            return
        if self._dropper is None:
            self._dropper = threading.Thread(target=self._drop_queued, name="drop-databases", daemon=True)
            self._dropper.start()
        self._to_drop.put(name)

    def _drop_queued(self) -> None:
        while (name := self._to_drop.get()) is not None:
            try:
                self._admin("dropper").execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            except Exception as exc:  # the cluster is thrown away anyway: never stop dropping the rest
                self.drop_errors.append(f"{name}: {exc}")
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
