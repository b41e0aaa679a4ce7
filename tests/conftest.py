"""Shared fixtures: the offline corpus and tokenizer built by scripts/build_assets.py, the tiny
preset, a real sr25519 key, real compressed gradients, and a real SeaweedFS S3 server."""

from __future__ import annotations

import heapq
import itertools
import os
import secrets
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # the fixtures import what they use: `pytest -n`'s controller runs no test, and took 4 s to load them
    import torch
    from tests.faults import FaultPlan

    from templar.compress import Compressed
    from templar.core.config import HParams
    from templar.storage import Bucket
    from templar.storage.seaweed import SeaweedServer

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def assets_dir() -> Path:
    """The sample corpus and tokenizer; built on first use if a bare checkout lacks them."""
    assets = ROOT / "assets"
    if not all((assets / path).exists() for path in ("BUILT", "shards/manifest.json", "shards-1k/manifest.json")):
        subprocess.run([sys.executable, str(ROOT / "scripts" / "build_assets.py"), "--out", str(assets)], check=True)
    return assets


@pytest.fixture(scope="session")
def tiny_pages(assets_dir: Path):
    """The tiny preset's pages: the sample corpus as prepared by build_assets (digest pinned)."""
    from templar.core.config import load_hparams, resolve_asset
    from templar.data import LocalCorpus

    hp = load_hparams("tiny")
    return LocalCorpus(resolve_asset(hp.data.corpus), digest=hp.data.manifest)


@pytest.fixture
def faults() -> FaultPlan:
    """A storage server's misbehaviour, rule by rule (tests/faults.py): `faults.wrap(bucket)` puts
    one bucket on it, `open_bucket=faults.open_bucket` every bucket a node opens."""
    from tests.faults import FaultPlan

    return FaultPlan()


@pytest.fixture(scope="session")
def hp() -> HParams:
    """`tiny-signed`: tiny on the paper's signed outer step, whose formulas the unit tests check bit for
    bit; tests/runtime/test_outer_methods.py runs the shared ones under both rules, and production's
    SparseLoCo has its own (tests/compress/, tests/wire/test_codec_q2.py)."""
    from templar.core.config import load_hparams

    return load_hparams("tiny-signed")


@pytest.fixture(scope="session")
def keypair():
    from bittensor.sp_core import Keypair

    return Keypair.create_from_uri("//Alice")


@pytest.fixture(scope="session")
def verify() -> Callable[[str, bytes, bytes], bool]:
    """What templar.chain injects: sr25519 verification against an ss58 address."""
    from bittensor.sp_core import Keypair

    def _verify(hotkey: str, message: bytes, signature: bytes) -> bool:
        return bool(Keypair(ss58_address=hotkey).verify(message, signature))

    return _verify


@pytest.fixture(scope="session")
def small_shapes() -> dict[str, torch.Size]:
    """A compact schema with every chunking case: 2-D, 1-D, padded (prime) rows, tiny."""
    import torch

    return {
        "emb": torch.Size([131, 64]),
        "proj": torch.Size([128, 128]),
        "norm": torch.Size([128]),
        "odd": torch.Size([5, 3]),
    }


@pytest.fixture(scope="session")
def tiny_shapes(hp: HParams) -> dict[str, torch.Size]:
    from templar.core.model import build_model, parameter_shapes

    return parameter_shapes(build_model(hp, device="meta"))


@pytest.fixture(scope="session")
def real_peers(hp: HParams) -> tuple[dict[str, torch.Size], list[dict[str, Compressed]]]:
    """Compressed pseudo-gradients of 4 peers: two DeMo steps each of real tiny-model backward
    passes on Zipf-distributed tokens (different tokens per peer)."""
    import torch

    from templar.compress import DCTCompressor, DeMo
    from templar.core.model import build_model, causal_lm_loss, parameter_shapes

    torch.manual_seed(0)
    model = build_model(hp)
    shapes = parameter_shapes(model)
    compressor = DCTCompressor(hp.demo.target_chunk, hp.demo.topk)
    zipf = 1.0 / torch.arange(1, hp.model.vocab_size + 1, dtype=torch.float64) ** 1.1
    peers = []
    for peer in range(4):
        demo = DeMo(model, compressor=compressor, decay=hp.demo.momentum_decay)
        gen = torch.Generator().manual_seed(100 + peer)
        for _ in range(2):
            ids = torch.multinomial(zipf, 4 * 64, replacement=True, generator=gen).view(4, 64)
            model.zero_grad()
            causal_lm_loss(model, ids).backward()
            update = demo.step(
                {n: p.grad for n, p in model.named_parameters()}, lr=hp.optimizer.learning_rate
            )
        peers.append(update)
    return shapes, peers


