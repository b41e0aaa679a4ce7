"""The localnet's fork server: a neuron forked from it is the process its command line describes
(argv, environment, directory, session, log, exit code, signals), and its end is known even when the
server is gone. These servers preload nothing, so they start in a fraction of a second; the
localnet's own (which loads the neurons' libraries) runs in tests/integration/test_failover.py and
test_localnet.py's real-process run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from templar.localnet.forkserver import UNKNOWN_EXIT, ForkServer, ForkServerError, forkable

pytestmark = pytest.mark.skipif(not ForkServer.supported(), reason="the fork server needs Linux's pidfds")

PROBE = """
import atexit, json, os, sys
from pathlib import Path

def main() -> int:
    Path(os.environ["TEMPLAR_PROBE_OUT"]).write_text(json.dumps({
        "argv": sys.argv, "name": __name__, "cwd": os.getcwd(), "path0": sys.path[0],
        "env": dict(os.environ), "session_leader": os.getsid(0) == os.getpid(),
        "stdin": sys.stdin.read()}))
    print("to stdout", flush=True)
    print("to stderr", file=sys.stderr, flush=True)
    atexit.register(lambda: print("atexit ran", flush=True))
    mode = sys.argv[1] if len(sys.argv) > 1 else "exit"
    if mode == "raise":
        raise RuntimeError("the entry point failed")
    if mode == "sleep":
        import time
        time.sleep(60)
    return 3

if __name__ == "__main__":
    sys.exit(main())
