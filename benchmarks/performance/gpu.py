"""The production window, memory settings, the validator, evaluation noise and cross-device consensus, on one GPU.

    python -m benchmarks.performance.gpu                   # 1.2B in bf16 on the GPU: writes results/gpu_<device>.json
    python -m benchmarks.performance.gpu --smoke           # the same code on the tiny preset and the CPU (~10 s; tests)
    python -m benchmarks.performance.gpu --phases corpus,window --budget 200

Every GPU figure of the project was an estimate (the sizing table of docs/mining.md assumes 40 %
MFU); this script replaces them with measurements in one short device call. It runs the project's
own functions (`accumulate_gradients`, `DeMo`, `write_gradient`/`read_gradient`, the run's outer rule
(`compress.methods.rule_of`: its compressor, `aggregate`, `trial` and `apply`), `Evaluator`,
`model_fingerprint`/`model_in_sync`) and none of the chain layer: `templar.runtime.consensus.outer`
imports `templar.chain` (bittensor), so the outer step is its two pure halves, the rule's `aggregate`
and `apply` at `core.schedule.learning_rate`;
payloads are signed with a stand-in HMAC (`StandInKey`) instead of sr25519.

Its parts, one idea each: this file (the phases that train and evaluate, and the run), `gpu_bench.py`
(the scales, the run's state `Bench`, the device facts), `gpu_memory.py` (the memory phase),
`gpu_consensus.py` (the consensus phase) and `gpu_report.py` (the noise phase's summaries and the
table); the device call runs this module from the repository root
(`python3 -m benchmarks.performance.gpu`), which imports its siblings as `benchmarks.performance.*`
and `benchmarks._common`.

Phases (`--phases`, comma-separated; `setup` always runs). Each is one function writing its part
of the JSON; an exception (a CUDA OOM too) is recorded as that phase's error and the next phase
still runs; the JSON is rewritten after every phase, so a killed run leaves what it measured.
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
| validator | one peer's sign decode on the CPU and the GPU, `Evaluator.score_peers` with 3 peers on one production page each (signs held on the host, as the validator holds them), the random page and 4 held-out pages alone: seconds per peer, peers per 84 s window | 25 s | 60 s |
| consensus | one gradient compressed on the GPU and the CPU (kept sets of decoder layer 0, embeddings, head and final norm: the CPU side is torch's path), the 15 peers aggregated on both (fixed-point accumulators bit for bit, signs), the window applied to θ on both, `model_in_sync` | 35 s | 90 s |
| noise | 48 AdamW steps away from θ_0 on 2 pages, 4 honest peers train on 3 pages each (the run's inner steps, then one DeMo step each; a production peer trains 29, which the 18-page sample corpus cannot hold for 4 peers), LossScores per page on 4 random pages and their own pages: spread of δ across pages and across peers, and what the proof of computation by size credits each honest peer, range by range of each sequence | 90 s | 150 s |

On an H200 (2026-11-28, `benchmarks/results/gpu_nvidia_h200.json`) the phases took 17, 212 (two
whole 1.2B windows of about 80 s: the window phase runs past its cap), 65, 27–53, 12–28 and 87 s:
about 5.5 minutes with the start-up; `--budget` (480 s) is the whole run's deadline: a phase is
skipped when less than its minimum is left, and `noise` trains fewer peers when its cap is near.
The sample corpus gives 18 production pages (2.4 M tokens), and `noise` uses all of them: 2 to
train away from θ_0, 4 × 3 assigned, 4 random; more peers or pages need a larger corpus.
`measure_window(b, hp, steps)` times the window at any number of inner steps (`--smoke` also runs
H = 2 on tiny).

On the device machine (Python 3.12, torch, transformers, safetensors, numpy; no network, no
bittensor). Here, once: `bash benchmarks/performance/gpu_wheels.sh` puts the wheels it lacks in the git-ignored
`benchmarks/.gpu_wheels/` (23 wheels, 22 MB: pydantic and pydantic-core for cp312, loguru, and
aiobotocore with its closure, which `templar.data` imports through `templar.storage`). The one
device call carries `benchmarks/.gpu_wheels` and `assets/corpus` (10 MB of text, from
`scripts/build_assets.py`):

    python3 -m pip install -q --no-index --find-links benchmarks/.gpu_wheels --target /tmp/gpu_site \
        pydantic loguru aiobotocore && \
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
from pathlib import Path
from typing import Any

import torch

from benchmarks._common import RESULTS_DIR, _rounded, write_result
from benchmarks.performance.gpu_bench import (
    PHASES,
    PRODUCTION,
    ROOT,
    SMOKE,
    WINDOW,
    Bench,
    Scale,
    device_slug,
    free_memory,
    gradient_scale,
    peak_flops,
    peak_lr,
    production_inner_steps,
)
from benchmarks.performance.gpu_consensus import phase_consensus
from benchmarks.performance.gpu_memory import phase_memory
from benchmarks.performance.gpu_report import noise_summary, print_table, proof_credit_summary, table
from templar.compress import Compressed, native
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
from templar.validator.evaluate import Evaluator, page_deltas, range_weights, sequence_deltas
from templar.wire import read_gradient, take_probes, write_gradient

COMMON_GROUPS = 3  # groups of S_t whose mean steps give each unit its own baseline (docs/scoring.md §4)


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
        "hparams": hp.name, "digest": hp.digest(), "parameters": sizing["parameters"],
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
    # A validator decodes each evaluated payload into its trial step with the rule's `trial` (held to the
    # window's median payload norm under a rule that applies magnitudes, `trial_reference`) where the
    # decoded payload is: in host memory today. The same on the device is timed beside it.
    rule = b.rule
    reference = rule.trial_reference(peers[:b.scale.validator_peers])
    signs = [b.timed(lambda: rule.trial(peers[0], b.shapes, reference=reference))]
    out["sign_decode_cpu_seconds"] = signs[0][1]
    signs = [signs[0][0]]
    if b.device.type != "cpu":
        on_device = {n: c.to(b.device) for n, c in peers[0].items()}
        _, out["sign_decode_device_seconds"] = b.timed(lambda d=on_device: rule.trial(d, b.shapes, reference=reference))
        del on_device
    for p in peers[1:b.scale.validator_peers]:  # faster on the device; held on the host like the first
        on_device = {n: c.to(b.device) for n, c in p.items()}
        signs.append({n: t.to("cpu") for n, t in rule.trial(on_device, b.shapes, reference=reference).items()})
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
    common = Evaluator(model, hp.optimizer.micro_batch_size, position_ranges=hp.gauntlet.position_ranges,
                       baseline_groups=COMMON_GROUPS)  # the proof's own per-unit baseline: its validator time
    _, out["score_peers_common_seconds"] = b.timed(common.score_peers, {f"peer{i}": signs[i] for i in range(n)},
                                                   assigned, random_batch, beta, d.sequences_per_page)
    out["common_over_plain"] = out["score_peers_common_seconds"] / out["score_peers_seconds"]
    del common
    free_memory()
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
    out["peers_per_window"] = max(0, math.floor((window - out["fixed_seconds"]) / (per_peer + sign_decode)))
    return out


def _pretrain(b: Bench, pages: Sequence[int], steps: int) -> dict[str, Any]:
    """AdamW micro-batch steps on `pages`, so the noise is measured past θ_0's first drop in loss
    (the run's own windows would need hours to get there)."""
    model, hp = b.model(), b.hp
    batch = b.pages(pages)
    mb = hp.optimizer.micro_batch_size
    lr = gradient_scale(hp)  # the run's own step size for AdamW: the signed rule's α, else the inner rate
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr,
                                  weight_decay=hp.optimizer.weight_decay,
                                  **({"fused": True} if b.device.type == "cuda" else {}))
    losses = []
    for step in range(steps):
        start = (step * mb) % batch.size(0)
        stats = accumulate_gradients(model, batch[start:start + mb], mb, hp.optimizer.grad_clip)
        optimizer.step()
        losses.append(stats.loss)
    model.zero_grad(set_to_none=True)
    del optimizer
    free_memory()
    return {"pages": list(pages), "steps": steps, "lr": lr, "first_loss": losses[0],
            "last_loss": losses[-1]}