@pytest.fixture(autouse=True)
def _torch_keeps_its_threads() -> Iterator[None]:
    """A test that changes torch's thread count (a benchmark's `main` choosing its own) gives it back.

    scripts/test.sh runs every worker's torch on one thread. Left at two on 2 cores and four workers,
    OpenMP's threads spun against the other workers for the rest of that worker's tests: the GPU
    benchmark's smoke run took 35-50 s of CPU after it, 9 s alone."""
    import torch

    threads = torch.get_num_threads()
    yield
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


# -- storage: a real SeaweedFS S3 server for the session, buckets of both kinds, hostile endpoints.
# If the server cannot start, every S3 test errors (never skips): the S3 path must be exercised.

_names = itertools.count()


def fresh_bucket_name(tag: str = "t") -> str:
    return f"{tag}-{os.getpid()}-{next(_names)}-{secrets.token_hex(3)}"


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedServer]:
    from templar.storage.seaweed import SeaweedServer

    server = SeaweedServer(tmp_path_factory.mktemp("seaweed"))
    server.start()
    try:
        yield server
    finally:
        server.stop(kill=True)  # nothing to persist: skip the 2 s graceful shutdown


@dataclass
class BucketMaker:
    """Opens a fresh, empty bucket of one kind; call `open()` inside the test's event loop."""

    kind: str
    make: Callable[[], Bucket]

    def open(self) -> Bucket:
        return self.make()


@pytest.fixture(params=["local", "s3"])
def maker(request: pytest.FixtureRequest, tmp_path: Path) -> BucketMaker:
    from templar.storage import LocalBucket, S3Bucket

    if request.param == "local":
        root = tmp_path / "bucket"
        return BucketMaker("local", lambda: LocalBucket(root))
    server: SeaweedServer = request.getfixturevalue("seaweed")
    name = server.create_bucket(fresh_bucket_name())
    return BucketMaker("s3", lambda: S3Bucket(server.endpoint_url, name, server.admin))


@pytest.fixture
def s3_maker(seaweed: SeaweedServer) -> BucketMaker:
    from templar.storage import S3Bucket

    name = seaweed.create_bucket(fresh_bucket_name())
    return BucketMaker("s3", lambda: S3Bucket(seaweed.endpoint_url, name, seaweed.admin))


