"""Prometheus /metrics: off by default, on 127.0.0.1 when asked, fed by the records the roles write."""

from __future__ import annotations

import argparse
import urllib.request

import pytest

from templar.runtime.flags import add_node_args
from templar.runtime.metrics import NeuronMetrics, start_metrics
from templar.runtime.records import (
    MinerWindowRecord,
    PeerScoreRecord,
    ValidatorWindowRecord,
    add_listener,
    append_record,
    read_records,
    remove_listener,
)


def scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def peer(window: int, uid: int, hotkey: str, status: str = "ok", weight: float = 0.5) -> PeerScoreRecord:
    return PeerScoreRecord(window=window, hotkey=hotkey, uid=uid, status=status, evaluated=True, sync_steps=0.4,
                           delta_assigned=0.03, delta_rand=0.01, mu=0.6, rating=27.0, score=16.2, weight=weight,
                           in_top_g=status == "ok")


def vwindow(window: int) -> ValidatorWindowRecord:
    return ValidatorWindowRecord(window=window, global_step=window - 1, learning_rate=0.003, holdout_loss=7.25,
                                 peers_aggregated=2, gathered=3, evaluated=2, wall_seconds=6.5, weights_set=True)


def node_args(*extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_node_args(parser)
    return parser.parse_args(list(extra))


def test_metrics_are_off_by_default_and_loopback_when_on():
    args = node_args()
    assert args.metrics_port == 0 and args.metrics_host == "127.0.0.1"
    assert start_metrics(args, role="miner", hotkey="5F", uid=1) is None


def test_validator_metrics_follow_the_records_and_forget_departed_peers(tmp_path):
    metrics = start_metrics(node_args("--metrics.port", "0"), role="validator", hotkey="5Val", uid=0)
    assert metrics is None  # port 0 means off on the command line
    metrics = NeuronMetrics("validator", "5Val", 0)
    port = metrics.serve("127.0.0.1", 0)
    add_listener(metrics.on_record)
    try:
        scores = tmp_path / "scores.jsonl"
        for rec in (peer(5, 1, "5Aaa"), peer(5, 2, "5Bbb", status="late", weight=0.0), peer(5, 3, "5Ccc")):
            append_record(scores, rec)
        append_record(tmp_path / "validator_windows.jsonl", vwindow(5))
        m = scrape(port)
        assert m["templar_window"] == 5 and m["templar_global_step"] == 4 and m["templar_holdout_loss"] == 7.25
        assert m['templar_peer_weight{hotkey="5Aaa",uid="1"}'] == 0.5
        assert m['templar_peer_in_top_g{hotkey="5Bbb",uid="2"}'] == 0
        assert m['templar_gather_status{status="ok"}'] == 2 and m['templar_gather_status{status="late"}'] == 1
        assert m['templar_peer_status_total{status="late"}'] == 1
        assert m['templar_info{hotkey="5Val",role="validator",uid="0",version="0.1.0"}'] == 1
        assert "templar_tokens_per_second" not in m  # a miner's series only on a miner
        # uid 3 deregisters: gone from the next window's metrics; no peer is late any more
        append_record(scores, peer(6, 1, "5Aaa"))
        append_record(scores, peer(6, 2, "5Bbb"))
        append_record(tmp_path / "validator_windows.jsonl", vwindow(6))
        m = scrape(port)
        assert not any('uid="3"' in k for k in m)
        assert m['templar_gather_status{status="late"}'] == 0 and m["templar_windows_total"] == 2
    finally:
        metrics.close()
    assert len(list(read_records(scores))) == 5


def test_the_info_series_follows_the_uid_the_hotkey_holds_now():
    """A hotkey registered again holds another uid (`Node.check_registered` tells its `uid_followers`):
    `templar_info` then names that uid alone, not the start's beside it."""
    metrics = NeuronMetrics("miner", "5Min", 3)
    port = metrics.serve("127.0.0.1", 0)
    try:
        assert [k for k in scrape(port) if k.startswith("templar_info")] == [
            'templar_info{hotkey="5Min",role="miner",uid="3",version="0.1.0"}']
        metrics.follow_uid(7)
        assert [k for k in scrape(port) if k.startswith("templar_info")] == [
            'templar_info{hotkey="5Min",role="miner",uid="7",version="0.1.0"}']
    finally:
        metrics.close()


def test_miner_metrics_and_a_broken_listener_never_stop_a_record(tmp_path):
    metrics = NeuronMetrics("miner", "5Min", 4)
    port = metrics.serve("127.0.0.1", 0)
    add_listener(metrics.on_record)

    def broken(path, record):
        raise RuntimeError("exporter bug")

    add_listener(broken)
    try:
        append_record(tmp_path / "miner_windows.jsonl", MinerWindowRecord(
            window=9, phase="active", strategy="honest", global_step=8, loss=6.5, tokens_per_second=2500.0, pages=2,
            uploaded=True, upload_bytes=160_000, upload_seconds=0.2, peers_aggregated=4, overhead_share=0.2))
        m = scrape(port)
        assert m["templar_tokens_per_second"] == 2500 and m["templar_upload_bytes"] == 160_000
        assert m["templar_train_loss"] == 6.5 and m['templar_uploads_total{result="ok"}'] == 1
        assert "templar_holdout_loss" not in m and not any(k.startswith("templar_peer_") for k in m)
    finally:
        remove_listener(broken)
        metrics.close()
    assert len(list(read_records(tmp_path / "miner_windows.jsonl"))) == 1


def test_idle_connections_hold_a_bounded_number_of_threads_and_a_foreign_host_reads_nothing(monkeypatch):
    """prometheus_client's server ran a thread per connection, each waiting on its request for ever: 300
    idle connections held 300 of the node's threads. And it answered any Host header, so a web page could
    read a loopback exporter (every peer's hotkey, score and weight) through a name re-pointed at 127.0.0.1.
    Now at most `CONNECTIONS` are served at once, one that sends no request is closed after
    `REQUEST_SECONDS`, and on loopback a request must name a loopback host, as the dashboard's must."""
    import http.client
    import socket
    import threading
    import time

    from templar.runtime import metrics_server

    monkeypatch.setattr(metrics_server._Handler, "timeout", 0.5)  # the test waits half a second, not ten
    metrics = NeuronMetrics("miner", "5Min", 4)
    port = metrics.serve("127.0.0.1", 0)
    before = threading.active_count()
    try:
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(3 * metrics_server.CONNECTIONS)]
        time.sleep(0.2)
        assert threading.active_count() <= before + metrics_server.CONNECTIONS
        time.sleep(1.0)  # the held ones timed out: their slots are free again, the clients still connected
        assert "templar_info" in str(scrape(port))
        for sock in idle:
            sock.close()
        for host, status in (("attacker.example", 400), (f"127.0.0.1:{port}", 200), (f"localhost:{port}", 200)):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            conn.request("GET", "/metrics", headers={"Host": host})
            response = conn.getresponse()
            assert response.status == status, host
            assert (b"templar_" in response.read()) == (status == 200)
            conn.close()
    finally:
        metrics.close()