"""


@pytest.fixture
def server(tmp_path):
    env = {**os.environ, "TEMPLAR_FORK_TEST": "server"}
    fork_server = ForkServer(env, tmp_path / "forkserver.log", preload=())
    fork_server.start()
    yield fork_server
    fork_server.close()


def test_a_forked_neuron_is_the_process_its_command_line_describes(server, tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    env = {k: v for k, v in server.env.items() if k != "TEMPLAR_FORK_TEST"}  # a variable unset, too
    env["TEMPLAR_PROBE_OUT"] = str(tmp_path / "seen.json")
    proc = server.spawn([sys.executable, str(script), "exit", "--flag"], env, elsewhere, tmp_path / "stdout.log")
    assert proc.wait(timeout=60) == 3 and proc.poll() == 3 and proc.returncode == 3
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert seen["argv"] == [str(script), "exit", "--flag"] and seen["name"] == "__main__"
    assert seen["cwd"] == str(elsewhere) and seen["path0"] == str(tmp_path)
    assert seen["env"] == env  # exactly its own environment: TEMPLAR_FORK_TEST is gone
    assert seen["session_leader"] and seen["stdin"] == ""
    log = (tmp_path / "stdout.log").read_text()
    assert "to stdout" in log and "to stderr" in log and "atexit ran" in log  # the interpreter's own exit

    # `-m module`, an exception (a traceback and 1, as `python` says), appended to the same log
    env["TEMPLAR_PROBE_OUT"] = str(tmp_path / "seen-m.json")
    proc = server.spawn([sys.executable, "-m", "probe", "raise"], env, tmp_path, tmp_path / "stdout.log")
    assert proc.wait(timeout=60) == 1
    seen = json.loads((tmp_path / "seen-m.json").read_text())
    assert seen["argv"][0].endswith("probe.py") and seen["argv"][1:] == ["raise"] and seen["path0"] == str(tmp_path)
    log = (tmp_path / "stdout.log").read_text()
    assert log.count("to stdout") == 2 and "RuntimeError: the entry point failed" in log


def test_signals_timeouts_and_a_server_killed_under_its_neurons(server, tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    env = {**server.env, "TEMPLAR_PROBE_OUT": str(tmp_path / "seen.json")}
    proc = server.spawn([sys.executable, str(script), "sleep"], env, tmp_path, tmp_path / "stdout.log")
    assert proc.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=0.3)
    os.killpg(proc.pid, signal.SIGKILL)  # its own process group: the localnet's kill -9
    assert proc.wait(timeout=30) == -signal.SIGKILL

    proc = server.spawn([sys.executable, str(script), "sleep"], env, tmp_path, tmp_path / "stdout.log")
    proc.terminate()
    assert proc.wait(timeout=30) == -signal.SIGTERM

    sleeper = tmp_path / "sleeper.py"
    sleeper.write_text("import time\ntime.sleep(60)\n")
    for _ in range(10):  # its group exists as soon as its pid is known (before: killpg missed it 20 in 20)
        proc = server.spawn([sys.executable, str(sleeper)], env, tmp_path, tmp_path / "stdout.log")
        os.killpg(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL

    # The server killed -9 while a neuron runs: the neuron runs on, and its end is still seen.
    proc = server.spawn([sys.executable, str(script), "sleep"], env, tmp_path, tmp_path / "stdout.log")
    server._proc.kill()
    server._proc.wait()
    time.sleep(0.3)
    assert proc.poll() is None
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=30) == UNKNOWN_EXIT
    with pytest.raises(ForkServerError, match="not running"):
        server.spawn([sys.executable, str(script)], env, tmp_path, tmp_path / "stdout.log")


def test_only_the_projects_own_variables_may_differ():
    base = {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TEMPLAR_BUCKET": "a"}
    assert forkable(base, {**base, "TEMPLAR_BUCKET": "b", "TEMPLAR_BUCKET_WRITE_SECRET": "s"})
    assert forkable(base, {k: v for k, v in base.items() if k != "TEMPLAR_BUCKET"})
    assert not forkable(base, {**base, "OMP_NUM_THREADS": "4"})  # libgomp read it when torch loaded
    assert not forkable(base, {k: v for k, v in base.items() if k != "HF_HUB_OFFLINE"})
    assert not forkable(base, {**base, "PYTHONPATH": "/elsewhere"})


def test_a_bad_request_or_a_failed_start_is_refused_with_a_reason(server, tmp_path):
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:  # not JSON: dropped, the server serves on
        conn.connect(str(server.socket_path))
        conn.sendall(b"\x00\xff garbage\n")
        assert conn.recv(100) == b""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:  # argv of the wrong shape
        conn.connect(str(server.socket_path))
        conn.sendall(json.dumps({"argv": [sys.executable], "env": {}, "cwd": "/", "stdout": "/dev/null"}).encode() + b"\n")
        assert conn.recv(100) == b""
    with pytest.raises(ForkServerError, match="read at import"):
        server.spawn([sys.executable, "-c", "pass"], {**server.env, "OMP_NUM_THREADS": "7"}, tmp_path, tmp_path / "x.log")
    script = tmp_path / "ok.py"
    script.write_text("raise SystemExit(0)\n")
    assert server.spawn([sys.executable, str(script)], server.env, tmp_path, tmp_path / "x.log").wait(timeout=30) == 0
    assert "a request refused" in (tmp_path / "forkserver.log").read_text()

    broken = ForkServer(dict(os.environ), tmp_path / "broken.log", preload=("templar.no_such_module",))
    with pytest.raises(ForkServerError, match="while loading its libraries"):
        broken.start()
    assert "No module named 'templar.no_such_module'" in (tmp_path / "broken.log").read_text()


def test_the_server_exits_once_closed_and_its_last_neuron_has_ended(tmp_path):
    fork_server = ForkServer(dict(os.environ), tmp_path / "forkserver.log", preload=())
    fork_server.start()
    script = tmp_path / "wait.py"
    script.write_text("import time\ntime.sleep(1.0)\n")
    proc = fork_server.spawn([sys.executable, str(script)], fork_server.env, tmp_path, tmp_path / "out.log")
    fork_server.close(timeout=0.1)  # stops taking requests, but waits for its neuron
    assert fork_server._proc.poll() is None
    assert proc.wait(timeout=30) == 0
    assert fork_server._proc.wait(timeout=30) == 0


def test_the_localnet_forks_only_when_asked_and_able(tmp_path):
    from templar.localnet.runner import Localnet, LocalnetConfig

    assert Localnet(LocalnetConfig(out=tmp_path / "a", fork_server=False))._fork_server() is None
    net = Localnet(LocalnetConfig(out=tmp_path / "b"))
    assert net.cfg.fork_server and forkable(net.base_env(), {**net.base_env(), "TEMPLAR_BUCKET_WRITE_SECRET": "k"})