class HangingServer:
    """Accepts TCP connections on 127.0.0.1 and never answers (a wedged peer endpoint)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)

    def close(self) -> None:
        self.sock.close()
        for conn in self.conns:
            conn.close()


@pytest.fixture
def hanging() -> Iterator[HangingServer]:
    server = HangingServer()
    yield server
    server.close()


@pytest.fixture
def refused_port() -> Iterator[int]:
    """A port that refuses every connection for the whole test: bound, never listening.

    A port closed again before use is free for anyone: under xdist another worker's server can
    take it and answer (one CI run read an object from a neighbour's server). Holding the bind
    keeps the port ours, and the kernel answers a connect to a bound, non-listening port with a reset.
    """
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


@pytest.fixture
def dead_endpoint(refused_port: int) -> str:
    """An endpoint with nothing listening (connection refused)."""
    return f"http://127.0.0.1:{refused_port}"


@pytest.fixture
def new_bucket(seaweed: SeaweedServer) -> Callable[[], str]:
    """Creates a fresh, empty bucket on the session server and returns its name."""
    return lambda: seaweed.create_bucket(fresh_bucket_name())


class HostileServer:
    """Answers every HTTP request with the same raw response head, then streams `body_chunks`
    chunked-encoded forever (or not at all): a peer endpoint lying about or ignoring sizes.
    """

    def __init__(self, head: bytes, stream_forever: bool) -> None:
        self.head = head
        self.stream_forever = stream_forever
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.sent = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        chunk = b"%x\r\n%s\r\n" % (65536, b"z" * 65536)
        try:
            conn.recv(65536)
            conn.sendall(self.head)
            while self.stream_forever:
                conn.sendall(chunk)
                self.sent += 65536
        except OSError:
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self.sock.close()


class KeepAliveServer(HostileServer):
    """Answers every request on a kept-alive connection with the same raw response, counting them: an
    endpoint that keeps answering one status however often it is asked."""

    def __init__(self, response: bytes) -> None:
        self.response, self.requests = response, 0  # before the accepting thread starts
        super().__init__(b"", stream_forever=False)

    def _serve(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as lines:
            try:
                while lines.readline():
                    while lines.readline() not in (b"\r\n", b""):
                        pass
                    self.requests += 1
                    conn.sendall(self.response)
            except OSError:
                pass


_HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
         b"Last-Modified: Wed, 21 Oct 2026 07:28:00 GMT\r\nETag: \"abc\"\r\n")


@pytest.fixture
def endless_server() -> Iterator[HostileServer]:
    """Streams an unbounded chunked body with no Content-Length."""
    server = HostileServer(_HEAD + b"Transfer-Encoding: chunked\r\n\r\n", stream_forever=True)
    yield server
    server.close()


@pytest.fixture
def huge_length_server() -> Iterator[HostileServer]:
    """Announces a 10 GB body and then sends nothing."""
    server = HostileServer(_HEAD + b"Content-Length: 10000000000\r\n\r\n", stream_forever=False)
    yield server
    server.close()


@pytest.fixture
def hostile_server() -> Iterator[Callable[[bytes], HostileServer]]:
    """Factory: a server answering every request with the given raw bytes, then closing."""
    servers: list[HostileServer] = []

    def make(response: bytes) -> HostileServer:
        servers.append(HostileServer(response, stream_forever=False))
        return servers[-1]

    yield make
    for server in servers:
        server.close()


def _slow(item: pytest.Item) -> tuple[float, bool]:
    """(seconds, waits) of a test marked `slow(seconds=N, waits=...)`: its rough wall time in a whole
    suite run, and whether most of it is spent waiting (real-time windows, real processes)."""
    marker = item.get_closest_marker("slow")
    return float(marker.kwargs.get("seconds", 10)), bool(marker.kwargs.get("waits", False))


QUICK_TEST_SECONDS = 0.2
"""A test without the `slow` marker, in a whole suite run (2026-12-01: 1,310 of them in 285 s of wall; later
that day 1,298 in 179 s, and those that still took about 3 s or more, computing or waiting on a timeout, were
marked: unmarked, they ran in file order among the last tests and the slowest worker finished 4 s after
the others)."""


def long_tests_order(slow: list[pytest.Item], quick: list[pytest.Item], workers: int, cores: int) -> list[pytest.Item]:
    """Every test, in the order a worker that frees up should take them.

    The long tests first, longest first, each followed by one quick test: xdist hands a worker the
    next test as it finishes one, so the quick one is what waits behind a long one, and the quick
    tests that are left run last. The tests that wait (a real-time localnet, a kill -9 of real
    processes, the launch rehearsal; `slow(waits=True)`) use a third to a half of a core over their
    minute or two, so they run in two lanes (more only where the workers outnumber the cores by
    more), and the other workers keep the cores busy: three at once on 2 cores left over a third of
    them idle for the suite's first 75-90 s, and one lane would take their six minutes in a row. Once
    no long test is left to compute, a worker takes quick tests until a lane frees. The order is a
    list schedule of the markers' seconds over `workers` workers, so it depends only on the markers
    and is the same on every xdist worker."""
    waiting = sorted((i for i in slow if _slow(i)[1]), key=lambda i: -_slow(i)[0])
    computing = sorted((i for i in slow if not _slow(i)[1]), key=lambda i: -_slow(i)[0])
    quick = list(quick)
    lanes = max(1, min(workers - 1, max(2, workers - cores)))
    free = [(0.0, worker) for worker in range(workers)]
    lanes_end: list[float] = []  # when each waiting test in flight ends
    order: list[pytest.Item] = []
    quick_next = False
    while waiting or computing:
        at, worker = heapq.heappop(free)
        lanes_end = [end for end in lanes_end if end > at]
        lanes_full = len(lanes_end) >= lanes
        if quick and (quick_next or (waiting and lanes_full and not computing)):
            item, seconds, quick_next = quick.pop(0), QUICK_TEST_SECONDS, False
        else:
            item = waiting.pop(0) if waiting and (not lanes_full or not computing) else computing.pop(0)
            seconds, waits = _slow(item)
            if waits:
                lanes_end.append(at + seconds)
            quick_next = True
        order.append(item)
        heapq.heappush(free, (at + seconds, worker))
    return order + quick


@pytest.hookimpl(wrapper=True)
def pytest_collection(session: pytest.Session) -> Iterator[object]:
    """Collect (import every test module, and with them torch, transformers and the chain SDK) with the
    cyclic garbage collector paused, then freeze what the imports built, as the neurons do
    (src/templar/core/startup.py). In a whole suite run each worker spent 3.6-6.5 s of CPU in the
    collector's passes, 80 % of it in full passes over that heap (2026-12-01, 4 workers)."""
    from templar.core.startup import libraries_loading

    with libraries_loading():
        return (yield)


def pytest_configure(config: pytest.Config) -> None:
    """`TEMPLAR_TEST_CPU_LOG=DIR`: every test's CPU, written for `python -m tests.cpu_log DIR` (tests/cpu_log.py)."""
    from tests.cpu_log import pytest_configure as log_cpu

    log_cpu(config)


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Long tests first: the tests marked `slow` (whole localnets, real processes, torchrun ranks) run
    before the rest, in `long_tests_order`.

    Under `pytest -n N` (scripts/test.sh) xdist hands every worker two tests at a time and then one
    per finished test, so this order gives each worker one long test at a time and keeps the quick
    ones for the end: the suite's wall time tends to total work / N instead of the long tests in a
    row. A serial run is unaffected (same tests, another order)."""
    slow = [item for item in items if item.get_closest_marker("slow")]
    if not slow:
        return
    workers = int(getattr(config, "workerinput", {}).get("workercount", 1))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    items[:] = long_tests_order(slow, [item for item in items if not item.get_closest_marker("slow")], workers, cores)
