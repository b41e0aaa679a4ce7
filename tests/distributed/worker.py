"""What each rank runs in tests/distributed (under torchrun, 1 or 2 ranks, gloo on CPU).

`equality OUT` (`tiny-signed`'s rules: DeMo's DCT and the signed step): rank 0 also builds the 1-process
reference (plain model, `accumulate_gradients`, `DeMo`, `outer_step`, `save_node_state`) and checks
the sharded node against it: gradients within float tolerance, the compressed update and the wire
payload identical for the same gradient, the outer step and probes bit-identical, and the state file
round trip. Rank 0 writes OUT/equality/result.json. The other ranks take their part in the
collectives only (when every rank also built the reference, rank 1 of the 2-rank launch spent 14 s
of CPU; now 8.5 s).

It also runs a miner node with each memory setting (`memory`): the default's payloads, θ and state
file, bit for bit, with the followers taking rank 0's settings.

`sparse OUT` (OUT/sparse/result.json): the same checks for production's outer rule, SparseLoCo
(`tiny-sparseloco`'s rules): the sharded SparseLoCo compressor's update and payload equal the 1-process one's
for the same gradient, and the outer step (each peer clipped by its whole payload's norm) is
bit-identical. `sparse,equality OUT` runs both in one launch (`checks`).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from datetime import timedelta
from pathlib import Path

from templar.core.startup import libraries_loading

with libraries_loading():  # as the neurons load theirs (src/templar/core/startup.py)
    import torch
    import torch.distributed as dist
    from safetensors.torch import load_file, save_file
    from torch.distributed.tensor import DTensor

    from templar.comms import CheckpointError
    from templar.compress import DCTCompressor, DeMo, aggregate
    from templar.compress.sparseloco import payload_norm_squared
    from templar.core.config import HParams, load_hparams
    from templar.core.memory import MemorySettings
    from templar.core.model import build_model
    from templar.core.schedule import learning_rate
    from templar.distributed import (
        DistError,
        ShardedDeMo,
        accumulate_sharded,
        collect_probes_sharded,
        init_group,
        load_sharded_state,
        outer_step_sharded,
        save_sharded_state,
        shard_model,
    )
    from templar.distributed.checkpoint import full_model_state
    from templar.distributed.compute import NodeCompute, update_dtype
    from templar.distributed.evaluate import ShardedEvaluator
    from templar.distributed.fsdp import check_layout, local
    from templar.distributed.group import Group
    from templar.runtime.consensus.fingerprint import model_fingerprint
    from templar.runtime.consensus.outer import apply_update, collect_probes, outer_step
    from templar.runtime.offload import StreamedOptimizer
    from templar.runtime.state import NodeState, load_node_state, save_node_state
    from templar.runtime.train import accumulate_gradients, evaluate_loss, gradients
    from templar.validator.evaluate import Evaluator
    from templar.wire import Gradient, Run, write_gradient

RUN = Run(netuid=0, digest="0" * 64)  # the run these payloads are signed for
PRESETS = Path(__file__).resolve().parents[1] / "presets"
SIGNED, SPARSELOCO = PRESETS / "micro-signed-1k.json", PRESETS / "micro-sparseloco-1k.json"
"""`tiny-signed`'s and `tiny-sparseloco`'s rules on the micro model (tests/presets/micro.json's layers) and the
1024-token corpus: what the ranks compute is shared out the same way (every parameter sharded, every
collective run) as on tiny's 4 wider layers: the two tests took 19 CPU-s, 32 on those (2026-12-02)."""


def pages(hp, window: int, n: int | None = None) -> torch.Tensor:
    """The node's batch of a window: deterministic token ids (the content does not matter here)."""
    gen = torch.Generator().manual_seed(1000 + window)
    n = n or hp.data.pages_per_window * hp.data.sequences_per_page
    return torch.randint(0, hp.model.vocab_size, (n, hp.data.sequence_length), generator=gen)


def nosign(message: bytes) -> bytes:
    return b"\x00" * 64


def same_payload(a: bytes, b: bytes) -> bool:
    """Same tensors and metadata (safetensors orders the header's metadata map arbitrarily, so
    two writes of one payload may differ in header bytes; the signed digest does not)."""
    from safetensors.torch import load

    ta, tb = load(a), load(b)
    if set(ta) != set(tb) or not all(torch.equal(ta[k].view(torch.uint8), tb[k].view(torch.uint8)) for k in ta):
        return False
    metas = []
    for blob in (a, b):
        n = int.from_bytes(blob[:8], "little")
        metas.append(json.loads(blob[8:8 + n]).get("__metadata__"))
    return metas[0] == metas[1]


def full_grads(model, group) -> dict[str, torch.Tensor]:
    out = {}
    for name, p in model.named_parameters():
        full = group.gather_rows(local(p.grad), p.shape[0], dst=0)
        if full is not None:
            out[name] = full.view(p.shape)
    return out


def twin_update(ref, compressor, hp, error_feedback: dict, grads: dict, lr: float) -> dict:
    """The 1-process DeMo's update from the sharded node's error feedback and gradient."""
    twin = DeMo(ref, compressor=compressor, decay=hp.demo.momentum_decay)
    twin.load_state_dict(error_feedback)
    return twin.step(grads, lr)


def same_update(a: dict, b: dict) -> bool:
    """The same kept positions and values in every tensor."""
    return all(torch.equal(a[k].indices, b[k].indices) and torch.equal(a[k].values, b[k].values) for k in a)


def equality(out_dir: Path, group: Group) -> None:
    import templar.distributed.outer as sharded_outer

    sharded_outer.BUCKET_COEFFICIENTS = 20_000  # many small broadcasts here; `windows` runs the default
    hp = load_hparams(SIGNED)
    leader = group.is_leader
    # the 1-process reference is rank 0's alone: the other ranks only take their part in the collectives
    ref = build_model(hp) if leader else None
    model = shard_model(build_model(hp), group)
    check_layout(model, group)
    comp = DCTCompressor(hp.demo.target_chunk, hp.demo.topk)
    ref_demo = DeMo(ref, compressor=comp, decay=hp.demo.momentum_decay) if leader else None
    demo = ShardedDeMo(model, group, compressor=DCTCompressor(hp.demo.target_chunk, hp.demo.topk),
                       decay=hp.demo.momentum_decay)
    report: dict[str, object] = {"world_size": group.world_size, "windows": []}
    state, ref_state = NodeState(window=-1, global_step=0), NodeState(window=-1, global_step=0)
    # 9 sequences with micro-batch 4: uneven shares (5 / 4) and a short last micro-batch
    for window, n in ((0, None), (1, 9), (2, None)):
        batch = pages(hp, window, n)
        stats = accumulate_sharded(model, batch, 4, group, hp.optimizer.grad_clip)
        got = full_grads(model, group)
        if window == 0:  # activation checkpointing (node-local memory option) changes no gradient
            ck = shard_model(build_model(hp), group, checkpoint_activations=True)
            accumulate_sharded(ck, batch, 4, group, hp.optimizer.grad_clip)
            ck_got = full_grads(ck, group)
            if leader:
                report["checkpointed_grads_equal"] = all(torch.equal(ck_got[k], got[k]) for k in got)
            del ck
        lr = learning_rate(state.global_step, hp.optimizer)
        # the compressed update from the sharded state == the 1-process DeMo fed the same gradient and state
        ef_before = demo.gather_state()
        sent = demo.step(model, lr)
        model.zero_grad(set_to_none=True)
        probes = collect_probes_sharded(model, window, hp, group)
        if leader:
            ref_stats = accumulate_gradients(ref, batch, 4, hp.optimizer.grad_clip)
            want = gradients(ref)
            row: dict[str, object] = {"window": window, "loss": stats.loss, "ref_loss": ref_stats.loss}
            row["grad_max_abs_diff"] = max(float((got[k] - want[k]).abs().max()) for k in want)
            row["grad_max_rel"] = max(float((got[k] - want[k]).norm() / (want[k].norm() + 1e-30)) for k in want)
            twin_sent = twin_update(ref, comp, hp, ef_before, got, lr)
            row["same_coefficients_same_grad"] = same_update(sent, twin_sent)
            ref_sent = ref_demo.step(want, lr)
            ref.zero_grad(set_to_none=True)
            agree = [float((sent[k].indices == ref_sent[k].indices).float().mean()) for k in sent]
            row["indices_agree_vs_1process_training"] = min(agree)
            ref_probes = collect_probes(ref, window, hp)
            row["probes_equal"] = all(torch.equal(probes[k], ref_probes[k]) for k in probes)
            payload = write_gradient(sent, probes, window=window, global_step=state.global_step, hotkey="h", hp=hp, run=RUN,
                                     sign=nosign)
            twin_payload = write_gradient(twin_sent, ref_probes, window=window, global_step=state.global_step,
                                          hotkey="h", hp=hp, run=RUN, sign=nosign)
            row["payload_identical_same_grad"] = same_payload(payload, twin_payload)
            # outer step: three peers (ours and two others), the same on both
            peers = [Gradient(window=window, global_step=state.global_step, hotkey=str(i), warmup=False,
                              tensors=t, probes={}, digest=b"", nbytes=0)
                     for i, t in enumerate((ref_sent, sent, ref_sent))]
        step = outer_step_sharded(model, peers if leader else None, state, hp, group)
        theta = full_model_state(model, group)
        if leader:
            ref_step = outer_step(ref, peers, ref_state, hp)
            sd = ref.state_dict()
            row["theta_bit_identical"] = all(torch.equal(theta[k], sd[k]) for k in sd)
            row["global_step"] = [state.global_step, ref_state.global_step]
            row["peers"] = [step.peers, ref_step.peers]
            report["windows"].append(row)
    # validator: LossScores over all ranks == the 1-process Evaluator; θ restored bit for bit
    assigned = {"a": pages(hp, 10, 6), "b": pages(hp, 11, 5)}
    random_batch = pages(hp, 12, 7)
    if leader:
        shapes = {n: p.shape for n, p in ref.named_parameters()}
        signs = {"a": aggregate([sent], [1.0], shapes), "b": aggregate([ref_sent], [1.0], shapes)}
    got = ShardedEvaluator(model, 4, group, position_ranges=4).score_peers(signs if leader else {"a": {}, "b": {}},
                                                        assigned, random_batch, 0.05, 3)
    after = full_model_state(model, group)
    if leader:
        want = Evaluator(ref, 4, position_ranges=4).score_peers(signs, assigned, random_batch, 0.05, 3)
        report["loss_score_max_diff"] = max(abs(getattr(got[p], f) - getattr(want[p], f)) for p in want
                                            for f in ("delta_assigned", "delta_rand", "loss_rand_after"))
        # page-by-page credit (docs/scoring.md §4): 2 pages of 3 sequences for "a"
        report["page_deltas_max_diff"] = max(
            (abs(x - y) for p in want for x, y in zip(got[p].page_deltas, want[p].page_deltas, strict=True)),
            default=float("inf"))
        report["loss_score_delta"] = want["a"].delta_assigned
        sd = ref.state_dict()
        report["theta_restored_after_eval"] = all(torch.equal(after[k], sd[k]) for k in sd)
    # state: the sharded node's file loads into a 1-process node and back into a fresh sharded node
    path = out_dir / "state.safetensors"
    state.window = 2
    save_sharded_state(path, model, demo, state, group)
    fresh = shard_model(build_model(hp), group)
    fresh_demo = ShardedDeMo(fresh, group, compressor=comp, decay=hp.demo.momentum_decay)
    loaded = load_sharded_state(path, fresh, fresh_demo, group)
    a, b = full_model_state(model, group), full_model_state(fresh, group)
    ea, eb = demo.gather_state(), fresh_demo.gather_state()
    if leader:
        report["reload_equal"] = all(torch.equal(a[k], b[k]) for k in a) and all(torch.equal(ea[k], eb[k]) for k in ea)
        report["reload_state"] = [loaded.window, loaded.global_step]
        one = build_model(hp)
        _, ef = load_node_state(path, one)
        report["one_process_loads"] = all(torch.equal(one.state_dict()[k], a[k]) for k in a) and \
            all(torch.equal(ef[k], ea[k]) for k in ea)
        # a 1-process node's file loads into the sharded node too (any rank count, one format)
        save_node_state(out_dir / "one.safetensors", ref, ref_demo.state_dict(), ref_state)
    load_sharded_state(out_dir / "one.safetensors", fresh, fresh_demo, group)
    b, eb = full_model_state(fresh, group), fresh_demo.gather_state()
    if leader:
        sd, rd = ref.state_dict(), ref_demo.state_dict()
        report["loads_one_process_file"] = all(torch.equal(b[k], sd[k]) for k in sd) and \
            all(torch.equal(eb[k], rd[k]) for k in rd)
        report["comm_seconds"] = group.comm_seconds
    driver(out_dir, hp, group, ref, ref_sent if leader else None, report)
    memory(out_dir, hp, group, report)
    if group.world_size > 1:  # a hung rank: the others get DistError within the collective timeout
        # (1 s: the test allows 5; the hung rank's sleep and the wait for it are real time the cores sit idle)
        short = dataclasses.replace(group, pg=dist.new_group(list(range(group.world_size)),
                                                             timeout=timedelta(seconds=1)))
        if leader:
            started = time.monotonic()
            try:
                short.barrier()
                report["hang"] = None
            except DistError as exc:
                report["hang"] = {"seconds": time.monotonic() - started, "error": str(exc)[:300]}
        else:
            time.sleep(2)
        group.barrier()
    if leader:
        (out_dir / "result.json").write_text(json.dumps(report, indent=1))


def driver(out_dir: Path, hp: HParams, group: Group, ref: torch.nn.Module | None, ref_sent: dict | None,
           report: dict) -> None:
    """The validator's and catch-up's ops through `NodeCompute` as the neurons run it: rank 0
    calls, the other ranks `follow()`. Results against the 1-process functions on `ref` (rank 0's)."""
    if not group.is_leader:
        NodeCompute.join(group).follow()
        return
    compute = NodeCompute.lead(build_model(hp), hp, group, role="validator")
    plain = out_dir / "ref_model.safetensors"
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, str(plain))
    compute.load_model_file(plain)                         # a published checkpoint, loaded sharded
    bad = out_dir / "bad.safetensors"
    save_file({"nope": torch.zeros(3)}, str(bad))
    try:
        compute.load_model_file(bad)
        report["bad_checkpoint_refused"] = False
    except CheckpointError:
        report["bad_checkpoint_refused"] = True
    shapes = {n: p.shape for n, p in ref.named_parameters()}
    signs = aggregate([ref_sent], [1.0], shapes)
    compute.apply_update(signs, 7)   # catch-up: the lead's aggregate, through the one rule on each rank's rows
    apply_update(ref, signs, 7, hp)
    batch = pages(hp, 20, 6)
    report["driver_eval_diff"] = abs(compute.evaluate_loss(batch) - evaluate_loss(ref, batch, 4))
    # the validator's primary evaluation as the loop calls it (page-by-page δs included)
    peer_signs, assigned = {"a": signs}, {"a": pages(hp, 21, 6)}
    got = compute.evaluator.score_peers(peer_signs, assigned, pages(hp, 22, 6), 0.05, 3)
    want = Evaluator(ref, 4, position_ranges=4).score_peers(peer_signs, assigned, pages(hp, 22, 6), 0.05, 3)
    report["driver_score_diff"] = max(
        [abs(got["a"].delta_assigned - want["a"].delta_assigned), abs(got["a"].delta_rand - want["a"].delta_rand),
         *(abs(x - y) for x, y in zip(got["a"].page_deltas, want["a"].page_deltas, strict=True))])
    report["driver_page_deltas"] = len(got["a"].page_deltas)
    peers = [Gradient(window=5, global_step=3, hotkey=str(i), warmup=False, tensors=ref_sent, probes={},
                      digest=b"", nbytes=0) for i in range(2)]
    state, ref_state = NodeState(window=4, global_step=3), NodeState(window=4, global_step=3)
    step = compute.outer_step(peers, state, keep_signs=True)
    ref_step = outer_step(ref, peers, ref_state, hp)
    report["driver_signs_equal"] = all(torch.equal(step.signs[k], ref_step.signs[k]) for k in ref_step.signs)
    published = out_dir / "published.safetensors"
    compute.write_model_file(published)                    # what the lead uploads: one plain file
    got, want = load_file(str(published)), ref.state_dict()
    report["driver_theta_bit_identical"] = set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want)
    report["driver_global_step"] = [state.global_step, ref_state.global_step]
    # the sync check's fingerprint, read from the ranks' rows (a few windows: positions move)
    report["driver_fingerprint_equal"] = all(
        torch.equal(compute.fingerprint(w), model_fingerprint(ref, hp.data.data_seed, w, hp.sync.fingerprint_positions))
        for w in (5, 6, 7))
    compute.reset_model()                                  # a re-sync with no checkpoint yet: θ_0
    compute.write_model_file(published)
    got, want = load_file(str(published)), build_model(hp).state_dict()
    report["driver_reset_to_theta0"] = all(torch.equal(got[k], want[k]) for k in want)
    compute.stop()