def phase_noise(b: Bench) -> dict[str, Any]:
    """How much δ_rand and δ_assigned move from page to page and from peer to peer, for honest updates:
    the evaluation noise the relative LossRating's tie band (σ̂) and the simulator's `noise` stand for."""
    hp, model = b.hp, b.model()
    d = hp.data
    n_pages = b.corpus().num_pages
    s = b.scale
    # a production window's pages for each peer, or as many as the sample corpus holds for NOISE_PEERS
    per_peer = min(d.pages_per_window, s.noise_pages_per_peer)
    peers = min(s.noise_peers, max(2, (n_pages - s.noise_pretrain_pages - 2) // per_peer))
    random_n = min(s.noise_random_pages, n_pages - s.noise_pretrain_pages - peers * per_peer)
    if random_n < 2:
        raise RuntimeError(f"{n_pages} pages cannot hold {s.noise_pretrain_pages} + {peers}×{per_peer} + 2")
    pretrain = list(range(s.noise_pretrain_pages))
    assigned = {f"peer{i}": list(range(len(pretrain) + i * per_peer, len(pretrain) + (i + 1) * per_peer))
                for i in range(peers)}
    random_pages = list(range(len(pretrain) + peers * per_peer, len(pretrain) + peers * per_peer + random_n))
    out: dict[str, Any] = {
        "corpus_pages": n_pages, "random_pages": random_pages, "assigned": assigned,
        "allows": f"{n_pages} pages of {d.sequence_length * d.sequences_per_page:,} tokens: {len(pretrain)} to train "
                  f"away from θ_0, {len(assigned)} peers × {per_peer} assigned, {random_n} random; more peers or "
                  "random pages need a larger corpus"}
    out["pretrain"], out["pretrain_seconds"] = b.timed(lambda: _pretrain(b, pretrain, s.noise_pretrain_steps))
    lr = peak_lr(hp)
    beta = hp.gauntlet.eval_lr_factor * lr
    out.update(lr=lr, beta=beta)

    # honest updates: each peer trains on its own pages, one compression step from fresh error
    # feedback, decoded to its trial step as a validator decodes a payload
    signs: dict[str, dict[str, torch.Tensor]] = {}
    payloads: dict[str, dict[str, Compressed]] = {}
    started = time.monotonic()
    for peer, pages in assigned.items():
        if len(payloads) >= s.noise_min_peers:  # another only if it and the evaluation of all fit the cap
            train = (time.monotonic() - started) / len(payloads)
            page_forward = train / (3 * per_peer)  # forward+backward ≈ 3 forwards
            peers_then = len(payloads) + 1  # the plain evaluation, then the groups' and the others' passes over every unit
            evaluation = page_forward * (random_n + peers_then * (2 * per_peer + random_n)
                                         + (COMMON_GROUPS + peers_then) * (random_n + peers_then * per_peer))
            if b.left() < train + evaluation:
                break
        # the run's own window: its inner steps (fresh moments, as a newly joined miner), then DeMo
        stats = inner_steps(model, b.pages(pages), hp.optimizer.micro_batch_size, hp.optimizer.grad_clip,
                            inner=hp.inner, optimizer=make_inner_optimizer(model, hp.inner),
                            lr=inner_lr(hp.inner, hp.optimizer.warmup_steps, hp.optimizer))
        compressed = b.demo().step(gradients(model), stats.scale)
        model.zero_grad(set_to_none=True)
        payloads[peer] = dict(compressed)
    reference = b.rule.trial_reference(list(payloads.values()))
    for peer, payload in payloads.items():  # each peer's trial step, as a validator holds it among the window's:
        # signs as int8 where they are (the signed rule), a dense float32 step in host memory otherwise
        trial = b.rule.trial(payload, b.shapes, reference=reference)
        signs[peer] = {n: t.to(torch.int8) if b.rule.moves_every_coordinate else t.to("cpu") for n, t in trial.items()}
    del payloads
    out["train_seconds"] = time.monotonic() - started
    b.release_demo()

    evaluator = Evaluator(model, hp.optimizer.micro_batch_size, position_ranges=hp.gauntlet.position_ranges)
    evaluator.snapshot()
    spp = d.sequences_per_page
    random_batch = b.pages(random_pages)
    started = time.monotonic()
    before_rand = evaluator.losses(random_batch)
    ranges = hp.gauntlet.position_ranges  # the units the proof by size clips, as the validator measures them
    weights = range_weights(d.sequence_length - 1, ranges)
    before = {peer: evaluator.losses(b.pages(assigned[peer]), ranges) for peer in signs}
    rows = {}
    for peer, peer_signs in signs.items():
        with evaluator.stepped(peer_signs, beta):
            after_rand = evaluator.losses(random_batch)
            after = evaluator.losses(b.pages(assigned[peer]), ranges)
        rows[peer] = {"delta_rand_pages": list(page_deltas(before_rand, after_rand, spp)),
                      "delta_assigned_pages": list(page_deltas(before[peer] @ weights, after @ weights, spp)),
                      "delta_assigned_sequences": list(sequence_deltas(before[peer], after))}
    del evaluator
    out["eval_seconds"] = time.monotonic() - started
    out["loss_rand_before"] = float(before_rand.mean())
    out["peers"] = rows
    out.update(noise_summary(rows))
    out["proof_credit"] = proof_credit_summary(rows, hp.gauntlet.proof_full_gap)
    # the same honest peers judged against each unit's own baseline (`gauntlet.proof_baseline`, docs/scoring.md §4):
    # "common", the groups' mean steps (a pass over every unit each); "others", each peer's step over every unit
    for name, rules in (("common", {"baseline_groups": COMMON_GROUPS}), ("others", {"baseline": "others"})):
        if len(signs) < (need := 2 if name == "common" else 1 + hp.gauntlet.proof_baseline_min_others):
            out[f"proof_credit_{name}"] = {"skipped": f"{len(signs)} peers trained within the cap; it needs {need}"}
            continue
        started = time.monotonic()
        scored = Evaluator(model, hp.optimizer.micro_batch_size, position_ranges=ranges, **rules).score_peers(
            signs, {peer: b.pages(assigned[peer]) for peer in signs}, random_batch, beta, spp)
        out[f"{name}_eval_seconds"] = time.monotonic() - started
        baselined = {peer: {"delta_rand_pages": rows[peer]["delta_rand_pages"],
                            "delta_assigned_pages": list(score.page_deltas),
                            "delta_assigned_sequences": list(score.sequence_deltas)} for peer, score in scored.items()}
        out[f"proof_credit_{name}"] = proof_credit_summary(baselined, hp.gauntlet.proof_full_gap)
        quarter = max(1, spp // 4)  # a secret quarter of the sequences (proof_sequences): a subset of these units
        for i, (peer, row) in enumerate(baselined.items()):
            units = row["delta_assigned_sequences"]
            per_sequence = len(units) // (len(assigned[peer]) * spp)
            row["delta_assigned_sequences"] = [
                units[(page * spp + seq) * per_sequence + r] for page in range(len(assigned[peer]))
                for seq in select_eval_sequences(0, 0, i, page, spp, quarter) for r in range(per_sequence)]
        out[f"proof_credit_{name}_quarter"] = proof_credit_summary(baselined, hp.gauntlet.proof_full_gap)
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
    parser.add_argument("--smoke", action="store_true", help="tiny preset on the CPU (the test suite's run)")
    parser.add_argument("--phases", default=",".join(PHASES), help=f"comma-separated, of {','.join(PHASES)}")
    parser.add_argument("--device", default=None, help="torch device (default: cuda if present; cpu with --smoke)")
    parser.add_argument("--budget", type=float, default=None, help="seconds for the whole run")
    parser.add_argument("--hparams", default=None, help="another preset at the mode's scale (default: the mode's)")
    parser.add_argument("--out", type=Path, default=None, help="JSON path (default results/gpu_<device>.json)")
    parser.add_argument("--work", type=Path, default=None, help="prepared corpus (default assets/gpu_<mode>)")
    args = parser.parse_args(argv)
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        os.environ.setdefault(var, "1")
    scale = SMOKE if args.smoke else PRODUCTION
    if args.budget is not None:
        scale = Scale(**{**scale.__dict__, "budget": args.budget})
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
