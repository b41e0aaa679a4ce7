"""The dashboard's ASGI app (Starlette): read-only pages, a small JSON API, server-sent events.

Why Starlette and not FastAPI: every route is a GET that renders HTML or a small JSON object,
with no request bodies to validate and no OpenAPI schema worth publishing; FastAPI would add
pydantic request models and a docs UI (which loads JavaScript from a CDN by default) for
nothing. Starlette is the part of FastAPI we use, one dependency less.

Rules every response follows:
- Only GET and HEAD exist (anything else is 405); an unknown path is a 404 page.
- A strict Content-Security-Policy: scripts and styles only from this server, no inline script
  or style, no frames, nothing fetched from elsewhere. Pages are never cached.
- Requests must name this host (`allowed_hosts`), so a web page elsewhere cannot read the
  dashboard through DNS rebinding.
- Files and the chain are read in worker threads; a page never waits on the network: it shows
  the last chain snapshot and says when the chain is unreachable.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator, Callable
from importlib import resources

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from templar.dashboard import miner_views, views
from templar.dashboard.board import Board
from templar.dashboard.sources import valid_hotkey

FILE_INTERVAL = 1.0       # seconds between two reads of the JSONL files while someone watches
WATCH_GRACE = 30.0        # keep refreshing this long after the last request
MAX_EVENT_STREAMS = 32
HEARTBEAT = 15.0
STATIC = {"dashboard.js": "text/javascript; charset=utf-8", "dashboard.css": "text/css; charset=utf-8"}
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
SECURITY_HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cache-control", b"no-store"),
]


class SecurityHeaders:
    """Adds the headers above to every HTTP response, errors included."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = {k.lower() for k, _ in message.get("headers", [])}
                message["headers"] = [*message.get("headers", []),
                                      *((k, v) for k, v in SECURITY_HEADERS if k not in names)]
            await send(message)

        await self.app(scope, receive, send_with_headers)


class Refresher:
    """Reads files at most every FILE_INTERVAL and the chain when due, only while someone watches."""

    def __init__(self, board: Board):
        self.board = board
        self.last_files = 0.0
        self.last_request = 0.0
        self.streams = 0
        self.stop = asyncio.Event()
        self.exiting: Callable[[], bool] = lambda: False  # the server's "shutting down" flag
        self._chain_task: asyncio.Task | None = None

    @property
    def stopping(self) -> bool:
        return self.stop.is_set() or self.exiting()

    async def files(self, *, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self.last_files >= FILE_INTERVAL:
            self.last_files = now
            await asyncio.to_thread(self.board.refresh_files)

    def kick_chain(self) -> None:
        """Start a chain read in a thread if one is due and none is running; never wait for it."""
        chain = self.board.chain
        if chain is None or not chain.due():
            return
        if self._chain_task is None or self._chain_task.done():
            self._chain_task = asyncio.create_task(asyncio.to_thread(self.board.refresh_chain))

    async def on_request(self) -> None:
        self.last_request = time.monotonic()
        self.kick_chain()
        await self.files()

    async def run(self) -> None:
        while not self.stopping:
            if self.streams > 0 or time.monotonic() - self.last_request < WATCH_GRACE:
                self.kick_chain()
                await self.files()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), FILE_INTERVAL)
        if self._chain_task is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._chain_task, 5.0)


def _finite(value: object) -> object:
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def _clean(obj: object) -> object:
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_clean(v) for v in obj]
    return _finite(obj)