MEMORY = (MemorySettings(), MemorySettings(offload=True, checkpoint_activations=True))


def memory(out_dir: Path, hp: HParams, group: Group, report: dict) -> None:
    """A miner node over the ranks with each memory setting (rank 0 leads, the others follow and
    take its settings): three windows of inner AdamW steps, the payload and θ after each, and the
    state file. Rank 0 reports whether every setting matched the default bit for bit; each
    follower reports what it ran with."""
    if not group.is_leader:
        for i, _ in enumerate(MEMORY):
            compute = NodeCompute.join(group)
            compute.follow()
            (out_dir / f"memory_rank{group.rank}_{i}.json").write_text(json.dumps({
                "offload": compute.memory.offload, "streamed_moments": isinstance(compute.inner_optimizer,
                                                                                 StreamedOptimizer),
                "host_snapshot": compute.snapshot is not None and len(compute.snapshot.buffers) > 0,
                "host_moments": all(s["exp_avg"].device.type == "cpu" and not isinstance(s["exp_avg"], DTensor)
                                    for s in compute.inner_optimizer.state.values()),
                "checkpointing": compute.model.is_activation_checkpointing}))
            del compute
        return
    runs = []
    for setting in MEMORY:
        compute = NodeCompute.lead(build_model(hp), hp, group, role="miner", memory=setting)
        payloads, thetas = [], []
        for window in range(3):
            stats = compute.train(pages(hp, 30 + window), hp.optimizer.micro_batch_size, hp.optimizer.grad_clip, 1e-3)
            sent = compute.compress(stats.scale)
            payloads.append(write_gradient(sent, compute.probes(window), window=window, global_step=window,
                                           hotkey="h", hp=hp, run=RUN, sign=nosign))
            compute.apply_update(aggregate([sent], [1.0], {n: c.shape for n, c in sent.items()}), window)
            compute.write_model_file(out_dir / "memory_theta.safetensors")
            thetas.append(load_file(str(out_dir / "memory_theta.safetensors")))
        compute.save_state(out_dir / f"memory_{setting.name}.safetensors", NodeState(window=2, global_step=3))
        compute.stop()
        runs.append((payloads, thetas, load_file(str(out_dir / f"memory_{setting.name}.safetensors"))))
    (pa, ta, sa), (pb, tb, sb) = runs
    report["memory_payloads_identical"] = all(same_payload(x, y) for x, y in zip(pa, pb, strict=True))
    report["memory_theta_identical"] = all(all(torch.equal(x[k], y[k]) for k in x) for x, y in zip(ta, tb, strict=True))
    report["memory_state_identical"] = set(sa) == set(sb) and all(torch.equal(sa[k], sb[k]) for k in sa) and \
        any(k.startswith("inner.") for k in sa)
    report["memory_theta_moved"] = not all(torch.equal(ta[0][k], ta[2][k]) for k in ta[0])


