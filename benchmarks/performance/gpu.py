"""The production window, memory settings, the validator, evaluation noise and cross-device consensus, on one GPU.

    python -m benchmarks.performance.gpu                   # 1.2B in bf16 on the GPU: writes results/gpu_<device>.json
    python -m benchmarks.performance.gpu --smoke           # the same code on tiny's rules, a micro model and the CPU (~8 s; tests)
    python -m benchmarks.performance.gpu --phases corpus,window --budget 200

Every GPU figure of the project was an estimate (the sizing table of docs/mining.md assumes 40 %
MFU); this script replaces them with measurements in one short device call. It runs the project's
own functions (`accumulate_gradients`, `DeMo`, `write_gradient`/`read_gradient`, the run's outer rule
(`compress.methods.rule_of`: its compressor, `aggregate`, `trial` and `apply`), `Evaluator`,
`model_fingerprint`/`model_in_sync`) and none of the chain layer: `templar.runtime.consensus.outer`
imports `templar.chain` (bittensor), so the outer step is its two pure halves, the rule's `aggregate`
and `apply` at `core.schedule.learning_rate`;
payloads are signed with a stand-in HMAC (`StandInKey`) instead of sr25519.

Its parts, one idea each: this file (the window's and the validator's phases, and the run), `gpu_bench.py`
(the scales, the run's state `Bench`, the device facts), `gpu_memory.py` (the memory phase),
`gpu_consensus.py` (the consensus phase), `gpu_noise.py` (the noise phase) and `gpu_report.py` (the noise phase's summaries and the
table); the device call runs this module from the repository root
(`python3 -m benchmarks.performance.gpu`), which imports its siblings as `benchmarks.performance.*`
and `benchmarks._common`.

Phases (`--phases`, comma-separated; `setup` always runs). Each is one function writing its part
of the JSON; an exception (a CUDA OOM too) is recorded as that phase's error and the next phase
still runs; the JSON is rewritten after every phase, so a killed run leaves what it measured. Each
phase starts from θ_0: the window phase trains the shared model and the consensus phase applies a
window to it, so `run_phase` puts θ_0 back after every phase (until 2026-12-04 a noise phase run after
the consensus phase started from that window).
Estimates for one H100 (the sizing formulas at ~35 % MFU; CPU parts scaled from this 2-core VM,
where the torch CPU paths at 1.2B took 104 s to compress, 42 s to decode one peer's signs and
83 s to aggregate 15 peers on 2 loaded threads; the device's 16 cores are assumed ~8× faster):

| phase | what | estimate | cap |
|---|---|---|---|
| start-up | imports, CUDA context | 15 s | |
| setup | versions, device, the sizing table's estimates | 1 s | |
| corpus | a 32,000-entry byte-level BPE trained on the offline sample corpus the way `scripts/build_assets.py` trains tiny's (8 s on 2 cores here), then `templar.data.prepare` at 2,048 × 64 (2.4 M tokens, 18 pages; 17–33 s on 2 cores here); cached in `assets/gpu_sample_32000`. With tokenizers 0.23.3 the tokenizer's sha256 is 823b1725… and the manifest digest 49cc596a…, both in the JSON | 30 s | 90 s |
| window | 1.2B built on the CPU from `init_seed` (12 s here), one untimed and 6 timed forward+backward passes of a micro-batch, the paper's window (the run's pages, micro-batches accumulated, one gradient) and production's (the same pages in the run's inner steps), the share of an 84 s window the GPU trains, blocking and overlapped (`busy_fractions`), the DeMo step, encoding the payload, decoding it 15 times (full reads), aggregating 15 peers on the CPU (what a node does today: decoded payloads stay in host memory) and on the GPU, the outer step; the 15 peers' updates are real DeMo steps on one micro-batch each | 60 s | 120 s |
| memory | each memory setting of the miner (default, `--memory.offload`, and with `--memory.checkpoint_activations`) from the same θ, twice each: 2 inner AdamW steps of one micro-batch and the DeMo step as the node runs them, `torch.cuda.max_memory_allocated` reset before each: its peak beside `templar.tools.sizing`'s estimate, its seconds (first run: pinned buffers allocated; second: every later window), whether the default repeats itself bit for bit with the fast kernels, and whether every setting sends the default's update bit for bit under deterministic kernels (math attention, one sequence a step) | 60 s | 90 s |
| validator | one peer's sign decode on the CPU and the GPU, `Evaluator.score_peers` with 3 peers on one production page each (signs held on the host, as the validator held them until 2026-12-04; it now makes each on the GPU when it evaluates the peer, which the device decode times), the random page and 4 held-out pages alone: seconds per peer, peers per 84 s window; then the same 3 peers under each per-unit baseline of the proof (the groups' common steps, the other peers' own steps), over every sequence and over a secret quarter of each page's, with their sequence-forwards, and the 8-peer window under the others on a quarter at that pass's rate; then a validator's gather read strictly on the host (one payload read 4 times, then 16 times in the gather's 16 threads, projected to F_t and the peer list: 79 reads in production) | 60 s | 120 s |
| consensus | one gradient compressed on the GPU and the CPU (kept sets of decoder layer 0, embeddings, head and final norm: the CPU side is torch's path), the 15 peers aggregated on both (fixed-point accumulators bit for bit, signs), the window applied to θ on both, `model_in_sync` | 35 s | 90 s |
| noise | 48 AdamW steps away from θ_0 on 2 pages, 4 honest peers train on 3 pages each (the run's inner steps, then one DeMo step each; a production peer trains 29, which the 18-page sample corpus cannot hold for 4 peers), LossScores per page on 4 random pages and their own pages: spread of δ across pages and across peers, and what the proof of computation by size credits each honest peer, range by range of each sequence | 90 s | 150 s |

On an H200 (2026-11-28, `benchmarks/results/gpu_nvidia_h200.json`) the phases took 17, 212 (two
whole 1.2B windows of about 80 s: the window phase runs past its cap), 65, 27–53, 12–28 and 87 s:
about 5.5 minutes with the start-up; `--budget` (480 s) is the whole run's deadline: a phase is
skipped when less than its minimum is left, and `noise` trains fewer peers when its cap is near.
Under SparseLoCo the validator phase takes 125 s and `noise` trains 2 peers within its 150 s cap,
too few for the others' baseline (3 others each); `--phases corpus,noise --cap noise=345 --budget 385`
trains all 4 and evaluates every baseline in 284 s (2026-11-29,
`benchmarks/results/gpu_nvidia_h200_proof_baselines.json`, two calls).
The sample corpus gives 18 production pages (2.4 M tokens), and `noise` uses all of them: 2 to
train away from θ_0, 4 × 3 assigned, 4 random; more peers or pages need a larger corpus.
`measure_window(b, hp, steps)` times the window at any number of inner steps (`--smoke` also runs
H = 2 on tiny). On 2026-12-04 (`results/gpu_nvidia_h200_2026-12-04*.json`) `--phases
corpus,validator,consensus,noise --cap noise=345 --budget 520` took 485 s (27, 143, 29 and 287 s a
phase), and `--hparams benchmarks/presets/gpu_window_parts.json --phases corpus,window` (production's
model and rule on 2 pages and 2 inner steps: the rule's parts of a window without its 78 s of
training) 106 s with the corpus carried in `assets/gpu_sample_32000`.

On the device machine (Python 3.12, torch, transformers, safetensors, numpy; no network, no
bittensor). Here, once: `bash benchmarks/performance/gpu_wheels.sh` puts the wheels it lacks in the git-ignored
`benchmarks/.gpu_wheels/` (24 wheels, 22 MB: pydantic and pydantic-core for cp312, loguru, openskill, and
aiobotocore with its closure, which `templar.data` imports through `templar.storage`). The one
device call carries `benchmarks/.gpu_wheels` and `assets/corpus` (10 MB of text, from
`scripts/build_assets.py`):

    python3 -m pip install -q --no-index --find-links benchmarks/.gpu_wheels --target /tmp/gpu_site \
        pydantic loguru aiobotocore openskill && \
    PYTHONPATH=src:/tmp/gpu_site timeout 540 python3 -m benchmarks.performance.gpu 2>&1 | tee "$OUT/gpu.log"; \
    cp benchmarks/results/gpu_*.json "$OUT"/

`--target` installs beside the image's packages without touching them (and without the
externally-managed-environment refusal). The C kernels (`templar.compress._native`) are not built
there: the CPU sides run torch's paths, as on a node without a compiler (a node with them
accumulates faster; the inverse DCT is torch's either way). The JSON's `table` lists each measured
figure beside the estimate it replaces.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import math
import os
import platform
import resource
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from benchmarks._common import RESULTS_DIR, _rounded, write_result
from benchmarks.performance.gpu_bench import (
    COMMON_GROUPS,
    PHASES,
    PRODUCTION,
    ROOT,
    SMOKE,
    WINDOW,
    Bench,
    Scale,
    device_slug,
    free_memory,
    peak_flops,
    peak_lr,
    production_inner_steps,
)
from benchmarks.performance.gpu_consensus import phase_consensus
from benchmarks.performance.gpu_memory import phase_memory
from benchmarks.performance.gpu_noise import phase_noise
from benchmarks.performance.gpu_report import print_table, table
from templar.compress import native
from templar.core.config import HParams
from templar.gauntlet.selection import select_eval_sequences
from templar.runtime.train import (
    accumulate_gradients,
    evaluate_loss,
    gradients,
    inner_lr,
    inner_steps,
    make_inner_optimizer,
)
from templar.tools.sizing import PCIE_BYTES_PER_SECOND, compute_span, state_file_bytes, window_sizing
from templar.validator.evaluate import Evaluator, read_sequences
from templar.wire import read_gradient, take_probes, write_gradient


def phase_setup(b: Bench) -> dict[str, Any]:
    """Versions, the device, and the sizing table's estimates the measurements replace."""
    import numpy
    import transformers

    hp = b.hp
    sizing = window_sizing(hp)
    peak, peak_source = peak_flops(b.device)
    out: dict[str, Any] = {
        "python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
        "numpy": numpy.__version__, "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "device": str(b.device), "native_kernels": native.available(),
        "bittensor_imported": "bittensor" in sys.modules,
        "hparams": hp.name, "digest": hp.digest(), "parameters": sizing["parameters"], "vocab": hp.model.vocab_size,
        "peak_bf16_flops": peak, "peak_source": peak_source,
        "estimate": {k: sizing[k] for k in ("tokens_per_window_per_peer", "train_flops_per_window", "mfu_assumed",
                                            "h100_train_seconds", "validator_eval_tokens_per_window",
                                            "validator_eval_flops_per_window", "h100_validator_eval_seconds",
                                            "miner_gpu_memory_gb", "validator_gpu_memory_gb", "window_seconds",
                                            "miner_gpu_overhead_seconds", "miner_compute_utilisation")},
    }
    if b.device.type == "cuda":
        props = torch.cuda.get_device_properties(b.device)
        out.update(device_name=props.name, capability=f"{props.major}.{props.minor}",
                   gpu_memory_gb=props.total_memory / 1e9, cuda=torch.version.cuda,
                   tf32_matmul=torch.backends.cuda.matmul.allow_tf32, bf16_supported=torch.cuda.is_bf16_supported())
    return out


