"""The dashboard over HTTP, on a real run directory and a real embedded chain: content, secrets,
read-only rules, and what it does with missing, torn and unreachable inputs."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from templar.dashboard.board import Board, BoardConfig
from templar.dashboard.server import BackgroundDashboard, BindError, bind_socket, is_loopback

from .conftest import serve_chain_only
from .runfixture import S3_SECRET, Run


def get(url: str, *, headers: dict | None = None, method: str = "GET") -> tuple[int, dict, str]:
    req = urllib.request.Request(url, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(req, timeout=20) as resp:
            return resp.status, dict(resp.headers), resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read().decode()


def test_pages_render_the_run_and_the_api_matches_the_score_book(run: Run, dashboard: BackgroundDashboard):
    book = json.loads((run.state_dir("validator0") / "scorebook.json").read_text())["peers"]
    status, _, body = get(dashboard.url + "api/peers")
    assert status == 200
    api = json.loads(body)
    assert api["validator"] == "validator0" and api["window"] == run.last_window
    owner = run.dev.owner.hotkey  # uid 0: registered, no bucket, found `missing`: in the book, not a peer
    assert owner in book and book[owner]["uid"] == 0
    assert {p["hotkey"] for p in api["peers"]} == set(book) - {owner}
    for p in api["peers"]:
        assert p["uid"] == book[p["hotkey"]]["uid"]
        assert p["weight"] == pytest.approx(book[p["hotkey"]]["weight"])
        assert p["mu"] == pytest.approx(book[p["hotkey"]]["mu"])
        assert p["paid_mu"] is not None  # μ̃, what the score reads (`ScoreBook.paid_mus`)
    summary = json.loads(get(dashboard.url + "api/summary")[2])
    assert summary["chain"]["lead"]["uid"] == run.node("validator0").uid and summary["problems"] == []
    assert summary["current_window"] >= run.last_window
    lazy = run.node("lazy0").hotkey
    for path, must in (("", ["Held-out loss", "Validator agreement", "Top-G now", "Weight setting", "priority_too_low",
                             "retrying in 1s", f"set w{run.last_window - run.last_window % 2}"]),
                       ("peers", ["miner0", "copycat0", "late0", "δ assigned", "μ̃ (paid)",
                                  "1 hotkey without a bucket not shown"]),
                       (f"peers/{lazy}", ["no proof of its assigned work", "miner / lazy", "μ · μ̃ (paid) · rating"]),
                       ("miners", ["miner3", "tok/s", "busy", "the GPU's compute utilisation"]), ("miners/miner0", ["[SYNC] Active", "Upload size", "Busy: training; overhead"])):
        status, headers, html = get(dashboard.url + path)
        assert status == 200, path
        for text in must:
            assert text in html, (path, text)
        assert "default-src 'none'" in headers["content-security-policy"]


def test_no_secret_reaches_a_page(run: Run, dashboard: BackgroundDashboard):
    secret_forms = [run.secret.hex(), run.secret.hex().upper(), S3_SECRET, "READKEYID"]
    for path in ("", "peers", "miners", f"peers/{run.node('miner1').hotkey}", "api/summary", "api/peers",
                 "api/miners", "miners/miner1", "?v=validator1"):
        body = get(dashboard.url + path)[2]
        for secret in secret_forms:
            assert secret not in body, (path, secret)
    assert "s3:tpl-miner1" in get(dashboard.url + f"peers/{run.node('miner1').hotkey}")[2]  # kind + bucket only


def test_read_only_and_unknown_paths(run: Run, dashboard: BackgroundDashboard):
    assert get(dashboard.url + "nope")[0] == 404
    assert get(dashboard.url + "static/../eval_secret")[0] == 404
    assert get(dashboard.url + "static/x.js")[0] == 404
    assert get(dashboard.url + "peers/" + "1" * 48)[0] == 404          # well-formed, unknown
    assert get(dashboard.url + "peers/not-a-hotkey!")[0] == 404
    assert get(dashboard.url + "miners/nobody")[0] == 404
    for method in ("POST", "PUT", "DELETE"):
        assert get(dashboard.url + "peers", method=method)[0] == 405
    assert get(dashboard.url, headers={"Host": "evil.example"})[0] == 400  # DNS rebinding
    status, headers, _ = get(dashboard.url + "static/dashboard.js")
    assert status == 200 and headers["content-type"].startswith("text/javascript")


def test_events_announce_the_version(dashboard: BackgroundDashboard):
    with urllib.request.urlopen(dashboard.url + "events", timeout=20) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        lines = [resp.readline().decode().strip() for _ in range(4)]
    assert lines[0] == "retry: 3000" and "event: version" in lines


def test_the_dashboard_writes_nothing(run: Run, dashboard: BackgroundDashboard):
    def snapshot() -> dict[str, tuple[int, int]]:
        return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in run.out.rglob("*")
                if p.is_file() and not p.name.startswith("chain.sqlite")}  # SQLite's own -wal/-shm aside

    before = snapshot()
    for path in ("", "peers", "miners", "api/summary"):
        get(dashboard.url + path)
    dashboard.board.refresh_files()
    assert snapshot() == before


def test_missing_torn_and_unreachable_inputs_are_reported_not_fatal(tmp_path: Path):
    empty = tmp_path / "validator"
    empty.mkdir()
    torn = tmp_path / "miner"
    torn.mkdir()
    (torn / "miner_windows.jsonl").write_text('{"window": 1, "phase": "active"}\n{"window": 2, "pha')
    from templar.chain import connect

    config = BoardConfig(validator_dirs=[empty, tmp_path / "absent"], miner_dirs=[torn],
                         connect=lambda: connect(network="embedded", chain_endpoint=str(tmp_path / "no.sqlite"),
                                                 netuid=1, wallet_name=None, read_timeout=5.0),
                         chain_label="embedded netuid 1", blocks_per_window=20)
    dash = BackgroundDashboard(Board(config), "127.0.0.1", 0).start()
    try:
        dash.board.refresh_chain(force=True)
        for path in ("", "peers", "miners", "miners/miner"):
            status, _, html = get(dash.url + path)
            assert status == 200, path
        html = get(dash.url)[2]
        assert "scores.jsonl: not written yet" in html
        assert "absent: state dir" in html and "does not exist" in html
        assert "unreachable" in html and "no embedded chain" in html
        assert "without the expected fields" in get(dash.url + "miners")[2]
        assert get(dash.url + "healthz")[2] == "ok"
    finally:
        dash.stop()


def test_binding_is_loopback_unless_asked(run: Run):
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.10")
    with pytest.raises(BindError, match="--allow-remote"):
        bind_socket("0.0.0.0", 0)
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    try:
        port = busy.getsockname()[1]
        with pytest.raises(BindError, match="cannot listen"):
            bind_socket("127.0.0.1", port)
        # `templar localnet --dashboard PORT` on a busy port falls back to a free one
        from templar.dashboard.server import start_localnet_dashboard

        dash = start_localnet_dashboard(run.out, "tiny", port, 1)
        assert dash is not None and not dash.url.endswith(f":{port}/")
        dash.stop()
    finally:
        busy.close()


def test_cli_flags():
    from templar.cli import build_parser
    from templar.dashboard.cli import board_config

    parser = build_parser()
    args = parser.parse_args(["localnet", "--no-dashboard"])
    assert args.no_dashboard
    assert parser.parse_args(["localnet", "--dashboard", "9000"]).dashboard == 9000
    args = parser.parse_args(["dashboard", "--localnet", "/tmp/x", "--port", "0"])
    cfg = board_config(args)
    assert cfg.chain_label == "embedded netuid 1" and cfg.blocks_per_window == 20
    args = parser.parse_args(["dashboard", "--validator.dir", "/v", "--subtensor.network", "finney", "--netuid", "3"])
    cfg = board_config(args)
    assert cfg.chain_label == "finney netuid 3" and cfg.validator_dirs == [Path("/v")]


def test_with_the_chain_alone_the_peers_page_is_the_metagraph(run: Run):
    """A miner operator with no validator state dir still sees the subnet as the chain has it."""
    dash = serve_chain_only(run.out)
    try:
        html = get(dash.url + "peers")[2]
        assert "no validator state dir" in html and 'id="subnet"' in html
        for node in run.nodes:
            assert f'data-hotkey="{node.hotkey}"' in html
        for name, role in (("miner2", "miner"), ("validator0", "validator")):  # the role its commitment declares
            row = html.split(f'<tr data-hotkey="{run.node(name).hotkey}">')[1].split("</tr>")[0]
            assert f"<td>{role}</td>" in row, (name, row)
        status, _, page = get(dash.url + f"peers/{run.node('miner2').hotkey}")
        assert status == 200 and "local:" in page and "weight on chain by validator" in page
        assert "<dt>role on chain</dt><dd>miner</dd>" in page  # what its commitment declares, not its permit
        page = get(dash.url + f"peers/{run.node('validator0').hotkey}")[2]
        assert "<dt>role on chain</dt><dd>validator (its commitment declares it)</dd>" in page
    finally:
        dash.stop()


def test_the_subnet_tables_role_is_the_commitments_and_says_a_permit_where_they_part():
    """A miner with a permit (stake anyone may put on it) is still a miner, and a declared validator
    without one cannot lead: the table says both."""
    from types import SimpleNamespace

    from templar.dashboard.views import chain_role

    def role(validates: bool, permit: bool, commitment: str | None = "s3:b") -> str:
        return chain_role(SimpleNamespace(validates=validates, validator_permit=permit, commitment=commitment))

    assert [role(True, True), role(True, False), role(False, True), role(False, False)] == [
        "validator", "validator, no permit", "miner, permit", "miner"]
    assert role(False, True, None) == role(False, False, "") == "none"  # no commitment: the subnet owner's uid 0, say


def test_who_is_a_peer_is_known_from_the_roster_or_the_chain(run: Run):
    """uid 0 (registered, no bucket, only ever `missing`) is left out wherever the dashboard can
    tell it never committed a bucket: from a localnet's roster or from the chain's commitments.
    Knowing neither, it cannot tell, and shows every hotkey of the score log."""
    from templar.chain import connect

    owner = run.dev.owner.hotkey
    chain = {"connect": lambda: connect(network="embedded", chain_endpoint=str(run.out / "chain.sqlite"),
                                        netuid=1, wallet_name=None), "chain_label": "embedded netuid 1"}
    for config, shown in ((BoardConfig(localnet=run.out), False),
                          (BoardConfig(validator_dirs=[run.state_dir("validator0")], **chain), False),
                          (BoardConfig(validator_dirs=[run.state_dir("validator0")]), True)):
        board = Board(config)
        board.refresh_files()
        board.refresh_chain(force=True)
        v = board.validator("validator0")
        assert owner in v.current()
        assert (owner in board.peers(v)) is shown, config
        assert set(board.peers(v)) >= {n.hotkey for n in run.nodes if n.role == "miner"}
        if board.chain:
            board.chain.close()


def test_every_status_has_its_badge_and_meaning():
    """The dashboard knows every verdict by `Status` alone: a failing one (`replay` among them) is a
    red badge whose tooltip is its meaning, and the peer page says why μ moved."""
    from templar.core.verdicts import Status
    from templar.dashboard.views import badge, meaning

    for status in Status:
        kind = "good" if status is Status.OK else "idle" if status.passes else "bad"
        assert f'class="badge {kind}"' in badge(status.value) and meaning(status.value) == status.meaning
    assert "earlier window" in meaning("replay") and 'class="badge bad"' in badge("replay")


def test_the_run_state_says_live_only_while_windows_arrive(run: Run, tmp_path: Path):
    """A run whose records stopped, or a localnet that wrote its report, is never shown live (no
    green dot, the window card shows its last window); the Miners page shows each miner's last
    trained window, with a trailing catch-up said beside it; the peers' status strip has a legend;
    a shadow validator's weights card and a full disk are said."""
    import os
    import shutil
    import time

    from templar.core.config import load_hparams
    from templar.dashboard import miner_views, views
    from templar.runtime.records import (
        MINER_WINDOWS_FILE,
        WEIGHTS_FILE,
        MinerWindowRecord,
        WeightsRecord,
        append_record,
    )

    out = tmp_path / "localnet"
    shutil.copytree(run.out, out)
    windows = load_hparams("tiny").windows
    length = windows.blocks_per_window * windows.block_time

    def board() -> Board:
        b = Board(BoardConfig(localnet=out, window_seconds=length, windows_per_weights=windows.windows_per_weights))
        b.refresh_files()
        return b

    b = board()
    assert b.run_state(b.validator(None)).kind == "live"
    assert 'class="runstate live"' in views.overview(b, None)
    assert 'id="strip-legend"' in views.peers(b, None) and "a failed fast evaluation" in views.peers(b, None)

    # a miner whose last window ended waiting for the lead's update (the lead stopped first)
    append_record(out / "nodes" / "miner0" / MINER_WINDOWS_FILE, MinerWindowRecord(
        window=run.last_window + 1, phase="catchup", strategy="honest", global_step=run.last_window, loss=3.1,
        tokens_per_second=2711.0, pages=2, uploaded=True, upload_bytes=160_000, upload_seconds=0.1,
        peers_aggregated=0, overhead_share=0.0, tokens=1024))
    page = miner_views.miners(board())
    row = page[page.index("/miners/miner0"):].split("</tr>")[0]
    assert ">active</span>" in row and f"then catch-up w{run.last_window + 1}" in row
    assert f">{run.last_window}</td>" in row and ">4</td>" in row  # its last trained window and aggregate

    # the records stopped four windows ago: stopped or stalled, with the nodes named
    old = time.time() - 4 * length
    for f in out.glob("nodes/*/*.jsonl"):
        os.utime(f, (old, old))
    b = board()
    state = b.run_state(b.validator(None))
    assert state.kind == "stale" and any("validator0 has recorded no window" in a for a in state.alerts), state
    html = views.overview(b, None)
    assert 'class="runstate live"' not in html and "stopped or stalled" in html
    assert f'<div class="v">{run.last_window}</div>' in html  # the window card: its last window

    (out / "report.json").write_text("{}")  # what a localnet writes when it ends
    b = board()
    assert b.run_state(b.validator(None)).kind == "finished" and 'class="runstate finished"' in views.overview(b, None)

    # shadow mode and a disk without room for two state files
    append_record(out / "nodes" / "validator0" / WEIGHTS_FILE, WeightsRecord(
        window=run.last_window, attempt=1, outcome="shadow", reason="", uids=3, block=1, detail="", next=""))
    state_file = out / "nodes" / "validator0" / "state.safetensors"
    with open(state_file, "wb") as f:
        f.truncate(shutil.disk_usage(out).free)  # sparse: its size, not its blocks
    os.utime(out / "nodes" / "validator0" / "validator_windows.jsonl")
    (out / "report.json").unlink()
    b = board()
    assert ">shadow</div>" in views.overview(b, None)
    assert any("less than two state files" in a for a in b.run_state(b.validator(None)).alerts)