def create_app(board: Board, *, allowed_hosts: list[str] | None = None) -> Starlette:
    refresher = Refresher(board)

    def html(request: Request, title: str, body: str, active: str, status: int = 200) -> Response:
        if request.headers.get("x-fragment") == "1":
            return HTMLResponse(body, status_code=status, headers={"x-version": str(board.version)})
        return HTMLResponse(views.page(board, title, body, active), status_code=status)

    def vname(request: Request) -> str | None:
        name = request.query_params.get("v")
        return name if name and len(name) <= 64 else None

    async def overview(request: Request) -> Response:
        await refresher.on_request()
        with board.lock:
            return html(request, "Overview", views.overview(board, vname(request)), "/")

    async def peers(request: Request) -> Response:
        await refresher.on_request()
        with board.lock:
            return html(request, "Peers", views.peers(board, vname(request)), "/peers")

    async def peer(request: Request) -> Response:
        await refresher.on_request()
        hotkey = request.path_params["hotkey"]
        with board.lock:
            body = views.peer(board, hotkey, vname(request)) if valid_hotkey(hotkey) else None
            if body is None:
                return html(request, "Not found", views.not_found(board, "no such peer"), "/peers", 404)
            return html(request, f"Peer {hotkey[:8]}", body, "/peers")

    async def miners(request: Request) -> Response:
        await refresher.on_request()
        with board.lock:
            return html(request, "Miners", miner_views.miners(board), "/miners")

    async def miner(request: Request) -> Response:
        await refresher.on_request()
        with board.lock:
            body = miner_views.miner(board, request.path_params["name"][:64])
            if body is None:
                return html(request, "Not found", views.not_found(board, "no such miner"), "/miners", 404)
            return html(request, request.path_params["name"][:64], body, "/miners")

    async def api_summary(request: Request) -> Response:
        await refresher.on_request()
        with board.lock:
            v = board.validator(vname(request))
            last = v.last_window if v else None
            snap = board.snapshot
            lead = snap.lead() if snap else None
            run = board.run_state(v)
            data = {
                "version": board.version,
                "run": {"state": run.kind, "detail": run.detail, "alerts": list(run.alerts)},
                "chain": {"label": board.config.chain_label, "block": snap.block if snap else None,
                          "error": board.chain.error if board.chain else "no chain configured",
                          "lead": {"uid": lead.uid, "hotkey": lead.hotkey, "stake": lead.stake} if lead else None},
                "current_window": board.current_window(),
                "validator": v.name if v else None,
                "last_window": last.__dict__ if last else None,
                "validators": [x.name for x in board.validators],
                "miners": [m.name for m in board.miners],
                "problems": board.problems(),
            }
        return JSONResponse(_clean(data))

    async def api_peers(request: Request) -> Response:
        await refresher.on_request()
        with board.lock:
            v = board.validator(vname(request))
            rows = [rec.__dict__ | {"name": board.label(hk)} for hk, rec in sorted(board.peers(v).items())] if v else []
            data = {"validator": v.name if v else None, "window": v.table_window() if v else None, "peers": rows}
        return JSONResponse(_clean(data))

    async def api_miners(request: Request) -> Response:
        await refresher.on_request()
        with board.lock:
            data = {"miners": [{"name": m.name, "phase": m.phase(), "last": m.last.__dict__ if m.last else None,
                                "trained": m.trained.__dict__ if m.trained else None} for m in board.miners]}
        return JSONResponse(_clean(data))

    async def events(request: Request) -> Response:
        """Server-sent events: `version` whenever the board changed; a comment line as heartbeat."""
        if request.method == "HEAD":
            return Response(media_type="text/event-stream")
        if refresher.streams >= MAX_EVENT_STREAMS:
            return PlainTextResponse("too many live views open", status_code=503)
        await refresher.on_request()

        async def stream() -> AsyncIterator[str]:
            refresher.streams += 1
            try:
                yield "retry: 3000\n\n"
                sent, quiet = -1, 0.0
                while not refresher.stopping:  # ends at shutdown, so the server need not cut it
                    if board.version != sent:
                        sent, quiet = board.version, 0.0
                        yield f"event: version\ndata: {sent}\n\n"
                    elif quiet >= HEARTBEAT:
                        quiet = 0.0
                        yield ": heartbeat\n\n"
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(refresher.stop.wait(), 0.5)
                    quiet += 0.5
            finally:
                refresher.streams -= 1

        return StreamingResponse(stream(), media_type="text/event-stream",
                                 headers={"x-accel-buffering": "no"})

    async def static(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in STATIC:
            raise HTTPException(404)
        body = resources.files("templar.dashboard").joinpath("static", name).read_bytes()
        return Response(body, media_type=STATIC[name])

    async def healthz(request: Request) -> Response:
        return PlainTextResponse("ok")

    async def not_found(request: Request, exc: Exception) -> Response:
        status = getattr(exc, "status_code", 404)
        if status == 404 and request.method in {"GET", "HEAD"} and not request.url.path.startswith(("/api", "/static")):
            with board.lock:
                return html(request, "Not found", views.not_found(board, f"no page at {request.url.path[:200]}"),
                            "", 404)
        detail = getattr(exc, "detail", "") or ("Not Found" if status == 404 else "error")
        headers = getattr(exc, "headers", None)
        return PlainTextResponse(str(detail), status_code=status, headers=headers)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        task = asyncio.create_task(refresher.run())
        try:
            yield
        finally:
            refresher.stop.set()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, 6.0)
            if board.chain is not None:
                await asyncio.to_thread(board.chain.close)

    get = ["GET", "HEAD"]
    routes = [
        Route("/", overview, methods=get),
        Route("/peers", peers, methods=get),
        Route("/peers/{hotkey}", peer, methods=get),
        Route("/miners", miners, methods=get),
        Route("/miners/{name}", miner, methods=get),
        Route("/api/summary", api_summary, methods=get),
        Route("/api/peers", api_peers, methods=get),
        Route("/api/miners", api_miners, methods=get),
        Route("/events", events, methods=get),
        Route("/static/{name}", static, methods=get),
        Route("/healthz", healthz, methods=get),
    ]
    middleware = [Middleware(SecurityHeaders)]
    if allowed_hosts is not None:
        middleware.append(Middleware(TrustedHostMiddleware, allowed_hosts=allowed_hosts, www_redirect=False))
    app = Starlette(routes=routes, middleware=middleware, lifespan=lifespan,
                    exception_handlers={HTTPException: not_found})
    app.state.refresher = refresher
    app.state.board = board
    return app
