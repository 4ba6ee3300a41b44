"""A PostgreSQL server of a test's or a drill's own: Debian's ``postgresql`` binaries, ``initdb``
into a directory of its own and ``pg_ctl`` on a free port of 127.0.0.1 (as ``nobody`` when run as
root: the server refuses root), trust authentication for its superuser ``sparkwal``, listening on
127.0.0.1 only."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile

from sparkwal.engine import EngineError


def bin_dir() -> str:
    """Where Debian's package puts the server's programs (not on PATH: pg_wrapper's layout)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found:
        on_path = shutil.which("initdb")
        if on_path is None:
            raise PostgresServerError("PostgreSQL's server is not installed: apt-get install postgresql "
                                      "(the README's test command does)")
        return os.path.dirname(on_path)
    return os.path.dirname(found[-1])


class PostgresServerError(EngineError, RuntimeError):
    """The server's programs are missing or failed (the message says which and how)."""


class PostgresCluster:
    """``initdb`` done on creation (in a new temporary directory: not under a root-only one, which
    ``nobody`` could not enter); :meth:`start`, :meth:`stop`, :meth:`remove` (stops and deletes)."""

    def __init__(self):
        self.bin = bin_dir()
        self.base = tempfile.mkdtemp(prefix="sparkwal-pg-")
        os.chmod(self.base, 0o755)
        self.data = os.path.join(self.base, "data")
        self.user = pwd.getpwnam("nobody") if os.geteuid() == 0 else None
        if self.user is not None:
            os.chown(self.base, self.user.pw_uid, self.user.pw_gid)
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self._run("initdb", "-D", self.data, "-U", "sparkwal", "--auth=trust", "-E", "UTF8")

    @property
    def conninfo(self) -> str:
        return f"host=127.0.0.1 port={self.port} user=sparkwal dbname=postgres"

    def _run(self, program: str, *args: str) -> None:
        ids = {} if self.user is None else {"user": self.user.pw_uid, "group": self.user.pw_gid, "extra_groups": []}
        out = subprocess.run([os.path.join(self.bin, program), *args], capture_output=True, text=True,
                             timeout=120, start_new_session=True, **ids)
        if out.returncode != 0:
            raise PostgresServerError(f"{program} failed ({out.returncode}): {out.stderr.strip()[-500:]}")

    def start(self) -> None:
        self._run("pg_ctl", "-D", self.data, "-l", os.path.join(self.base, "server.log"), "-w", "-o",
                  f"-h 127.0.0.1 -p {self.port} -k {self.base}", "start")

    def stop(self) -> None:
        self._run("pg_ctl", "-D", self.data, "-m", "fast", "-w", "stop")

    def remove(self) -> None:
        try:
            self._run("pg_ctl", "-D", self.data, "-m", "immediate", "-w", "stop")
        except PostgresServerError:
            pass  # not running
        shutil.rmtree(self.base, ignore_errors=True)
