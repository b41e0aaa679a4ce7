"""Prometheus `/metrics` for a neuron: off by default, on 127.0.0.1 when enabled, never pushing.

    python neurons/validator.py ... --metrics.port 9101          # http://127.0.0.1:9101/metrics
    python neurons/miner.py ... --metrics.port 9102 --metrics.host 0.0.0.0   # logs a warning

Every number exported is one the roles already write to their JSONL records, so the exporter
follows them through `templar.runtime.records.add_listener` and the window loops carry no metrics code.
A validator exports per-uid scores and weights (labels `uid`, `hotkey`); a peer that leaves the
score book leaves the metrics at the next window, so label sets stay bounded by the subnet size.
Nothing is sent anywhere: Prometheus scrapes this endpoint, or nobody does.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import shutil
import time
from pathlib import Path

from loguru import logger
from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.process_collector import ProcessCollector

from templar import __version__
from templar.core.config import WindowConfig
from templar.core.verdicts import Status
from templar.runtime.metrics_server import serve_metrics
from templar.runtime.records import (
    MinerWindowRecord,
    PeerScoreRecord,
    ValidatorWindowRecord,
    WeightsRecord,
    add_listener,
    remove_listener,
)
from templar.storage.locator import is_loopback

DEFAULT_HOST = "127.0.0.1"


def add_metrics_args(parser: argparse.ArgumentParser) -> None:
    """`--metrics.port` (0: off, the default) and `--metrics.host` (default 127.0.0.1)."""
    group = parser.add_argument_group("metrics")
    group.add_argument("--metrics.port", dest="metrics_port", type=int, default=0,
                       help="serve Prometheus metrics on this port (default 0: off)")
    group.add_argument("--metrics.host", dest="metrics_host", default=DEFAULT_HOST,
                       help="address for --metrics.port (default 127.0.0.1; anything else is reachable "
                            "from the network and logs a warning)")


class NeuronMetrics:
    """The gauges and counters of one neuron, updated from its records.

    Besides the records' numbers, what the alert rules (`deploy/prometheus/templar-alerts.yml`)
    compare them with: the run's window length and weights cadence, when the last window ended,
    and the state directory's free disk against the state file (read at each scrape)."""

    def __init__(self, role: str, hotkey: str, uid: int | None, registry: CollectorRegistry | None = None, *,
                 windows: WindowConfig | None = None, state_file: Path | None = None, shadow: bool = False):
        self.registry = registry or CollectorRegistry(auto_describe=True)
        r = self.registry
        ProcessCollector(registry=r)
        self.role, self.hotkey, self._info_labels = role, hotkey, None
        self.info = Gauge("templar_info", "This neuron (value 1)", ["role", "hotkey", "uid", "version"], registry=r)
        self.follow_uid(uid)
        self.window_length = Gauge("templar_window_length_seconds", "A window of this run: blocks × block time",
                                   registry=r)
        if windows is not None:
            self.window_length.set(windows.blocks_per_window * windows.block_time)
        self.last_window_time = Gauge("templar_last_window_timestamp_seconds",
                                      "Unix time this neuron last finished a window", registry=r)
        self.state_free = Gauge("templar_state_disk_free_bytes", "Free bytes on the disk of the state directory",
                                registry=r)
        self.state_bytes = Gauge("templar_state_bytes", "Size of the node's state file (each save writes a new one "
                                 "beside it)", registry=r)
        if state_file is not None:
            self.state_free.set_function(_measured(lambda: shutil.disk_usage(state_file.parent).free))
            self.state_bytes.set_function(_measured(lambda: state_file.stat().st_size))
        self.window = Gauge("templar_window", "Last window this neuron finished", registry=r)
        self.global_step = Gauge("templar_global_step", "global_step after the last window", registry=r)
        self.windows = Counter("templar_windows", "Windows finished since start", registry=r)
        self.peers_aggregated = Gauge("templar_peers_aggregated", "Payloads in the last outer step", registry=r)
        # Each role exports only its own series: the other role's are created unregistered.
        m = r if role == "miner" else None
        v = r if role == "validator" else None
        # miner
        self.loss = Gauge("templar_train_loss", "Miner: training loss of the last window", registry=m)
        self.tokens = Gauge("templar_tokens_per_second", "Miner: training throughput of the last window", registry=m)
        self.overhead = Gauge("templar_overhead_share", "Miner: share of the window spent outside forward/backward",
                              registry=m)
        self.utilisation = Gauge("templar_compute_utilisation", "Miner: training seconds of the last window trained "
                                 "over its wall-clock seconds", registry=m)
        self.upload_bytes = Gauge("templar_upload_bytes", "Miner: size of the last upload", registry=m)
        self.upload_seconds = Gauge("templar_upload_seconds", "Miner: duration of the last upload (put)", registry=m)
        self.uploads = Counter("templar_uploads", "Miner: uploads by result", ["result"], registry=m)
        self.catching_up = Gauge("templar_catching_up", "Miner: 1 when its last window ended in catch-up (the lead's "
                                 "update of it could not be had), 0 after a window it aggregated", registry=m)
        # validator
        self.holdout = Gauge("templar_holdout_loss", "Validator: held-out loss after the last outer step", registry=v)
        self.lr = Gauge("templar_learning_rate", "Learning rate of the last outer step", registry=v)
        self.window_seconds = Gauge("templar_window_seconds", "Validator: seconds from gather start to saved",
                                    registry=v)
        self.gathered = Gauge("templar_gathered", "Validator: payloads requested in the last gather", registry=v)
        self.evaluated = Gauge("templar_evaluated", "Validator: peers primary-evaluated last window", registry=v)
        self.weights_set = Counter("templar_weights_set", "Validator: windows in which weights were set", registry=v)
        self.lead = Gauge("templar_lead", "Validator: 1 while this validator is the lead (it publishes the run)",
                          registry=v)
        self.shadow = Gauge("templar_shadow", "Validator: 1 in shadow mode (--shadow: scores, never sets weights)",
                            registry=v)
        self.shadow.set(1 if shadow else 0)
        self.windows_per_weights = Gauge("templar_windows_per_weights", "Validator: windows between two weights "
                                         "windows of this run", registry=v)
        if windows is not None:
            self.windows_per_weights.set(windows.windows_per_weights)
        self.weights_refusals = Counter("templar_weights_refusals", "Validator: weight writes the chain refused, by "
                                        "reason (rate_limited, priority_too_low, commit_reveal, stake, "
                                        "stale_metagraph, error)", ["reason"], registry=v)
        self.weights_pending = Gauge("templar_weights_pending", "Validator: 1 while refused weights are being retried",
                                     registry=v)
        self.weights_last_set = Gauge("templar_weights_last_set_window", "Validator: weights window of the last "
                                      "weights the chain accepted", registry=v)
        self.gather_status = Gauge("templar_gather_status", "Validator: peers per gather/fast-eval status, last window",
                                   ["status"], registry=v)
        self.status_total = Counter("templar_peer_status", "Validator: peer verdicts by status since start",
                                    ["status"], registry=v)
        peer = ["uid", "hotkey"]
        self.score = Gauge("templar_peer_score", "Validator: PeerScore per uid", peer, registry=v)
        self.weight = Gauge("templar_peer_weight", "Validator: normalised weight per uid", peer, registry=v)
        self.mu = Gauge("templar_peer_mu", "Validator: proof-of-computation μ per uid", peer, registry=v)
        self.rating = Gauge("templar_peer_rating", "Validator: LossRating per uid", peer, registry=v)
        self.top_g = Gauge("templar_peer_in_top_g", "Validator: 1 if the uid is in the top-G", peer, registry=v)
        self.sync = Gauge("templar_peer_sync_steps", "Validator: sync score in steps (absent when unmeasured)",
                          peer, registry=v)
        self._peer_gauges = (self.score, self.weight, self.mu, self.rating, self.top_g, self.sync)
        self._seen: set[tuple[str, str]] = set()       # label sets of the window being recorded
        self._exported: set[tuple[str, str]] = set()   # label sets exported after the last window
        self._statuses: dict[str, int] = {}
        self._status_names: set[str] = set()
        self._server = None

    # ---- updates ------------------------------------------------------------------------------

    def follow_uid(self, uid: int | None) -> None:
        """`templar_info` names the uid our hotkey holds now: one series, never the uid of the start beside
        it (a hotkey registered again holds another uid, and dashboards join on this label)."""
        labels = (self.role, self.hotkey, "" if uid is None else str(uid), __version__)
        self.info.labels(*labels).set(1)  # the new series first: a scrape in between sees one or both, never none
        if self._info_labels not in (None, labels):
            self.info.remove(*self._info_labels)
        self._info_labels = labels

    def on_record(self, path: Path, record: object) -> None:
        if isinstance(record, PeerScoreRecord):
            self._peer(record)
        elif isinstance(record, ValidatorWindowRecord):
            self._validator_window(record)
        elif isinstance(record, MinerWindowRecord):
            self._miner_window(record)
        elif isinstance(record, WeightsRecord):
            self._weights(record)

    def _weights(self, rec: WeightsRecord) -> None:
        if rec.outcome == "refused":
            self.weights_refusals.labels(rec.reason[:32] or "error").inc()
            self.weights_pending.set(1)
            return
        self.weights_pending.set(0)
        if rec.outcome == "set":
            self.weights_last_set.set(rec.window)

    def _peer(self, rec: PeerScoreRecord) -> None:
        labels = (str(rec.uid), rec.hotkey)
        self._seen.add(labels)
        self.score.labels(*labels).set(rec.score)
        self.weight.labels(*labels).set(rec.weight)
        self.mu.labels(*labels).set(rec.mu)
        self.rating.labels(*labels).set(rec.rating)
        self.top_g.labels(*labels).set(1 if rec.in_top_g else 0)
        if rec.sync_steps is not None and math.isfinite(rec.sync_steps):
            self.sync.labels(*labels).set(rec.sync_steps)
        else:
            self._drop(self.sync, labels)
        status = rec.status[:64]
        self._statuses[status] = self._statuses.get(status, 0) + 1
        if status != Status.NOT_SAMPLED:
            self.status_total.labels(status).inc()

    def _validator_window(self, rec: ValidatorWindowRecord) -> None:
        self._common(rec.window, rec.global_step, rec.peers_aggregated)
        self.lead.set(1 if rec.lead else 0)
        self.holdout.set(rec.holdout_loss)
        self.lr.set(rec.learning_rate)
        self.window_seconds.set(rec.wall_seconds)
        self.gathered.set(rec.gathered)
        self.evaluated.set(rec.evaluated)
        if rec.weights_set:
            self.weights_set.inc()
        for gone in self._exported - self._seen:  # deregistered or replaced: stop exporting it
            for gauge in self._peer_gauges:
                self._drop(gauge, gone)
        self._exported, self._seen = self._seen, set()
        for status in self._status_names | set(self._statuses):
            self.gather_status.labels(status).set(self._statuses.get(status, 0))
        self._status_names |= set(self._statuses)
        self._statuses = {}

    def _miner_window(self, rec: MinerWindowRecord) -> None:
        self._common(rec.window, rec.global_step, rec.peers_aggregated)
        if rec.loss is not None and math.isfinite(rec.loss):
            self.loss.set(rec.loss)
        self.tokens.set(rec.tokens_per_second)
        self.overhead.set(rec.overhead_share)
        if rec.train_seconds > 0:
            self.utilisation.set(rec.utilisation)
        self.upload_bytes.set(rec.upload_bytes)
        self.upload_seconds.set(rec.upload_seconds)
        self.uploads.labels("ok" if rec.uploaded else "failed").inc()
        self.catching_up.set(1 if rec.phase == "catchup" else 0)

    def _common(self, window: int, step: int, aggregated: int) -> None:
        self.last_window_time.set(time.time())
        self.window.set(window)
        self.global_step.set(step)
        self.peers_aggregated.set(aggregated)
        self.windows.inc()

    @staticmethod
    def _drop(gauge: Gauge, labels: tuple[str, str]) -> None:
        with contextlib.suppress(KeyError):
            gauge.remove(*labels)

    # ---- serving ------------------------------------------------------------------------------

    def serve(self, host: str, port: int) -> int:
        """Start the HTTP endpoint; returns the bound port (0 picks a free one). Raises OSError."""
        if not is_loopback(host):
            logger.warning(f"metrics bound to {host}:{port}: reachable from the network, without authentication")
        server = serve_metrics(self.registry, host, port)  # bounded, timed, Host-checked (metrics_server)
        self._server = server
        return server.server_address[1]

    def close(self) -> None:
        remove_listener(self.on_record)
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def _measured(read):
    """A gauge callback that reads the file system at scrape time; NaN when it cannot (a scrape
    never fails because a disk did)."""
    def value() -> float:
        try:
            return float(read())
        except OSError:
            return math.nan
    return value


def start_metrics(args: argparse.Namespace, *, role: str, hotkey: str, uid: int | None,
                  windows: WindowConfig | None = None, state_file: Path | None = None,
                  shadow: bool = False) -> NeuronMetrics | None:
    """For entry points: the exporter the flags ask for, following this process's records.

    Off (None) unless `--metrics.port` is set. A port that cannot be bound is logged as an error
    and the neuron runs on without metrics: they observe the node, they are not part of it.
    """
    port = getattr(args, "metrics_port", 0) or 0
    if port <= 0:
        return None
    host = getattr(args, "metrics_host", DEFAULT_HOST) or DEFAULT_HOST
    metrics = NeuronMetrics(role, hotkey, uid, windows=windows, state_file=state_file, shadow=shadow)
    try:
        bound = metrics.serve(host, port)
    except (OSError, OverflowError) as exc:
        logger.error(f"metrics: cannot listen on {host}:{port} ({getattr(exc, 'strerror', None) or exc}); running without /metrics")
        return None
    add_listener(metrics.on_record)
    logger.info(f"metrics: Prometheus endpoint on http://{host}:{bound}/metrics")
    return metrics
