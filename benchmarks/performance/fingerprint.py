"""What the model fingerprint (`templar.runtime.consensus.fingerprint`) costs at the production 1.2B
preset, against the exact sha256 of θ it replaces.

    python -m benchmarks.performance.fingerprint

The parameters are allocated with the 1.2B model's shapes but never initialised (building the
real model on CPU takes minutes): the fingerprint reads 256 values, so only the pages it touches
are ever faulted in. The baseline hashes 256 MiB of float32 and scales to the model's 4.8 GB
(the copy to bytes included, as a node hashing its θ would need). One thread, CPU; prints one
JSON line and writes benchmarks/results/fingerprint.json.
"""

from __future__ import annotations

import hashlib
import json
import statistics
import time
from pathlib import Path

import torch

from templar.core.config import load_hparams
from templar.core.model import build_model
from templar.runtime.consensus.fingerprint import model_fingerprint

RESULTS = Path(__file__).resolve().parents[1] / "results" / "fingerprint.json"


def main() -> None:
    torch.set_num_threads(1)
    hp = load_hparams(None)
    model = torch.nn.Module()
    model.params = torch.nn.ParameterDict({
        name.replace(".", "_"): torch.nn.Parameter(torch.empty(p.shape))
        for name, p in build_model(hp, "meta").named_parameters()})
    total = sum(p.numel() for p in model.parameters())
    times = []
    for window in range(9):
        started = time.perf_counter()
        model_fingerprint(model, hp.data.data_seed, window, hp.sync.fingerprint_positions)
        times.append(time.perf_counter() - started)
    block = torch.zeros(64 << 20)
    started = time.perf_counter()
    hashlib.sha256(block.numpy().tobytes()).hexdigest()
    sha = (time.perf_counter() - started) * total / block.numel()
    result = {"case": "fingerprint", "preset": hp.name, "parameters": total, "tensors": len(model.params),
              "positions": hp.sync.fingerprint_positions, "fingerprint_ms_median": round(statistics.median(times) * 1e3, 2),
              "fingerprint_ms_max": round(max(times) * 1e3, 2), "sha256_theta_s": round(sha, 2),
              "wire_bytes": 4 * hp.sync.fingerprint_positions}
    print(json.dumps(result))
    RESULTS.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