@pytest.mark.parametrize("start", [b"", b"GET /metrics HTTP/1.1\r\n"], ids=["request-line", "headers"])
def test_clients_dripping_a_request_byte_by_byte_are_closed_at_the_requests_deadline(monkeypatch, start):
    """The socket's timeout bounds each read, not the request: `CONNECTIONS` clients sending a byte of a request
    line every 0.2 s never tripped it and held every slot, each real scrape closed on arrival, for as long as
    they kept dripping. Each is closed once its request is not in after `REQUEST_SECONDS`, the request line's
    bytes dripped or, the line sent whole, its headers' (the first fix lifted the deadline before the headers)."""
    import contextlib
    import socket
    import threading
    import time

    from templar.runtime import metrics_server

    monkeypatch.setattr(metrics_server._Handler, "timeout", 0.5)
    monkeypatch.setattr(metrics_server, "REQUEST_SECONDS", 0.8)
    metrics = NeuronMetrics("miner", "5Min", 4)
    port = metrics.serve("127.0.0.1", 0)
    drippers = [socket.create_connection(("127.0.0.1", port)) for _ in range(metrics_server.CONNECTIONS)]
    for sock in drippers:
        sock.sendall(start)  # the request line at once, then its headers a byte at a time (a review's case)
    stop = threading.Event()

    def drip() -> None:
        while not stop.wait(0.2):
            for sock in drippers:
                with contextlib.suppress(OSError):  # closed at its deadline
                    sock.send(b"G")

    thread = threading.Thread(target=drip, daemon=True)
    thread.start()
    try:
        time.sleep(1.5)  # past the request's deadline, every dripper still sending
        assert "templar_info" in str(scrape(port))
    finally:
        stop.set()
        thread.join()
        for sock in drippers:
            sock.close()
        metrics.close()
