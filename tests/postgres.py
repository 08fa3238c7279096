"""A throwaway PostgreSQL cluster for the tests: initdb + pg_ctl on a free loopback port, removed afterwards.

Uses the installed PostgreSQL binaries (``/usr/lib/postgresql/<version>/bin`` or ``pg_config --bindir``);
``scripts/ensure-system-packages`` installs PostgreSQL when it is missing. initdb refuses to run as root,
so as root the cluster runs as the ``postgres`` system user.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from tests.processes import free_port


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
    _as_user: list[str] = field(default_factory=list)

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
        self._run(
            str(self.bindir / "initdb"), "-D", str(self.data_dir), "-U", self.user, "-A", "trust",
            "-E", "UTF8", "--no-sync", "--locale=C",
        )  # fmt: skip
        options = (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
        )
        self._run(
            str(self.bindir / "pg_ctl"), "-D", str(self.data_dir), "-o", options, "-l", str(self.root / "log"),
            "-w", "-t", "60", "start",
        )  # fmt: skip

    def create_database(self, name: str | None = None) -> str:
        """A fresh, empty database; returns its SQLAlchemy URL."""
        import psycopg

        name = name or f"t_{uuid.uuid4().hex[:16]}"
        with psycopg.connect(
            host="127.0.0.1", port=self.port, user=self.user, dbname="postgres", autocommit=True
        ) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        try:
            self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data_dir), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


def start_cluster() -> PostgresCluster:
    bindir = find_bindir()
    if bindir is None:
        raise RuntimeError("PostgreSQL is not installed: run scripts/ensure-system-packages (make test does)")
    root = Path(tempfile.mkdtemp(prefix="flask-gateway-pg-"))
    as_user: list[str] = []
    if os.geteuid() == 0:
        owner = pwd.getpwnam("postgres")
        os.chown(root, owner.pw_uid, owner.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    cluster = PostgresCluster(bindir=bindir, root=root, port=free_port(), _as_user=as_user)
    try:
        cluster.start()
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    return cluster
