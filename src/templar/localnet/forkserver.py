"""Neurons forked from one interpreter that has already loaded torch, transformers and the chain SDK.

A neuron's process spends about 4-5 s of CPU importing its libraries before it does anything. A
localnet starts several at once: on 2 cores its 8 neurons' imports held both cores for about 20 s
before the first window. The fork server (`python -m templar.localnet.forkserver SOCKET`) loads them
once. Each neuron is then a fork of it that runs its entry point (`neurons/miner.py`,
`-m templar.localnet.adversary`, ...) as `__main__` with its own arguments, environment, working
directory, session and log: the code and flags an operator's command runs, started in milliseconds,
sharing the libraries' memory until it writes to it, and ending through the interpreter's normal exit
(threads joined, `atexit` handlers run).

What a fork cannot give a neuron is what a library read from the environment while it was imported
(`OMP_NUM_THREADS`, `HF_HUB_OFFLINE`, ...). So a neuron is forked only when its environment differs
from the server's in the project's own `TEMPLAR_*` variables, which nothing reads at import
(`forkable`); the localnet starts any other by exec, as it starts torchrun's nodes.

The protocol, over a Unix socket in a private directory, one connection per neuron: the client sends
one JSON line (argv, env, cwd, stdout); the server forks and answers `{"pid": N}`, then, when it has
reaped the neuron, `{"returncode": R}` (negative: the signal that ended it, as `subprocess` says).
`ForkedProcess` reads that connection and answers like a `subprocess.Popen`. The server stops taking
requests when its client closes its stdin (or dies), and exits once its last neuron has.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import runpy
import select
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

PRELOAD = ("templar.miner.loop", "templar.validator.loop", "templar.distributed.launch",
           "templar.localnet.adversaries", "templar.localnet.behaviours", "templar.runtime.flags")
"""What the entry points load after their flags are checked: imported once by the server."""

REQUEST_LIMIT_BYTES = 1 << 20
"""The longest request line the server reads (a neuron's argv and environment: a few kB)."""

UNKNOWN_EXIT = 255
"""A forked neuron's return code when the server was killed before it: its real status is lost."""

_RUN_TIME_PREFIX = "TEMPLAR_"
_REAP_SECONDS = 0.2
_REQUEST_TIMEOUT_S = 10.0
_SOCKET_NAME = "forkserver.sock"


class ForkServerError(RuntimeError):
    """The fork server did not start, or refused a neuron."""


def forkable(server_env: Mapping[str, str], env: Mapping[str, str]) -> bool:
    """Whether a neuron with environment `env` may be forked from a server started with `server_env`:
    every variable they disagree on (set, unset or changed) is one of the project's `TEMPLAR_*`,
    which are read when a neuron runs, never when a library is imported."""
    differ = {k for k in server_env.keys() | env.keys() if server_env.get(k) != env.get(k)}
    return all(k.startswith(_RUN_TIME_PREFIX) for k in differ)


class ForkedProcess:
    """A neuron forked by the server, answering as much of `subprocess.Popen` as the localnet uses."""

    def __init__(self, args: Sequence[str], conn: socket.socket, pid: int):
        self.args = list(args)
        self.pid = pid
        self.returncode: int | None = None
        self._conn = conn
        self._buffer = b""
        # The neuron itself, for when the server is gone: its pid cannot be reused while the server
        # holds it unreaped, and this descriptor stays on that process after it is.
        try:
            self._pidfd: int | None = os.pidfd_open(pid)
        except ProcessLookupError:  # it has already ended and been reaped: its code is on the way
            self._pidfd = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self._read(0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        until = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if until is None else until - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self._read(left)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        """Through the pidfd where there is one: never a process that reused the pid."""
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                if self._pidfd is not None:
                    signal.pidfd_send_signal(self._pidfd, sig)
                else:
                    os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def _read(self, timeout: float | None) -> None:
        if self._conn is None:  # the server is gone: the neuron's end is all that can be known
            if self._pidfd is None or select.select([self._pidfd], [], [], timeout)[0]:
                self._finish(UNKNOWN_EXIT)
            return
        if not select.select([self._conn], [], [], timeout)[0]:
            return
        chunk = self._conn.recv(4096)
        if not chunk:
            self._conn.close()
            self._conn = None
            self._read(0.0)
            return
        self._buffer += chunk
        while b"\n" in self._buffer:
            line, self._buffer = self._buffer.split(b"\n", 1)
            message = json.loads(line)
            if "returncode" in message:
                self._finish(int(message["returncode"]))

    def _finish(self, code: int) -> None:
        self.returncode = code
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class ForkServer:
    """A running fork server, started by `start` with the environment its neurons share."""

    def __init__(self, env: Mapping[str, str], log_path: Path, *, preload: Sequence[str] = PRELOAD,
                 start_timeout_s: float = 180.0):
        self.env = dict(env)
        self.log_path = Path(log_path)
        self.preload = tuple(preload)
        self.start_timeout_s = start_timeout_s
        self._dir: Path | None = None
        self._proc: subprocess.Popen | None = None

    @staticmethod
    def supported() -> bool:
        """Linux only: the neurons' ends are watched through pidfds (Linux 5.3 and later)."""
        if sys.platform != "linux" or not hasattr(os, "pidfd_open"):
            return False
        try:
            os.close(os.pidfd_open(os.getpid()))
        except OSError:
            return False
        return True

    @property
    def socket_path(self) -> Path:
        assert self._dir is not None, "the fork server is not started"
        return self._dir / _SOCKET_NAME

    def start(self) -> None:
        """Start the server and wait, up to `start_timeout_s`, until its libraries are loaded."""
        self._dir = Path(tempfile.mkdtemp(prefix="templar-forkserver-"))  # 0700: ours alone
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", __spec__.name, str(self.socket_path), *self.preload],
                stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True)
        until = time.monotonic() + self.start_timeout_s
        while not self.socket_path.exists():
            if self._proc.poll() is not None:
                self.close()
                raise ForkServerError(f"the fork server exited with code {self._proc.returncode} while loading "
                                      f"its libraries; see {self.log_path}")
            if time.monotonic() > until:
                self._proc.kill()
                self.close()
                raise ForkServerError(f"the fork server had not loaded its libraries after {self.start_timeout_s:.0f}s")
            time.sleep(0.05)

    def spawn(self, argv: Sequence[str], env: Mapping[str, str], cwd: Path, stdout: Path) -> ForkedProcess:
        """Fork a neuron running `argv` (`[python, script, ...]` or `[python, -m, module, ...]`) in
        its own session, `stdout` and stderr appended to the file `stdout`."""
        if self._proc is None or self._proc.poll() is not None:
            raise ForkServerError("the fork server is not running")
        if not forkable(self.env, env):
            raise ForkServerError("this environment differs from the server's in a variable read at import")
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.settimeout(_REQUEST_TIMEOUT_S)
        try:
            conn.connect(str(self.socket_path))
            conn.sendall(json.dumps({"argv": list(argv), "env": dict(env), "cwd": str(cwd),
                                     "stdout": str(stdout)}).encode() + b"\n")
            answer = b""
            while not answer.endswith(b"\n"):
                chunk = conn.recv(4096)
                if not chunk:
                    raise ForkServerError(f"the fork server refused to start {argv[1:3]}; see {self.log_path}")
                answer += chunk
            pid = int(json.loads(answer)["pid"])
        except (OSError, ValueError, KeyError) as exc:
            conn.close()
            raise ForkServerError(f"the fork server did not start {argv[1:3]}: {exc}") from exc
        conn.settimeout(None)
        return ForkedProcess(argv, conn, pid)

    def close(self, timeout: float = 5.0) -> None:
        """Stop taking requests. The server exits once its running neurons have (they are not
        signalled: stopping them is the caller's business, as it is for `subprocess`)."""
        if self._proc is not None:
            with contextlib.suppress(OSError):
                self._proc.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=timeout)
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)


