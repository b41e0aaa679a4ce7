"""The HTTP server behind a node's `/metrics`: bounded, timed, and readable only under this machine's names.

prometheus_client's own server (`start_http_server`) runs a thread per connection and reads each request
with no timeout, in the node's process. 300 idle connections held 300 of the node's threads for as long
as they stayed open, so anyone who could reach the port (`--metrics.host 0.0.0.0`, which the docs allow)
could push a miner or a validator to its thread limit. It also answered any Host header, so a web page
could read a loopback exporter (every peer's hotkey, score and weight) through a name it re-points at
127.0.0.1. Here:
- a connection that has not sent its whole request within `REQUEST_SECONDS` is closed (a deadline for
  the request, not for each read: a client dripping a byte at a time is closed too);
- at most `CONNECTIONS` are served at once, and one more is closed at once;
- bound to loopback, a request must name a loopback host (`storage.locator.loopback_hosts`), as the
  dashboard's must.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

from templar.storage.locator import loopback_hosts

REQUEST_SECONDS = 10.0
"""A connection that has not sent a whole request within this long is closed (a scrape sends one at once)."""
CONNECTIONS = 16
"""Scrapes served at once: Prometheus sends one at a time; more connections are closed on arrival."""

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class _Handler(WSGIRequestHandler):
    """One scrape. The socket's timeout bounds each read; the server's deadline the whole request: a client
    sending one byte every few seconds passed every read's timeout, and 16 of them held every slot (each
    scrape closed on arrival) for as long as they kept dripping."""

    timeout = REQUEST_SECONDS  # socketserver sets it on the connection: every read waits at most this

    server: _BoundedServer

    def setup(self) -> None:
        super().setup()
        self.server.reading(self.connection)

    def parse_request(self) -> bool:
        parsed = super().parse_request()  # reads the headers: a client dripping them is still on its deadline
        self.server.read(self.connection)  # the whole request is in: the answer is ours to write
        return parsed

    def finish(self) -> None:
        self.server.read(self.connection)
        super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes are not logged (the node's log is for the node)."""


class _BoundedServer(ThreadingMixIn, WSGIServer):
    """A thread per connection, at most `CONNECTIONS` of them; the rest are closed on arrival."""

    daemon_threads = True
    request_queue_size = 128  # the listen backlog (socketserver's 5 left a burst of connects waiting on SYN retries)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._slots = threading.BoundedSemaphore(CONNECTIONS)
        self._unread: dict[socket.socket, float] = {}  # connection -> when its request is due
        self._unread_lock = threading.Lock()
        self._stopped = threading.Event()
        super().__init__(*args, **kwargs)
        threading.Thread(target=self._close_overdue, name="metrics-deadlines", daemon=True).start()

    def reading(self, connection: socket.socket) -> None:
        """`connection`'s request is due within `REQUEST_SECONDS` from now."""
        with self._unread_lock:
            self._unread[connection] = time.monotonic() + REQUEST_SECONDS

    def read(self, connection: socket.socket) -> None:
        """`connection`'s request is in (or it is closing): no deadline any more."""
        with self._unread_lock:
            self._unread.pop(connection, None)

    def _close_overdue(self) -> None:
        """One thread for every connection's deadline: shut each whose request is not in by then, which ends
        its handler's blocked read (a timer per connection would double the threads a flood holds)."""
        while not self._stopped.wait(min(0.25, REQUEST_SECONDS / 4)):
            now = time.monotonic()
            with self._unread_lock:  # shut under the lock: a request read meanwhile is either in time or cut
                for connection in [c for c, due in self._unread.items() if due <= now]:
                    del self._unread[connection]
                    with contextlib.suppress(OSError):
                        connection.shutdown(socket.SHUT_RDWR)

    def server_close(self) -> None:
        self._stopped.set()
        super().server_close()

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that timed out or went away is not the node's error: socketserver printed a traceback
        to stderr for each, which anyone who can reach the port could repeat at will."""

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


def _host_checked(app: WSGIApp, allowed: list[str]) -> WSGIApp:
    """`app`, answering 400 to a request whose Host header (its port aside) is not one of `allowed`."""

    def checked(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        host = environ.get("HTTP_HOST", "")
        name = host[:host.find("]") + 1] if host.startswith("[") else host.rsplit(":", 1)[0]
        if name not in allowed:
            start_response("400 Bad Request", [("Content-Type", "text/plain; charset=utf-8")])
            return [b"Invalid host header\n"]
        return app(environ, start_response)

    return checked


def serve_metrics(registry: CollectorRegistry, host: str, port: int) -> WSGIServer:
    """`registry` served at `host`:`port` (0: a free port) in a daemon thread; the caller shuts it down."""
    app: WSGIApp = make_wsgi_app(registry)
    if (allowed := loopback_hosts(host)) is not None:
        app = _host_checked(app, allowed)
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
    server_class = type("MetricsServer", (_BoundedServer,), {"address_family": family})  # IPv6 hosts too
    server = make_server(host, port, app, server_class, handler_class=_Handler)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server
