"""What a validator's size of a payload costs (`templar.validator.fast_eval.payload_norm`: each tensor's
norm in float32, summed in float64), against the float64 copy of every value it replaced (the
baseline, interleaved in the same process), and what the lead's ceiling on its step
(`step_ceiling`) costs over F_t's uploads at that price.

    python -m benchmarks.performance.payload_size [--reps 10] [--drawn 64] [--out FILE]

Why it matters: the lead reads the size of every upload it drew (F_t: 64 in production) before it
publishes the window's inputs, which every node waits for, and the scale check reads the same sizes.
Cases: `micro` (the suite's model) and `production` (`hparams.json`'s 1.2B shapes, one payload of
2-bit grid values in its layout, as `benchmarks.performance.aggregate` builds it). Both sides must
agree to 1e-6 relative (exit 1 otherwise). Two torch threads, CPU; prints one JSON line per case and
writes benchmarks/results/payload_size.json.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch

from benchmarks._common import emit, setup_torch, timed, write_result
from benchmarks.performance.aggregate import PRESETS, payloads_of
from benchmarks.performance.compress import paired_ms
from templar.core.config import load_hparams
from templar.validator.fast_eval import payload_norm, step_ceiling
from templar.wire import Gradient


def float64_norm(g: Gradient) -> float:
    """The baseline: every value copied to float64, squared and summed."""
    return float(torch.sqrt(sum(c.values.double().square().sum() for c in g.tensors.values())))


def measure(case: str, reps: int, drawn: int) -> dict:
    hp = load_hparams(PRESETS[case])
    payloads, _ = payloads_of(hp, 1, grid_only=True)
    payload = Gradient(window=1, global_step=0, hotkey="h0", warmup=False, tensors=payloads[0], probes={},
                       digest=b"", nbytes=0)
    ours_ms, baseline_ms = paired_ms(lambda: payload_norm(payload), lambda: float64_norm(payload), reps)
    ours, baseline = payload_norm(payload), float64_norm(payload)
    uploads = [Gradient(window=1, global_step=0, hotkey=f"h{i}", warmup=False, tensors=payload.tensors, probes={},
                        digest=b"", nbytes=0) for i in range(drawn)]
    _, ceiling_s = timed(lambda: step_ceiling(uploads, {g.hotkey: 1.0 / drawn for g in uploads}))
    return {"case": case, "preset": hp.name, "values_per_payload": sum(c.values.numel() for c in payload.tensors.values()),
            "norm_ms": ours_ms, "norm_float64_copy_ms": baseline_ms, "ratio": ours_ms / baseline_ms,
            "relative_difference": abs(ours - baseline) / baseline, "drawn": drawn,
            "step_ceiling_ms": 1000 * ceiling_s, "step_ceiling_float64_estimate_ms": drawn * baseline_ms}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=10, help="interleaved timed runs of each side")
    parser.add_argument("--drawn", type=int, default=64, help="uploads the lead sizes (F_t: fast_eval_uids)")
    parser.add_argument("--cases", default="micro,production", help="comma-separated: micro, production")
    parser.add_argument("--out", default=None, help="where to write the JSON (default benchmarks/results/payload_size.json)")
    args = parser.parse_args(argv)
    setup_torch()
    results = {}
    for case in args.cases.split(","):
        results[case] = measure(case, args.reps, args.drawn)
        emit(results[case])
    out = Path(args.out) if args.out else None
    write_result(out.name if out else "payload_size.json", results, *([out.parent] if out else []))
    return 0 if all(math.isfinite(r["ratio"]) and r["relative_difference"] < 1e-6 for r in results.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
