"""Serving the dashboard: the binding rules, then uvicorn in the foreground or a background thread.

Private by default: the dashboard binds to 127.0.0.1. Another address needs an explicit
`allow_remote=True` (the `--allow-remote` flag) and logs a warning, because the pages show a
validator's scoring of every peer. The socket is bound here, before uvicorn starts, so a busy
port is a clear error at once and port 0 picks a free one.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import threading
import time
from pathlib import Path

import h11
import uvicorn
from loguru import logger
from uvicorn.protocols.http.h11_impl import H11Protocol

from templar.dashboard.app import create_app
from templar.dashboard.board import Board
from templar.storage.locator import is_loopback, loopback_hosts

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8787
IDLE_SECONDS = 5.0
"""A connection whose request is not in this long after it opened (or after its last answer) is closed."""
CONNECTIONS = 128
"""Connections open at once; one more is closed on arrival."""


class BindError(ValueError):
    """The address may not be used (non-loopback without permission) or cannot be bound."""


def bind_socket(host: str, port: int, *, allow_remote: bool = False) -> socket.socket:
    """A listening TCP socket on (host, port); refuses a non-loopback host unless allowed."""
    if not is_loopback(host):
        if not allow_remote:
            raise BindError(f"refusing to serve on {host}: the dashboard shows every peer's scores; bind to "
                            "127.0.0.1 (the default) or pass --allow-remote to expose it on purpose")
        logger.warning(f"dashboard bound to {host}: anyone who can reach this address can read it "
                       "(no authentication); prefer an SSH tunnel to 127.0.0.1")
    try:
        infos = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise BindError(f"cannot resolve {host}: {exc}") from exc
    family, _, _, _, addr = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
        sock.listen(64)
    except OSError as exc:
        sock.close()
        raise BindError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    sock.setblocking(False)
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


class _IdleClosingH11(H11Protocol):
    """A deadline for each request, and a bound on open connections.

    uvicorn closes an idle kept-alive connection after `timeout_keep_alive`, but only once it has answered a
    request on it, and any byte it receives stops that timer: a connection that never sent a request, or sent
    one byte of it and then waited, held one of `limit_concurrency`'s places for as long as it stayed open, and
    128 of them locked every page, /healthz included; more held one descriptor each until accept() failed.
    Here the timer starts when a connection opens and again after each answer, and only a whole request's
    headers stop it; a connection beyond `CONNECTIONS` is closed as it arrives (uvicorn's `limit_concurrency` is
    one more, so its 503 answers no request of the connections let in)."""

    _refused = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if len(self.connections) >= CONNECTIONS:
            self._refused = True
            transport.close()
            return
        super().connection_made(transport)
        self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self.timeout_keep_alive_handler)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._refused:  # a refused connection has none of uvicorn's state to tear down
            super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        """As uvicorn's, less the cancelling of the timer on any byte: `handle_events` cancels it on a request."""
        self.conn.receive_data(data)
        self.handle_events()

    def timeout_keep_alive_handler(self) -> None:
        """Close the connection, whatever state the client left it in mid-request."""
        with contextlib.suppress(h11.LocalProtocolError):
            super().timeout_keep_alive_handler()
        self.transport.close()


def build_server(board: Board, host: str) -> uvicorn.Server:
    app = create_app(board, allowed_hosts=loopback_hosts(host))
    config = uvicorn.Config(app, log_level="warning", access_log=False, server_header=False,
                            proxy_headers=False, timeout_graceful_shutdown=2, limit_concurrency=CONNECTIONS + 1,
                            lifespan="on", http=_IdleClosingH11, timeout_keep_alive=IDLE_SECONDS)
    server = uvicorn.Server(config)
    app.state.refresher.exiting = lambda: server.should_exit
    return server


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def serve(board: Board, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, *, allow_remote: bool = False) -> None:
    """Serve in the foreground until Ctrl-C or SIGTERM (either ends it cleanly: exit 0 from the CLI).

    uvicorn shuts down gracefully on both, then raises the signal again for the handler it found;
    for SIGTERM that would be the default one (killed, status 143 for systemd or a shell's `wait`),
    so SIGTERM is made to end the process as Ctrl-C does."""
    sock = bind_socket(host, port, allow_remote=allow_remote)
    server = build_server(board, host)
    signal.signal(signal.SIGTERM, _interrupt)
    print(f"templar dashboard: {url_of(sock)}  (read-only; Ctrl-C to stop)", flush=True)
    server.run(sockets=[sock])


class BackgroundDashboard:
    """The dashboard on a daemon thread (used by `templar localnet` and the tests)."""

    def __init__(self, board: Board, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, *,
                 allow_remote: bool = False):
        self.board = board
        self.sock = bind_socket(host, port, allow_remote=allow_remote)
        self.url = url_of(self.sock)
        self.server = build_server(board, host)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       name="templar-dashboard", daemon=True)

    def start(self, timeout: float = 20.0) -> BackgroundDashboard:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise BindError(f"the dashboard did not start on {self.url}")
            time.sleep(0.02)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)
        self.sock.close()


def start_localnet_dashboard(out: Path, hparams: str, port: int, netuid: int) -> BackgroundDashboard | None:
    """`templar localnet --dashboard PORT`: the dashboard on 127.0.0.1 next to the net, in a thread.

    A busy port falls back to a free one (two localnets may run side by side); any other failure
    is logged and the localnet runs on without a dashboard.
    """
    from functools import partial

    from templar.chain import connect
    from templar.core.config import load_hparams
    from templar.dashboard.board import BoardConfig
    from templar.runtime.roster import CHAIN_FILE

    hp = load_hparams(hparams)
    config = BoardConfig(
        localnet=out, connect=partial(connect, network="embedded", chain_endpoint=str(out / CHAIN_FILE),
                                      netuid=netuid, wallet_name=None, read_timeout=10.0),
        chain_label=f"embedded netuid {netuid}", chain_interval=max(2.0, hp.windows.block_time),
        blocks_per_window=hp.windows.blocks_per_window, hparams_name=hp.name,
        window_seconds=hp.windows.blocks_per_window * hp.windows.block_time,
        windows_per_weights=hp.windows.windows_per_weights)
    for attempt in (port, 0):
        try:
            return BackgroundDashboard(Board(config), DEFAULT_HOST, attempt).start()
        except BindError as exc:
            logger.warning(f"dashboard: {exc}" + ("; trying a free port" if attempt else ""))
    return None