def sparse(out_dir: Path, group: Group) -> None:
    from templar.compress.methods import rule_of

    hp = load_hparams(SPARSELOCO)
    rule = rule_of(hp.optimizer.method)
    leader = group.is_leader
    # the 1-process reference is rank 0's alone: the other ranks only take their part in the collectives
    ref = build_model(hp) if leader else None
    model = shard_model(build_model(hp), group)
    comp = rule.compressor(hp.demo.target_chunk, hp.demo.topk)
    demo = ShardedDeMo(model, group, compressor=rule.compressor(hp.demo.target_chunk, hp.demo.topk),
                       decay=hp.demo.momentum_decay)
    ref_demo = DeMo(ref, compressor=comp, decay=hp.demo.momentum_decay) if leader else None
    state, ref_state = NodeState(window=-1, global_step=0), NodeState(window=-1, global_step=0)
    report: dict[str, object] = {"world_size": group.world_size, "windows": []}
    for window in (0, 1, 2):
        batch = pages(hp, window)
        accumulate_sharded(model, batch, 4, group, hp.optimizer.grad_clip)
        got = full_grads(model, group)
        lr = learning_rate(state.global_step, hp.optimizer)
        ef_before = demo.gather_state()
        sent = demo.step(model, lr)
        model.zero_grad(set_to_none=True)
        probes = collect_probes_sharded(model, window, hp, group)
        if leader:
            accumulate_gradients(ref, batch, 4, hp.optimizer.grad_clip)
            ref_sent = ref_demo.step(gradients(ref), lr)
            ref.zero_grad(set_to_none=True)
            row: dict[str, object] = {"window": window}
            twin_sent = twin_update(ref, comp, hp, ef_before, got, lr)
            row["same_coefficients_same_grad"] = same_update(sent, twin_sent)
            payload = write_gradient(sent, probes, window=window, global_step=state.global_step, hotkey="h", hp=hp,
                                     run=RUN, sign=nosign)
            twin_payload = write_gradient(twin_sent, collect_probes(ref, window, hp), window=window,
                                          global_step=state.global_step, hotkey="h", hp=hp, run=RUN, sign=nosign)
            row["payload_identical_same_grad"] = same_payload(payload, twin_payload)
            # three peers of different norms (the clip to the median acts on the largest), the same on both
            scaled = {k: dataclasses.replace(c, values=c.values * 2) for k, c in ref_sent.items()}
            peers = [Gradient(window=window, global_step=state.global_step, hotkey=str(i), warmup=False,
                              tensors=t, probes={}, digest=b"", nbytes=0)
                     for i, t in enumerate((ref_sent, sent, scaled))]
            # the last window under a lead's ceiling below the median (rank 0 computes every peer's factor)
            row["clip_norm"] = 0.5 * float(payload_norm_squared(ref_sent, sorted(ref_sent))) ** 0.5 if window == 2 else None
        ceiling = row["clip_norm"] if leader else None
        outer_step_sharded(model, peers if leader else None, state, hp, group, clip_norm=ceiling)
        theta = full_model_state(model, group)
        if leader:
            outer_step(ref, peers, ref_state, hp, clip_norm=ceiling)
            sd = ref.state_dict()
            row["theta_bit_identical"] = all(torch.equal(theta[k], sd[k]) for k in sd)
            row["global_step"] = [state.global_step, ref_state.global_step]
            report["windows"].append(row)
    # validator: SparseLoCo's trial steps carry magnitudes; over all ranks they score as on one process
    assigned = {"a": pages(hp, 10, 6), "b": pages(hp, 11, 5)}
    random_batch = pages(hp, 12, 7)
    if leader:
        shapes = {n: p.shape for n, p in ref.named_parameters()}
        trials = {"a": rule.trial(ref_sent, shapes), "b": rule.trial(scaled, shapes)}
    got = ShardedEvaluator(model, 4, group, position_ranges=4, step_dtype=update_dtype(hp)).score_peers(
        trials if leader else {"a": {}, "b": {}}, assigned, random_batch, 0.5, 3)
    if leader:
        want = Evaluator(ref, 4, position_ranges=4).score_peers(trials, assigned, random_batch, 0.5, 3)
        report["loss_score_max_diff"] = max(abs(getattr(got[p], f) - getattr(want[p], f)) for p in want
                                            for f in ("delta_assigned", "delta_rand", "loss_rand_after"))
        report["loss_score_delta_rand"] = want["a"].delta_rand
    # each unit's own baseline, from steps that help the random pages (else it falls back to δ_rand and
    # there is nothing to compare): the groups' common steps (a mean of steps: fractions, scattered
    # whole) of 2 peers, then the other peers' own steps (each peer's step over every unit, its own trial
    # pass included) of 4, so that each has the 3 others the rule needs; the units are the 1-process
    # ones, and not the plain ones
    steps: dict[str, dict] = {"a": {}, "b": {}}
    if leader:
        accumulate_gradients(ref, torch.cat([random_batch, assigned["a"]]), 4, hp.optimizer.grad_clip)
        descent = {n: g.clone() for n, g in gradients(ref).items()}
        ref.zero_grad(set_to_none=True)
        steps = {"a": descent, "b": {n: 0.5 * g for n, g in descent.items()}}
    for key, rules, more in (("baselined", {"baseline_groups": 2}, ()),
                             ("others", {"baseline": "others"}, (("c", 0.75, 13), ("d", 0.25, 14)))):
        for name, scale, page in more:
            steps[name] = {n: scale * g for n, g in descent.items()} if leader else {}
            assigned[name] = pages(hp, page, 5)
        got = ShardedEvaluator(model, 4, group, position_ranges=4, step_dtype=update_dtype(hp), **rules).score_peers(
            steps, assigned, random_batch, 0.01, 3)
        if leader:
            want = Evaluator(ref, 4, position_ranges=4, **rules).score_peers(steps, assigned, random_batch, 0.01, 3)
            report[f"{key}_units_max_diff"] = max(abs(x - y) for p in want for x, y in zip(
                got[p].sequence_deltas + got[p].random_deltas, want[p].sequence_deltas + want[p].random_deltas,
                strict=True))
            plain = Evaluator(ref, 4, position_ranges=4).score_peers(steps, assigned, random_batch, 0.01, 3)
            report[f"{key}_units_moved"] = max(abs(x - y) for x, y in zip(want["a"].sequence_deltas,
                                                                           plain["a"].sequence_deltas, strict=True))
    if leader:
        (out_dir / "result.json").write_text(json.dumps(report))


CHECKS = {"equality": equality, "sparse": sparse}


def checks(names: list[str], out_dir: Path) -> None:
    """The named checks in order, in one process group (a launch costs each rank its interpreter,
    torch and transformers: about 5 s); each writes OUT/<name>/. Equality's hung-rank check leaves the
    group usable, and it sets the sharded outer step's bucket size for what follows: last."""
    group = init_group("cpu")
    for name in names:
        (out_dir / name).mkdir(parents=True, exist_ok=True)
        CHECKS[name](out_dir / name, group)
    group.close()


if __name__ == "__main__":
    checks(sys.argv[1].split(","), Path(sys.argv[2]))  # CHECK[,CHECK...] OUT