# ----------------------------------------------------------------------------- the server's side


def _same_user(conn: socket.socket) -> bool:
    """Only this user's processes may start neurons as this user."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return uid == os.getuid()


def _read_request(conn: socket.socket) -> dict | None:
    """One JSON line of argv, env, cwd and stdout, or None (logged) when it is anything else."""
    conn.settimeout(_REQUEST_TIMEOUT_S)
    data = b""
    try:
        if not _same_user(conn):
            print("fork server: a request from another user, refused", flush=True)
            return None
        while not data.endswith(b"\n"):
            chunk = conn.recv(65536)
            if not chunk or len(data) + len(chunk) > REQUEST_LIMIT_BYTES:
                return None
            data += chunk
        request = json.loads(data)
        argv, env = request["argv"], request["env"]
        if not (isinstance(argv, list) and len(argv) >= 2 and all(isinstance(a, str) for a in argv)
                and isinstance(env, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())
                and isinstance(request["cwd"], str) and isinstance(request["stdout"], str)
                and (argv[1] != "-m" or len(argv) >= 3)):
            raise ValueError("argv, env, cwd or stdout of the wrong type")
        return request
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"fork server: a request refused: {exc}", flush=True)
        return None


def _reap(children: dict[int, socket.socket]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.sendall(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
            conn.close()


def _await_session(pid: int, timeout_s: float = 5.0) -> None:
    """Until the forked `pid` leads its own session (its first act), at most `timeout_s`: a client told the
    pid earlier could `killpg` it before the group exists, and miss it."""
    until = time.monotonic() + timeout_s
    while time.monotonic() < until:
        try:
            if os.getsid(pid) == pid:
                return
        except ProcessLookupError:
            return
        time.sleep(0.0005)


def serve(listener: socket.socket) -> dict | None:
    """Fork a neuron for each request until stdin closes and the last neuron has ended. Returns
    None in the server, and the request in each forked neuron (which then runs it)."""
    children: dict[int, socket.socket] = {}
    events = selectors.DefaultSelector()
    events.register(listener, selectors.EVENT_READ, "request")
    events.register(sys.stdin.fileno(), selectors.EVENT_READ, "client")
    accepting = True
    while accepting or children:
        for key, _ in events.select(timeout=_REAP_SECONDS):
            if key.data == "client":
                if not os.read(key.fd, 4096):  # the client closed us, or is gone
                    accepting = False
                    events.unregister(key.fd)
                    events.unregister(listener)
                    listener.close()
                continue
            conn, _ = listener.accept()
            request = _read_request(conn)
            if request is None:
                conn.close()
                continue
            pid = os.fork()
            if pid == 0:
                os.setsid()  # its own session before anyone is told its pid: a kill of its group reaches it
                events.close()
                listener.close()
                for other in children.values():
                    other.close()
                conn.close()
                return request
            children[pid] = conn
            _await_session(pid)
            with contextlib.suppress(OSError):
                conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
        _reap(children)
    return None


def run_entry_point(request: dict) -> None:
    """In a forked neuron: become the process `request` describes, then run its entry point as
    `__main__` (its `sys.exit` ends this process as it would end `python script ...`). Its session is
    its own already (`serve`)."""
    null = os.open(os.devnull, os.O_RDONLY)
    out = os.open(request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(null)
    os.close(out)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    argv = request["argv"][1:]
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        sys.path[0] = os.getcwd()
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = argv
        sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
        runpy.run_path(argv[0], run_name="__main__")


def main(argv: list[str]) -> int:
    from templar.core.startup import libraries_loading

    socket_path, preload = Path(argv[0]), argv[1:]
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")  # as every entry point sets it, before torch loads
    with libraries_loading():
        for name in preload:
            importlib.import_module(name)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    loading = socket_path.with_name(socket_path.name + ".loading")
    listener.bind(str(loading))
    listener.listen(64)
    os.rename(loading, socket_path)  # the client waits for this name: the server is ready
    request = serve(listener)
    if request is not None:
        run_entry_point(request)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