def _build_assets() -> Any:
    """`scripts/build_assets.py` as a module: the tokenizer is trained the way the bootstrap trains tiny's."""
    spec = importlib.util.spec_from_file_location("build_assets", ROOT / "scripts" / "build_assets.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def phase_corpus(b: Bench) -> dict[str, Any]:
    """The offline sample corpus at the run's geometry with a `scale.vocab`-entry tokenizer (cached)."""
    from templar.data.prepare import Geometry, prepare

    source = ROOT / "assets" / "corpus"
    files = sorted(source.glob("*.jsonl"))
    if not files:
        raise RuntimeError(f"no sample corpus in {source}: run scripts/build_assets.py (or carry assets/corpus)")
    out: dict[str, Any] = {"source": str(source.relative_to(ROOT)), "source_mb": sum(f.stat().st_size for f in files) / 1e6}
    tokenizer, shards = b.work / "tokenizer", b.work / "shards"
    if b.scale.max_documents is not None:  # smoke: the first documents of each file, same code path
        sliced = b.work / "corpus"
        sliced.mkdir(parents=True, exist_ok=True)
        for f in files:
            with f.open(encoding="utf-8") as src:
                lines = [line for _, line in zip(range(b.scale.max_documents), src, strict=False)]
            (sliced / f.name).write_text("".join(lines), encoding="utf-8")
        files, source = sorted(sliced.glob("*.jsonl")), sliced
    if (tokenizer / "tokenizer.json").is_file():
        out["tokenizer_seconds"], out["tokenizer_cached"] = 0.0, True
    else:
        _, out["tokenizer_seconds"] = b.timed(lambda: _build_assets().train_tokenizer(files, tokenizer, b.scale.vocab))
    d = b.hp.data
    geometry = Geometry(sequence_length=d.sequence_length, sequences_per_page=d.sequences_per_page,
                        pages_per_shard=1 << 16)
    manifest, out["prepare_seconds"] = b.timed(lambda: prepare(
        str(source), str(tokenizer), shards, geometry, name=f"sample-{d.sequence_length}",
        workers=b.scale.workers, progress=False))
    if manifest.tokenizer.vocab_size > b.hp.model.vocab_size:
        raise RuntimeError(f"tokenizer has {manifest.tokenizer.vocab_size} entries, the model {b.hp.model.vocab_size}")
    b._corpus = None
    out.update(pages=manifest.num_pages, tokens=manifest.num_tokens, page_tokens=d.sequence_length * d.sequences_per_page,
               vocab=manifest.tokenizer.vocab_size, tokenizer_sha256=manifest.tokenizer.sha256,
               digest=manifest.digest(), work=str(b.work))
    return out


def measure_window(b: Bench, hp: HParams, steps_per_window: int, *, timed_micro_batches: int | None = None,
                   ) -> dict[str, Any]:
    """One miner window under `hp` with `steps_per_window` optimizer steps (1: the paper's single
    gradient over the assigned pages, micro-batches accumulated), split into its parts; first one
    untimed forward+backward (kernel selection, allocator) and `timed_micro_batches` timed alone."""
    model, mb = b.model(), hp.optimizer.micro_batch_size
    batch = b.pages(range(hp.data.pages_per_window))
    lr = peak_lr(hp)
    tokens = int(batch.numel())
    sizing = window_sizing(hp)  # the sizing table's FLOP arithmetic: 6·N + 12·L·d·S per trained token
    flops_per_token = sizing["train_flops_per_window"] / sizing["tokens_per_window_per_peer"]
    peak, _ = peak_flops(b.device)

    def mfu(n_tokens: int, seconds: float) -> float | None:
        return n_tokens * flops_per_token / seconds / peak if peak and seconds > 0 else None

    out: dict[str, Any] = {"steps_per_window": steps_per_window, "tokens": tokens, "micro_batch": mb,
                           "flops_per_token": flops_per_token}
    timed_micro_batches = b.scale.timed_micro_batches if timed_micro_batches is None else timed_micro_batches
    if timed_micro_batches:
        _, out["warmup_seconds"] = b.timed(accumulate_gradients, model, batch[:mb], mb)
        per_micro = [b.timed(accumulate_gradients, model, batch[i * mb:(i + 1) * mb], mb)[1]
                     for i in range(timed_micro_batches)]
        model.zero_grad(set_to_none=True)
        fb = statistics.median(per_micro)
        out["forward_backward_per_micro_batch"] = {"median_seconds": fb, "min_seconds": min(per_micro),
                                                   "tokens_per_second": mb * batch.size(1) / fb,
                                                   "mfu": mfu(mb * batch.size(1), fb)}
    demo = b.demo()
    # the miner's own inner steps (`runtime.train.inner_steps`): the hparams' when they ask for this
    # many steps, else AdamW at that many (the paper's window is one SGD step)
    inner = hp.inner if steps_per_window == hp.inner.steps else hp.inner.model_copy(
        update={"steps": steps_per_window, "optimizer": "sgd" if steps_per_window == 1 else "adamw"})
    inner_opt = make_inner_optimizer(model, inner)
    b.reset_peak()
    rate = inner_lr(inner, hp.optimizer.warmup_steps, hp.optimizer)  # the peak, as `lr` is α's
    stats, out["train_seconds"] = b.timed(lambda: inner_steps(model, batch, mb, hp.optimizer.grad_clip, inner=inner,
                                                              optimizer=inner_opt, lr=rate))
    out["train_loss"] = stats.loss
    out["inner_optimizer"] = inner.optimizer
    grads = gradients(model)
    out["tokens_per_second"] = tokens / out["train_seconds"]
    out["mfu"] = mfu(tokens, out["train_seconds"])
    compressed, out["compress_seconds"] = b.timed(demo.step, grads, stats.scale)
    inner_opt = None  # its moments: not part of the rest of the window
    del grads
    model.zero_grad(set_to_none=True)
    out["peak_memory_gb"] = b.peak_gb()  # θ, gradients, error feedback, activations, compression scratch
    probes = take_probes({n: p for n, p in model.named_parameters() if p.requires_grad}, seed=hp.data.data_seed,
                         window=WINDOW, count=hp.gauntlet.probe_count)
    payload, out["encode_seconds"] = b.timed(write_gradient, compressed, probes, window=WINDOW, global_step=0,
                                             hotkey="miner", hp=hp, run=b.run, sign=b.key.sign)
    out["payload_bytes"] = len(payload)
    del compressed
    g = hp.gauntlet.top_g
    decoded = []
    for _ in range(g):  # each a full read: size cap, header, schema, signature, digest, decode
        _, seconds = b.timed(read_gradient, payload, b.shapes, hp, run=b.run, verify=b.key.verify,
                             expected_hotkey="miner", expected_window=WINDOW)
        decoded.append(seconds)
    out["decode_seconds_per_peer"] = statistics.median(decoded)
    out["decode_seconds"] = sum(decoded)
    peers = b.peers()
    weights = [1.0 / g] * len(peers)
    rule = b.rule
    out["outer_rule"] = rule.name
    update, out["aggregate_cpu_seconds"] = b.timed(lambda: rule.aggregate(peers, weights, b.shapes))
    out["aggregate_peers"] = len(peers)
    if b.device.type != "cpu":
        on_device, out["peers_to_device_seconds"] = b.timed(
            lambda: [{n: c.to(b.device) for n, c in p.items()} for p in peers])
        update_device, out["aggregate_device_seconds"] = b.timed(lambda: rule.aggregate(on_device, weights, b.shapes))
        del on_device
        _, out["outer_step_device_signs_seconds"] = b.timed(
            lambda: rule.apply(model, update_device, lr, hp.optimizer.weight_decay))
        del update_device
    _, out["outer_step_seconds"] = b.timed(lambda: rule.apply(model, update, lr, hp.optimizer.weight_decay))
    return out


def busy_fractions(hp: HParams, m: dict[str, Any]) -> dict[str, Any]:
    """The share of a production window the miner's GPU trains, from this device's measured window
    (`measure_window`), under the blocking protocol and the overlapped one `hp` runs: the spans are
    `templar.tools.sizing.compute_span`'s landmarks, with the GPU work an overlapped miner cannot hide
    (compression and the outer step, measured; the state file's copy off the GPU, estimated at
    `PCIE_BYTES_PER_SECOND`) taken from the measurement instead of the sizing's assumptions."""
    window_s = hp.windows.window_seconds
    step_s = m.get("outer_step_device_signs_seconds", m["outer_step_seconds"])
    copy_s = state_file_bytes(hp, "miner") / PCIE_BYTES_PER_SECOND
    overhead = m["compress_seconds"] + step_s + copy_s
    blocking_hp = hp.model_copy(update={"inner": hp.inner.model_copy(update={"overlap": "blocking"})})
    blocking_span = compute_span(blocking_hp, m["payload_bytes"])
    overlapped_span = max(0.0, window_s - overhead)
    train_s = m["train_seconds"]
    return {"overlap": hp.inner.overlap, "window_seconds": window_s, "train_seconds": train_s,
            "gpu_overhead_seconds": overhead, "state_copy_seconds_estimate": copy_s,
            "blocking_span_seconds": blocking_span, "overlapped_span_seconds": overlapped_span,
            "blocking_busy_fraction": min(train_s, blocking_span) / window_s,
            "overlapped_busy_fraction": min(train_s, overlapped_span) / window_s,
            "overlapped_fits": train_s <= overlapped_span}


def phase_window(b: Bench) -> dict[str, Any]:
    """The miner's window at the paper's settings, and at production's once hparams have inner steps,
    with the share of a window the GPU trains, blocking and overlapped (`busy_fractions`)."""
    out = {"paper": measure_window(b, b.hp, 1)}
    steps = production_inner_steps(b.hp)
    out["production"] = measure_window(b, b.hp, steps) if steps > 1 else "the paper's: hparams have no inner steps yet"
    if isinstance(out["production"], dict):
        out["busy"] = busy_fractions(b.hp, out["production"])
    if b.scale.inner_steps_exercised > 1:  # keeps the inner-step path running where it is cheap (smoke)
        steps = b.scale.inner_steps_exercised
        out[f"inner_steps_{steps}"] = measure_window(b, b.hp, steps, timed_micro_batches=0)
    b.release_demo()
    return out


def phase_validator(b: Bench) -> dict[str, Any]:
    """LossScore evaluation at the run's page size: seconds per peer, and peers per window."""
    hp, model = b.hp, b.model()
    peers = b.peers()
    b.release_demo()  # a validator holds no error feedback
    d = hp.data
    out: dict[str, Any] = {"page_tokens": d.sequence_length * d.sequences_per_page, "eval_pages": d.eval_pages}
    # A validator decodes each evaluated payload into its trial step with the rule's `trial` (at the
    # window's median payload norm under a rule that applies magnitudes, `trial_reference`) where the
    # decoded payload is: in host memory today. The same on the device is timed beside it.
    rule = b.rule
    reference = rule.trial_reference(peers[:b.scale.validator_peers])
    trial = functools.partial(rule.trial, reference=reference, max_lift=hp.gauntlet.trial_max_lift)
    signs = [b.timed(lambda: trial(peers[0], b.shapes))]
    out["sign_decode_cpu_seconds"] = signs[0][1]
    signs = [signs[0][0]]
    if b.device.type != "cpu":
        on_device = {n: c.to(b.device) for n, c in peers[0].items()}
        _, out["sign_decode_device_seconds"] = b.timed(lambda d=on_device: trial(d, b.shapes))
        del on_device
    for p in peers[1:b.scale.validator_peers]:  # faster on the device; held on the host like the first
        on_device = {n: c.to(b.device) for n, c in p.items()}
        signs.append({n: t.to("cpu") for n, t in trial(on_device, b.shapes).items()})
        del on_device
    evaluator = Evaluator(model, hp.optimizer.micro_batch_size, position_ranges=hp.gauntlet.position_ranges)
    beta = hp.gauntlet.eval_lr_factor * peak_lr(hp)
    n = len(signs)
    random_batch = b.pages(range(d.eval_pages))
    assigned = {f"peer{i}": b.pages(range(d.eval_pages * (1 + i), d.eval_pages * (2 + i))) for i in range(n)}
    free_memory()
    evaluator.losses(random_batch)  # warm-up: kernels for the evaluation's shapes
    b.reset_peak()
    _, out["score_peers_seconds"] = b.timed(evaluator.score_peers, {f"peer{i}": signs[i] for i in range(n)},
                                            assigned, random_batch, beta, d.sequences_per_page)
    out["peak_memory_gb"] = b.peak_gb()  # θ, the rollback copy, activations of a forward pass
    out["score_peers_peers"] = n
    del evaluator  # and its copy of θ
    free_memory()
    out.update(_baseline_costs(b, {f"peer{i}": signs[i] for i in range(n)}, assigned, random_batch, beta,
                               out["score_peers_seconds"]))
    # score_peers = one pass over the random pages before any step (shared), then per peer: its
    # page before, the trial step, random + its page after, the exact restore of θ
    _, out["random_pages_seconds"] = b.timed(evaluate_loss, model, random_batch, hp.optimizer.micro_batch_size)
    per_peer = max(0.0, out["score_peers_seconds"] - out["random_pages_seconds"]) / n
    holdout = b.pages(range(hp.data.holdout_eval_pages))
    _, out["holdout_seconds"] = b.timed(evaluate_loss, model, holdout, hp.optimizer.micro_batch_size)
    out["seconds_per_peer"] = per_peer
    sign_decode = out.get("sign_decode_device_seconds", out["sign_decode_cpu_seconds"])
    out["fixed_seconds"] = out["holdout_seconds"] + out["random_pages_seconds"]
    out["holdout_pages"] = hp.data.holdout_eval_pages
    window = hp.windows.blocks_per_window * hp.windows.block_time
    out["window_seconds"] = window
    out["eval_seconds_per_window"] = out["fixed_seconds"] + hp.gauntlet.uids_per_window * (per_peer + sign_decode)
    out["uids_per_window"] = hp.gauntlet.uids_per_window
    # the same window under the opt-in baseline at production's shape (the other peers' steps, a quarter of
    # each evaluated page's sequences): (1 + P) passes over the random pages and P quarters, at that pass's rate
    peers, page = hp.gauntlet.uids_per_window, d.sequences_per_page
    forwards = (1 + peers) * d.eval_pages * (page + peers * max(1, page // 4))
    rate = out["score_peers_others_quarter_seconds"] / out["others_quarter_sequence_forwards"]
    out["others_quarter_eval_seconds_per_window"] = out["holdout_seconds"] + peers * sign_decode + rate * forwards
    out["peers_per_window"] = max(0, math.floor((window - out["fixed_seconds"]) / (per_peer + sign_decode)))
    out["gather_reads"] = _gather_reads(b, b.peers()[0])
    return out


SERIAL_READS, THREADED_READS, GATHER_THREADS = 4, 16, 16
"""Strict reads timed one after another and in `templar.comms.gather`'s 16 transfer slots (each slot's
read runs in a worker thread)."""


def _gather_reads(b: Bench, peer: dict[str, Any]) -> dict[str, Any]:
    """What a validator's gather costs this host in strict reads (`read_gradient`: container, signed digest,
    every tensor's indices and values checked): one peer's payload read `SERIAL_READS` times one after
    another, then `THREADED_READS` times in `GATHER_THREADS` threads, and F_t and the peer list
    (`fast_eval_uids` + `top_g` reads) at the threaded rate, against `gather_seconds`; with the C kernels
    where this host built them (a GPU image without a compiler runs the numpy reader)."""
    hp = b.hp
    probes = {name: torch.zeros(hp.gauntlet.probe_count) for name in peer}
    payload = write_gradient(peer, probes, window=WINDOW, global_step=0, hotkey="miner", hp=hp, run=b.run,
                             sign=b.key.sign)

    def read(_: int = 0) -> Any:
        return read_gradient(payload, b.shapes, hp, run=b.run, verify=b.key.verify, expected_hotkey="miner",
                             expected_window=WINDOW)

    read()
    _, serial = b.timed(lambda: [read() for _ in range(SERIAL_READS)])
    with ThreadPoolExecutor(GATHER_THREADS) as pool:
        _, threaded = b.timed(lambda: list(pool.map(read, range(THREADED_READS))))
    per_read, per_threaded_read = serial / SERIAL_READS, threaded / THREADED_READS
    gathered = hp.gauntlet.fast_eval_uids + hp.gauntlet.top_g
    return {"kernels": native.available(), "payload_mb": len(payload) / 1e6, "read_seconds": per_read,
            "threads": GATHER_THREADS, "threaded_speedup": per_read / per_threaded_read, "validator_reads": gathered,
            "validator_reads_seconds": gathered * per_threaded_read, "gather_seconds": hp.windows.gather_seconds}


def _baseline_costs(b: Bench, signs: dict[str, dict[str, torch.Tensor]], assigned: dict[str, torch.Tensor],
                    random_batch: torch.Tensor, beta: float, plain_seconds: float) -> dict[str, Any]:
    """The validator time of the proof's per-unit baselines (`gauntlet.proof_baseline`, docs/scoring.md
    §4) beside the plain evaluation's: the groups' common steps and the other peers' own steps, over
    every sequence and over a secret quarter of each evaluated page's (`gauntlet.proof_sequences`,
    the random pages whole), the shape production would run them at. Each pass's sequence-forwards
    are counted too, so the seconds extrapolate to S_t's size: the others' passes grow as its square."""
    hp, model = b.hp, b.model()
    spp = hp.data.sequences_per_page
    quarter = {p: read_sequences(batch, [select_eval_sequences(0, WINDOW, i, page, spp, max(1, spp // 4))
                                         for page in range(batch.size(0) // spp)])
               for i, (p, batch) in enumerate(assigned.items())}
    n_rand, n = random_batch.size(0), len(signs)
    out: dict[str, Any] = {"plain_sequence_forwards": n_rand + 2 * sum(a.size(0) for a in assigned.values()) + n * n_rand}
    for name, rules in (("common", {"baseline_groups": COMMON_GROUPS}), ("others", {"baseline": "others"})):
        evaluator = Evaluator(model, hp.optimizer.micro_batch_size, position_ranges=hp.gauntlet.position_ranges,
                              **rules)
        for shape, pages in (("", assigned), ("_quarter", quarter)):
            read = sum(a.size(0) for a in pages.values())
            units = n_rand + read  # the random pages and every peer's, once
            # before, then each group's step over every unit and each peer's own trial pass; or each
            # peer's step over every unit, which is its own trial pass too
            forwards = ((1 + COMMON_GROUPS) * units + n * n_rand + read if name == "common" else (1 + n) * units)
            _, seconds = b.timed(evaluator.score_peers, signs, pages, random_batch, beta, spp)
            out[f"score_peers_{name}{shape}_seconds"] = seconds
            out[f"{name}{shape}_over_plain"] = seconds / plain_seconds
            out[f"{name}{shape}_sequence_forwards"] = forwards
        del evaluator
        free_memory()
    return out


PHASE_FUNCTIONS: dict[str, Callable[[Bench], dict[str, Any]]] = {
    "setup": phase_setup, "corpus": phase_corpus, "window": phase_window, "memory": phase_memory,
    "validator": phase_validator,
    "consensus": phase_consensus, "noise": phase_noise,
}


def run_phase(b: Bench, name: str) -> None:
    """One phase under its cap and the run's deadline; its outcome, good or bad, goes to the JSON."""
    left = b.deadline - time.monotonic()
    if left < b.scale.minimum.get(name, 0.0):
        record(b, name, {"status": "skipped", "reason": f"{left:.0f} s left of the run's budget"})
        return
    b.phase_deadline = time.monotonic() + b.scale.caps.get(name, left)
    started = time.perf_counter()
    print(f"[gpu] {name} ...", flush=True)
    try:
        entry = {"status": "ok", **PHASE_FUNCTIONS[name](b)}
    except Exception as exc:  # one failing phase (an OOM) must not cost the others
        entry = {"status": "error", "error": f"{type(exc).__name__}: {exc}"[:600],
                 "traceback": traceback.format_exc(limit=6)[-2000:]}
    finally:
        if b._model is not None:
            b._model.zero_grad(set_to_none=True)
        b.restore_theta0()  # the next phase starts from θ_0, whatever this one did to the model
        free_memory()
    entry["seconds"] = time.perf_counter() - started
    if b.device.type == "cuda":
        entry["gpu_memory_peak_gb_so_far"] = torch.cuda.max_memory_allocated(b.device) / 1e9
    record(b, name, entry)


def record(b: Bench, name: str, entry: dict[str, Any]) -> None:
    """A phase's outcome into the result, and the result to disk (a killed run keeps what it measured)."""
    b.result["phases"][name] = entry
    detail = f" in {entry['seconds']:.1f} s" if "seconds" in entry else ""
    reason = entry.get("error") or entry.get("reason")
    print(f"[gpu] {name}: {entry['status']}{detail}" + (f" ({reason})" if reason else ""), flush=True)
    b.result["elapsed_seconds"] = time.monotonic() - b.started
    b.result["host_peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    b.result["table"] = table(b.result)
    write(b)


def write(b: Bench) -> None:
    if b.out.parent == RESULTS_DIR:
        write_result(b.out.name, b.result)
    else:
        import json

        b.out.parent.mkdir(parents=True, exist_ok=True)
        b.out.write_text(json.dumps(_rounded(b.result), indent=1) + "\n")


# -- entry point ----------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny's rules on a micro model and the CPU (the test suite's run)")
    parser.add_argument("--phases", default=",".join(PHASES), help=f"comma-separated, of {','.join(PHASES)}")
    parser.add_argument("--device", default=None, help="torch device (default: cuda if present; cpu with --smoke)")
    parser.add_argument("--budget", type=float, default=None, help="seconds for the whole run")
    parser.add_argument("--cap", action="append", default=[], metavar="PHASE=SECONDS",
                        help="a phase's cap in seconds (repeatable), e.g. noise=345 for the others' baseline's 4 peers")
    parser.add_argument("--hparams", default=None, help="another preset at the mode's scale (default: the mode's)")
    parser.add_argument("--out", type=Path, default=None, help="JSON path (default results/gpu_<device>.json)")
    parser.add_argument("--work", type=Path, default=None, help="prepared corpus (default assets/gpu_<mode>)")
    args = parser.parse_args(argv)
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        os.environ.setdefault(var, "1")
    scale = SMOKE if args.smoke else PRODUCTION
    if args.budget is not None:
        scale = Scale(**{**scale.__dict__, "budget": args.budget})
    if args.cap:
        caps = dict(scale.caps)
        for item in args.cap:
            name, _, seconds = item.partition("=")
            if name not in PHASES or not seconds:
                parser.error(f"--cap takes PHASE=SECONDS with PHASE of {', '.join(PHASES)}, not {item!r}")
            caps[name] = float(seconds)
        scale = Scale(**{**scale.__dict__, "caps": caps})
    if args.hparams is not None:
        scale = Scale(**{**scale.__dict__, "hparams": args.hparams})
    device = torch.device(args.device or ("cpu" if args.smoke or not torch.cuda.is_available() else "cuda"))
    slug = device_slug(device)
    out = args.out or RESULTS_DIR / (f"gpu_smoke_{slug}.json" if args.smoke else f"gpu_{slug}.json")
    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    unknown = set(phases) - set(PHASES)
    if unknown:
        parser.error(f"unknown phases {sorted(unknown)}; choose from {', '.join(PHASES)}")
    with tempfile.TemporaryDirectory(prefix="gpu-bench-") as tmp:
        work = args.work or (Path(tmp) if args.smoke else ROOT / "assets" / f"gpu_sample_{scale.vocab}")
        b = Bench(scale, device, out, work)
        b.result.update(device=str(device), device_name=torch.cuda.get_device_name(device)
                        if device.type == "cuda" else platform.processor() or "cpu",
                        started_unix=time.time(), phases_requested=phases)
        for name in PHASES:
            if name == "setup" or name in phases:
                run_phase(b, name)
    print_table(b.result)
    print(f"  written to {out}")
    failed = [n for n, p in b.result["phases"].items() if p["status"] == "error"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