def test_self_weights_of_miners_neither_join_the_agreement_nor_slow_the_overview(monkeypatch: pytest.MonkeyPatch):
    """Any uid may set a weight on itself without a validator permit (subtensor and the embedded chain
    alike), so a subnet's miners can fill `current_weights` with a row each. The agreement listed every
    such miner as a red, disagreeing validator, and compared every row with every other (64 validators
    and 192 self-weights: 1.3 s of each overview render, the server's event loop blocked meanwhile);
    it reads the permit holders' rows, as Yuma does, and the matrix only the rows it shows."""
    import time

    from templar.chain import Neuron
    from templar.dashboard import chainwatch, views
    from templar.dashboard.chainwatch import ChainSnapshot, ChainWatch

    def neuron(uid: int) -> Neuron:
        return Neuron(uid=uid, hotkey=f"5H{uid:046d}".replace("0", "z"), coldkey="c", stake=100.0 if uid < 2 else 0.0,
                      validator_permit=uid < 2, last_update=1, commitment="s3:b", incentive=0.0, dividends=0.0,
                      consensus=0.0, trust=0.0, validator_trust=0.0, emission=0.0, validates=uid < 2)

    weights = {uid: {uid: 1.0} for uid in range(2, 256)} | {0: {2: 0.5, 3: 0.5}, 1: {2: 0.4, 3: 0.6}}
    board = Board(BoardConfig())
    board.chain = ChainWatch(connect=lambda: None, label="test")  # type: ignore[arg-type,return-value]
    board.chain.snapshot = ChainSnapshot(taken_at=time.time(), block=100, neurons=[neuron(u) for u in range(256)],
                                         weights=weights)
    calls = 0
    cosine = chainwatch.cosine

    def counted(a: dict[int, float], b: dict[int, float]) -> float | None:
        nonlocal calls
        calls += 1
        return cosine(a, b)

    monkeypatch.setattr(chainwatch, "cosine", counted)
    html = views.overview(board, None)
    table = html[html.index('id="agreement"'):].split("</table>")[0]
    assert table.count("<tr>") == 3  # the header and the two validators
    assert calls <= 2 + 2 * 2, calls  # their cosines against each other, not 256 × 256


