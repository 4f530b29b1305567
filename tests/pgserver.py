"""A real PostgreSQL 15 for the test session (a pytest plugin, loaded by tests/conftest.py).

`pg_server`: one server per session, made with Debian's `initdb` in a temporary folder,
listening on 127.0.0.1 on a free port only (no Unix socket), trust authentication, stopped
and removed at the end of the session. PostgreSQL refuses to run as root: as root the
server's processes run as `nobody`, who owns its data folder.

`pg_url`: a fresh, empty database per test. `state_url`: the state-store URL of a fresh
store, once on SQLite (a file under tmp_path) and once on PostgreSQL (a copy of a migrated
template database); tests that take it run on both. Without the binaries the PostgreSQL
cases skip, saying so.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest

PG_BIN = Path(os.environ.get("AICLUSTER_PG_BIN", "/usr/lib/postgresql/15/bin"))
RUN_AS = "nobody"  # when the tests run as root


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PgServer:
    """A throwaway PostgreSQL cluster: `start`, `create_database`, `stop`."""

    def __init__(self, folder: Path, bin_dir: Path = PG_BIN):
        self.folder = folder
        self.bin = bin_dir
        self.data = folder / "data"
        self.port = 0
        self._user = pwd.getpwnam(RUN_AS) if os.geteuid() == 0 else None
        self._admin = None

    def _run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        kw = {}
        if self._user is not None:
            kw = dict(user=self._user.pw_uid, group=self._user.pw_gid, extra_groups=[])
        return subprocess.run(
            [str(a) for a in args],
            cwd=self.folder,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env={"PATH": "/usr/bin:/bin", "LC_ALL": "C", "LANG": "C"},
            **kw,
        )

    def _check(self, proc: subprocess.CompletedProcess, what: str) -> None:
        if proc.returncode != 0:
            raise RuntimeError(f"{what} failed ({proc.returncode}): {proc.stdout}{proc.stderr}")

    def start(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        if self._user is not None:
            os.chown(self.folder, self._user.pw_uid, self._user.pw_gid)
        self._check(
            self._run(
                self.bin / "initdb",
                "-D",
                self.data,
                "-U",
                "postgres",
                "--auth=trust",
                "--no-locale",
                "--encoding=UTF8",
                "--no-sync",
            ),
            "initdb",
        )
        for _ in range(5):  # the free port may be taken before the server binds it
            self.port = _free_port()
            opts = (
                f"-c listen_addresses=127.0.0.1 -c port={self.port} "
                "-c unix_socket_directories='' -c fsync=off -c synchronous_commit=off "
                "-c full_page_writes=off -c max_connections=300"
            )
            proc = self._run(
                self.bin / "pg_ctl",
                "-D",
                self.data,
                "-l",
                self.folder / "server.log",
                "-o",
                opts,
                "-w",
                "-t",
                "60",
                "start",
            )
            if proc.returncode == 0:
                return
        self._check(proc, f"pg_ctl start (log: {self.folder / 'server.log'})")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def _execute(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(self.url().replace("+psycopg", ""), autocommit=True) as conn:
            conn.execute(sql)

    def create_database(self, template: str | None = None) -> str:
        """A new database (a copy of `template` when given, which must have no sessions)."""
        name = "t_" + secrets.token_hex(6)
        self._execute(f"CREATE DATABASE {name}" + (f" TEMPLATE {template}" if template else ""))
        return self.url(name)

    def stop(self) -> None:
        self._run(self.bin / "pg_ctl", "-D", self.data, "-m", "immediate", "-w", "stop")

    def restart(self) -> None:
        """A crash and a restart on the same port (pg_ctl reuses the options it started
        with): every session is cut (`immediate`: no checkpoint, as after a power cut)."""
        proc = self._run(
            self.bin / "pg_ctl",
            "-D",
            self.data,
            "-l",
            self.folder / "server.log",  # else the server holds our output pipe open
            "-m",
            "immediate",
            "-w",
            "-t",
            "60",
            "restart",
        )
        self._check(proc, f"pg_ctl restart (log: {self.folder / 'server.log'})")


@pytest.fixture(scope="session")
def pg_server():
    if not (PG_BIN / "initdb").exists() or not (PG_BIN / "pg_ctl").exists():
        pytest.skip(f"PostgreSQL 15 is not installed ({PG_BIN}/initdb; `make test` installs it)")
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(RUN_AS)
        except KeyError:
            pytest.skip(f"running as root without a {RUN_AS!r} user to run PostgreSQL as")
    folder = Path(tempfile.mkdtemp(prefix="aic-pg-"))
    server = PgServer(folder)
    try:
        server.start()
        yield server
    finally:
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def pg_template(pg_server) -> str:
    """The name of a database migrated to the newest revision, to copy per test."""
    from aicluster.store import open_store

    url = pg_server.create_database()
    open_store(url).close()  # close: a template must have no sessions
    return url.rsplit("/", 1)[1]


@pytest.fixture
def pg_url(pg_server) -> str:
    """A fresh, empty PostgreSQL database."""
    return pg_server.create_database()


@pytest.fixture(params=["sqlite", "postgresql"])
def state_url(request, tmp_path) -> str:
    """A fresh state store's URL: a new SQLite file, or a migrated PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 's.db'}"
    server = request.getfixturevalue("pg_server")
    return server.create_database(template=request.getfixturevalue("pg_template"))