def test_connections_that_send_nothing_are_closed_and_lock_no_page_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """uvicorn times out an idle connection only after answering a request on it: 128 connections that sent
    nothing held every place of `limit_concurrency` for as long as they stayed open, and every page,
    /healthz included, answered 503 (a review, with `--allow-remote`). They are closed after
    `IDLE_SECONDS` now, like kept-alive ones."""
    import socket
    import time

    from templar.dashboard import server

    monkeypatch.setattr(server, "IDLE_SECONDS", 0.5)
    (tmp_path / "validator").mkdir()
    dash = BackgroundDashboard(Board(BoardConfig(validator_dirs=[tmp_path / "validator"])), "127.0.0.1", 0).start()
    host, port = dash.sock.getsockname()[:2]
    idle = [socket.create_connection((host, port)) for _ in range(130)]
    try:
        time.sleep(1.5)
        assert get(dash.url + "healthz")[0] == 200  # before: 503, for as long as they stayed open
        assert all(sock.recv(1) == b"" for sock in idle[:8])  # the server closed them
    finally:
        for sock in idle:
            sock.close()
        dash.stop()


def test_a_request_sent_a_byte_at_a_time_is_closed_at_its_deadline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Any byte stopped uvicorn's idle timer: a connection that sent `G` and waited, or one dripping a byte of
    its request line every 0.2 s, stayed open for good (a review: 128 of them, every page 503; more, every
    descriptor). The deadline runs from the connection's opening until its request's headers are in."""
    import socket
    import threading

    from templar.dashboard import server

    monkeypatch.setattr(server, "IDLE_SECONDS", 0.8)
    (tmp_path / "validator").mkdir()
    dash = BackgroundDashboard(Board(BoardConfig(validator_dirs=[tmp_path / "validator"])), "127.0.0.1", 0).start()
    host, port = dash.sock.getsockname()[:2]
    one_byte = socket.create_connection((host, port))
    one_byte.sendall(b"G")
    dripping = socket.create_connection((host, port))
    stop = threading.Event()

    def drip() -> None:
        for byte in b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX: " + b"y" * 100:
            if stop.wait(0.2):
                return
            try:
                dripping.send(bytes([byte]))
            except OSError:
                return  # closed by the server

    thread = threading.Thread(target=drip, daemon=True)
    thread.start()
    try:
        for sock in (one_byte, dripping):
            sock.settimeout(5)
            try:
                answer = sock.recv(64)
            except ConnectionResetError:  # the drip's next byte met the closed socket: the kernel's RST came first
                answer = b""
            assert answer == b""  # closed, with no answer, after 0.8 s; before: recv timed out (TimeoutError)
    finally:
        stop.set()
        thread.join()
        one_byte.close()
        dripping.close()
        dash.stop()


def test_connections_beyond_the_bound_are_closed_as_they_arrive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Each open connection held a descriptor, past `limit_concurrency` too (those only got a 503 once they
    asked): a flood of them ran the process out of descriptors, and accept() failed for everyone. One beyond
    `CONNECTIONS` is closed at once; a page is served again as soon as one closes."""
    import socket
    import time
    import urllib.error

    from templar.dashboard import server

    def healthz() -> int | None:
        try:
            return get(dash.url + "healthz")[0]
        except (urllib.error.URLError, ConnectionError):  # closed on arrival: the server has not seen a close yet
            return None

    monkeypatch.setattr(server, "CONNECTIONS", 4)
    monkeypatch.setattr(server, "IDLE_SECONDS", 60.0)  # only the bound closes a connection here
    (tmp_path / "validator").mkdir()
    dash = BackgroundDashboard(Board(BoardConfig(validator_dirs=[tmp_path / "validator"])), "127.0.0.1", 0).start()
    host, port = dash.sock.getsockname()[:2]
    held = [socket.create_connection((host, port)) for _ in range(4)]
    beyond = socket.create_connection((host, port))
    try:
        beyond.settimeout(5)
        assert beyond.recv(1) == b""  # closed on arrival; before: open until the idle deadline (recv timed out)
        held.pop().close()
        deadline = time.monotonic() + 5
        while (status := healthz()) != 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert status == 200
    finally:
        beyond.close()
        for sock in held:
            sock.close()
        dash.stop()


def test_a_newcomer_written_into_the_roster_during_the_run_gets_its_page(tmp_path: Path):
    """`templar localnet --newcomer` rewrites nodes.json as the newcomer registers: the dashboard, which
    read the roster when it started, reads it again once it changes and shows the new miner."""
    import os

    from templar.runtime.roster import NODES_FILE, NodeInfo, write_nodes

    nodes = [NodeInfo("validator0", "5Validator", 1, "validator", "lead", 10_000.0),
             NodeInfo("miner0", "5Miner", 2, "miner", "honest")]
    write_nodes(tmp_path, nodes)
    board = Board(BoardConfig(localnet=tmp_path))
    board.refresh_files()
    assert [m.name for m in board.miners] == ["miner0"] and not board.localnet.changed
    write_nodes(tmp_path, [*nodes, NodeInfo("newcomer0", "5Newcomer", 3, "miner", "honest")])
    read = board.localnet.loaded_mtime
    os.utime(tmp_path / NODES_FILE, (read + 1, read + 1))  # a file system's clock may not tick between the two
    board.refresh_files()
    assert [m.name for m in board.miners] == ["miner0", "newcomer0"] and board.labels["5Newcomer"].name == "newcomer0"
