"""Fast evaluation: every gathered peer gets exactly one named verdict, and a malformed payload's
reason code arrives typed (from the `PayloadError` itself, never parsed back out of a string)."""

from __future__ import annotations

import math

import pytest
import torch
from tests.rules import gauntlet_rules

from templar.comms import GatherResult, GatherStatus
from templar.compress import Compressed, DCTCompressor
from templar.core.config import GauntletConfig
from templar.validator.fast_eval import OtherBase, failure_verdict, fast_evaluate, typical_payloads
from templar.validator.replays import Sighting
from templar.wire import (
    Gradient,
    PayloadError,
    Run,
    document_digest,
    gradient_digest,
    read_gradient,
    take_probes,
    write_gradient,
)

LR = 1e-3
RUN = Run(netuid=7, digest="ab" * 32)


def _rules(*, duplicate_threshold: float = 0.98, shared_positions_threshold: float = math.inf,
           max_norm_ratio: float = math.inf) -> GauntletConfig:
    """Production's fast-evaluation rules (samples, margins, ceilings) with these thresholds, a sync
    threshold of 3 steps; a threshold of inf switches its check off."""
    return gauntlet_rules(sync_max_steps=3.0, duplicate_threshold=duplicate_threshold,
                          shared_positions_threshold=shared_positions_threshold, max_norm_ratio=max_norm_ratio)


def _gradient(tensors: dict[str, Compressed], probes: dict[str, torch.Tensor], *, hotkey: str,
              warmup: bool = False, digest: bytes | None = None) -> Gradient:
    return Gradient(window=5, global_step=2, hotkey=hotkey, warmup=warmup, tensors=tensors, probes=probes,
                    digest=digest or hotkey.encode(), nbytes=0, document_digest=b"doc:" + hotkey.encode())


def _scaled(tensors: dict[str, Compressed], factor: float) -> dict[str, Compressed]:
    return {k: Compressed(c.indices, c.values * factor, c.shape, c.chunk) for k, c in tensors.items()}


@pytest.fixture
def probes(real_peers) -> dict[str, torch.Tensor]:
    shapes, _ = real_peers
    return {n: torch.linspace(-1, 1, 16) for n in shapes}


def _ok(value: Gradient, stamp: float) -> GatherResult[Gradient]:
    return GatherResult(GatherStatus.OK, value=value, timestamp=stamp)


def _evaluate(results, probes, aggregated=(), paid=None):
    """`aggregated`: the hotkeys of `results` whose payloads make the window's aggregate (the peer list);
    `paid`: the validator's weights by hotkey."""
    sizes = typical_payloads([results[hk].value for hk in aggregated], paid or {})
    return fast_evaluate(results, probes, LR, rules=_rules(duplicate_threshold=0.98, max_norm_ratio=100.0), salt=7,
                         sizes=sizes)


def test_honest_peers_pass_and_warmup_is_named(real_peers, probes):
    _, peers = real_peers
    results = {f"p{i}": _ok(_gradient(t, probes, hotkey=f"p{i}", warmup=i == 3), 100.0 + i)
               for i, t in enumerate(peers)}
    verdicts = _evaluate(results, probes)
    assert {hk: v.status for hk, v in verdicts.items()} == {"p0": "ok", "p1": "ok", "p2": "ok", "p3": "warmup"}
    assert all(v.passed and v.sync_steps == 0.0 for v in verdicts.values())


def test_failures_keep_their_typed_reason(probes):
    bad = GatherResult(GatherStatus.MALFORMED, reason="PayloadError: whatever text", error=PayloadError(
        "bad_signature", "not signed by the bucket's hotkey"))
    verdicts = _evaluate({"gone": GatherResult(GatherStatus.MISSING), "bad": bad,
                          "slow": GatherResult(GatherStatus.LATE, reason="written 9s after")}, probes)
    assert verdicts["gone"].status == "missing" and not verdicts["gone"].passed
    assert verdicts["bad"].status == "malformed" and verdicts["bad"].label == "malformed:bad_signature"
    assert verdicts["slow"].status == "late"
    # a malformed result without a typed error (a validator's own exception) has no code to report
    assert failure_verdict(GatherResult(GatherStatus.MALFORMED, reason="PayloadError: oversize: x")).label == "malformed"


def test_a_peer_off_our_model_is_desync(real_peers, probes):
    _, peers = real_peers
    off = {n: p + 10 * LR for n, p in probes.items()}  # ten outer steps away everywhere
    verdicts = _evaluate({"off": _ok(_gradient(peers[0], off, hotkey="off"), 100.0)}, probes)
    assert verdicts["off"].status == "desync" and verdicts["off"].sync_steps == pytest.approx(10.0)


def test_the_later_of_two_identical_uploads_is_the_copy(real_peers, probes):
    _, peers = real_peers
    results = {"first": _ok(_gradient(peers[0], probes, hotkey="first", digest=b"same"), 100.0),
               "second": _ok(_gradient(peers[0], probes, hotkey="second", digest=b"same"), 101.0),
               "other": _ok(_gradient(peers[1], probes, hotkey="other"), 100.5)}
    verdicts = _evaluate(results, probes)
    assert verdicts["second"].status == "copy" and verdicts["second"].copied_from == "first"
    assert verdicts["first"].passed and verdicts["other"].passed


def test_a_rescaled_copy_is_still_a_copy(real_peers, probes):
    _, peers = real_peers
    results = {"orig": _ok(_gradient(peers[0], probes, hotkey="orig"), 100.0),
               "louder": _ok(_gradient(_scaled(peers[0], 3.0), probes, hotkey="louder"), 100.2)}
    assert _evaluate(results, probes)["louder"].status == "copy"


def test_a_shouting_peer_is_scale(real_peers, probes):
    _, peers = real_peers
    results = {f"p{i}": _ok(_gradient(t, probes, hotkey=f"p{i}"), 100.0 + i) for i, t in enumerate(peers[:3])}
    results["loud"] = _ok(_gradient(_scaled(peers[3], 1e4), probes, hotkey="loud"), 104.0)
    verdicts = _evaluate(results, probes, aggregated=["p0", "p1", "p2", "loud"])  # the loud one listed too
    assert verdicts["loud"].status == "scale"
    assert all(verdicts[f"p{i}"].passed for i in range(3))
    # a run's first windows have no aggregate to measure by (no peer list): nobody is `scale`
    assert all(v.passed for v in _evaluate(results, probes).values())
    # nor with fewer than `norm_check_min_peers` (3) payloads in it
    assert all(v.passed for v in _evaluate(results, probes, aggregated=["p0", "loud"]).values())


def test_near_zero_uploads_cannot_move_the_scale_checks_yardstick(real_peers, probes):
    """Warm-ups and near-zero values cost nothing to post: four hotkeys posting either made the median
    of the window's uploads theirs, and every honest upload `scale`. The yardstick is the aggregate's."""
    _, peers = real_peers
    results = {f"p{i}": _ok(_gradient(t, probes, hotkey=f"p{i}"), 100.0 + i) for i, t in enumerate(peers[:3])}
    g = torch.Generator().manual_seed(0)

    def faint(i: int) -> dict[str, Compressed]:  # random values, 1e-9 of an update's: no copy of anything
        return {k: Compressed(c.indices, torch.randn(c.values.shape, generator=g) * 1e-9, c.shape, c.chunk)
                for k, c in peers[3].items()}

    for warmup in (True, False):
        results |= {f"w{i}": _ok(_gradient(faint(i), probes, hotkey=f"w{i}", warmup=warmup), 104.0 + i)
                    for i in range(4)}
        verdicts = _evaluate(results, probes, aggregated=["p0", "p1", "p2"])
        assert [verdicts[f"p{i}"].status for i in range(3)] == ["ok"] * 3
        assert [verdicts[f"w{i}"].status for i in range(4)] == ["warmup" if warmup else "ok"] * 4
    # near-zero hotkeys holding most of the list's slots (its counted median theirs) but none of its pay:
    # an upload is `scale` only beyond the larger median, the pay-weighted one, an honest peer's
    listed, paid = ["p0", "p1", "w0", "w1", "w2"], {"p0": 0.5, "p1": 0.5}
    assert [_evaluate(results, probes, aggregated=listed, paid=paid)[f"p{i}"].status for i in range(3)] == ["ok"] * 3
    assert _evaluate(results, probes, aggregated=listed)["p0"].status == "scale"  # unpaid list: the counted median


def test_a_payload_claiming_another_step_is_wrong_step(real_peers, probes):
    _, peers = real_peers
    honest = _gradient(peers[0], probes, hotkey="honest")
    pumped = Gradient(**{**honest.__dict__, "hotkey": "pump", "global_step": honest.global_step + 4,
                         "tensors": peers[1], "digest": b"pump"})
    verdicts = fast_evaluate({"honest": _ok(honest, 100.0), "pump": _ok(pumped, 100.5)}, probes, LR,
                             rules=_rules(duplicate_threshold=0.98), salt=7, expected_step=2)
    assert verdicts["honest"].passed
    assert verdicts["pump"].status == "wrong_step" and not verdicts["pump"].passed


def test_an_update_computed_from_the_other_base_is_wrong_base(real_peers, probes):
    """The window's base is θ after window w − base_lag (`inner.overlap`): an update that declares
    the run's other candidate base (one window newer or older) is `wrong_base`, as is one declaring
    the right step whose probes lie nearer the other base's model; any other claim stays `wrong_step`.
    Where the two bases are one model (no step between them), nothing is wrong."""
    _, peers = real_peers
    newer = {n: p + LR for n, p in probes.items()}  # θ one outer step on from the base
    honest = _gradient(peers[0], probes, hotkey="honest")
    blocking = Gradient(**{**honest.__dict__, "hotkey": "blocking", "global_step": 3, "probes": newer,
                           "tensors": peers[1], "digest": b"blocking"})
    disguised = Gradient(**{**honest.__dict__, "hotkey": "disguised", "probes": newer, "tensors": peers[2],
                            "digest": b"disguised"})
    pumped = Gradient(**{**honest.__dict__, "hotkey": "pump", "global_step": 9, "tensors": peers[3],
                         "digest": b"pump"})
    results = {hk: _ok(g, 100.0 + i) for i, (hk, g) in enumerate(
        [("honest", honest), ("blocking", blocking), ("disguised", disguised), ("pump", pumped)])}
    verdicts = fast_evaluate(results, probes, LR, rules=_rules(duplicate_threshold=0.98), salt=7, expected_step=2,
                             other_base=OtherBase(3, probes=newer))
    assert {hk: v.status for hk, v in verdicts.items()} == {
        "honest": "ok", "blocking": "wrong_base", "disguised": "wrong_base", "pump": "wrong_step"}
    assert not verdicts["disguised"].passed and verdicts["disguised"].sync_steps == pytest.approx(1.0, rel=1e-4)
    # the claim alone decides when the validator holds no probes of the other base (blocking, eager)
    by_step = fast_evaluate({"blocking": results["blocking"]}, probes, LR, rules=_rules(duplicate_threshold=0.98),
                            salt=7, expected_step=2, other_base=OtherBase(3))
    assert by_step["blocking"].status == "wrong_base"
    same = fast_evaluate({"honest": results["honest"]}, probes, LR, rules=_rules(duplicate_threshold=0.98), salt=7,
                         expected_step=2, other_base=OtherBase(2, probes=probes))
    assert same["honest"].passed


def test_a_payload_other_than_its_commitment_is_uncommitted(real_peers, probes):
    """Commitments (docs/scoring.md §8): a payload whose digest is not what the validator read before the
    window's gradients were readable (borrowed work, or no commitment) fails; an unread peer is not judged."""
    _, peers = real_peers
    results = {hk: _ok(_gradient(peers[i], probes, hotkey=hk), 100.0 + i)
               for i, hk in enumerate(["kept", "changed", "silent", "unread"])}
    commitments = {"kept": b"doc:kept", "changed": b"something else", "silent": b""}
    verdicts = fast_evaluate(results, probes, LR, rules=_rules(duplicate_threshold=0.98), salt=7,
                             commitments=commitments)
    assert verdicts["kept"].passed and verdicts["unread"].passed
    assert verdicts["changed"].status == verdicts["silent"].status == "uncommitted"
    assert not verdicts["changed"].passed


def _noisy(update: dict[str, Compressed], seed: int, noise: float) -> dict[str, Compressed]:
    """`update` with per-coefficient noise of relative size `noise` on its values (a `pooled` member's post)."""
    g = torch.Generator().manual_seed(seed)
    return {k: Compressed(c.indices, c.values * (1 + noise * torch.randn(c.values.shape, generator=g)), c.shape,
                          c.chunk) for k, c in update.items()}


def test_hotkeys_posting_one_update_with_noise_are_one_pool(real_peers, probes):
    """The `pooled` attack: one update, per-coefficient noise on each member's values. The noise
    pushes the cosine below its threshold, but every top-k position is shared: one pool, the
    earliest member stands for it, the others are `copy`; independent peers stay out."""
    _, peers = real_peers

    results = {f"pool{i}": _ok(_gradient(_noisy(peers[0], i, 1.5), probes, hotkey=f"pool{i}"), 100.0 + i) for i in range(3)}
    results |= {f"p{i}": _ok(_gradient(peers[i], probes, hotkey=f"p{i}"), 100.5 + i) for i in (1, 2, 3)}
    strict_cosine = fast_evaluate(results, probes, LR, rules=_rules(duplicate_threshold=0.8), salt=7)
    assert all(v.passed for v in strict_cosine.values()), {h: v.status for h, v in strict_cosine.items()}
    verdicts = fast_evaluate(results, probes, LR, rules=_rules(duplicate_threshold=0.8, shared_positions_threshold=0.75),
                             salt=7)
    assert verdicts["pool0"].passed and verdicts["pool0"].pool == ("pool0", "pool1", "pool2")
    assert [verdicts[f"pool{i}"].status for i in (1, 2)] == ["copy", "copy"]
    assert all(verdicts[f"p{i}"].passed and not verdicts[f"p{i}"].pool for i in (1, 2, 3))


def test_warmup_payloads_form_no_pool(real_peers, probes):
    """A warm-up payload earns nothing and is never aggregated, so it is never compared for shared
    work: two identical warm-ups stay `warmup`, while the same two payloads posted as active work
    are one pool."""
    _, peers = real_peers
    same = peers[0]
    warm = {hk: _ok(_gradient(same, probes, hotkey=hk, warmup=True), 100.0 + i) for i, hk in enumerate(("a", "b"))}
    honest = {f"p{i}": _ok(_gradient(t, probes, hotkey=f"p{i}"), 110.0 + i) for i, t in enumerate(peers[1:])}
    verdicts = _evaluate({**warm, **honest}, probes)
    assert verdicts["a"].status == verdicts["b"].status == "warmup" and not verdicts["a"].pool
    active = {hk: _ok(_gradient(same, probes, hotkey=hk), 100.0 + i) for i, hk in enumerate(("a", "b"))}
    verdicts = _evaluate({**active, **honest}, probes)
    assert verdicts["a"].pool == ("a", "b") and verdicts["b"].status == "copy"


def test_probes_swapped_in_after_the_commitment_are_uncommitted(hp, small_shapes, keypair, verify):
    """The sync check fooled with copied probes: a miner whose model drifted commits to its payload,
    then, once the window's uploads are readable, re-signs the same gradient tensors with probes
    copied from an in-sync peer. The content digest cannot see it (the tensors did not change); the
    committed document digest covers the probes, so the swapped payload is `uncommitted`, while the
    same bytes without a commitment check would have passed as in sync."""
    gen = torch.Generator().manual_seed(3)
    compressor = DCTCompressor(hp.demo.target_chunk, hp.demo.topk)
    ours = {n: torch.randn(s, generator=gen) for n, s in small_shapes.items()}  # the validator's θ
    validator_probes = take_probes(ours, seed=11, window=5, count=hp.gauntlet.probe_count)
    drifted = {n: p + 50 * LR for n, p in validator_probes.items()}  # fifty outer steps away

    def payload(probes: dict[str, torch.Tensor], seed: int) -> bytes:
        g = torch.Generator().manual_seed(seed)
        compressed = {n: compressor.compress(torch.randn(s, generator=g)) for n, s in small_shapes.items()}
        return write_gradient(compressed, probes, window=5, global_step=2, hotkey=keypair.ss58_address, hp=hp,
                              run=RUN, sign=keypair.sign)

    committed = payload(drifted, seed=1)  # what the drifted miner committed to by commit_close
    swapped = payload(validator_probes, seed=1)  # the same work, re-signed with copied probes
    honest = payload(validator_probes, seed=2)
    read = {name: read_gradient(data, small_shapes, hp, run=RUN, verify=verify, expected_hotkey=keypair.ss58_address,
                                expected_window=5) for name, data in {"swapped": swapped, "honest": honest}.items()}
    assert read["swapped"].digest == gradient_digest(committed, small_shapes, hp)  # the old commitment: blind
    commitments = {"swapped": document_digest(committed, small_shapes, hp),
                   "honest": document_digest(honest, small_shapes, hp)}
    results = {name: _ok(g, 100.0) for name, g in read.items()}

    def judge(commitments):
        return {hk: v.status for hk, v in fast_evaluate(results, validator_probes, LR, rules=_rules(), salt=7,
                                                        commitments=commitments).items()}

    assert judge(commitments) == {"swapped": "uncommitted", "honest": "ok"}
    assert judge(None) == {"swapped": "ok", "honest": "ok"}  # what the copied probes bought before


def test_a_replayed_upload_is_replay(real_peers, probes):
    """A peer whose gradient repeats an earlier window's upload (`ReplayMemory.observe` found it) fails
    as `replay`, naming whose upload it repeats; the same payload unflagged would have passed."""
    _, peers = real_peers
    results = {hk: _ok(_gradient(peers[i], probes, hotkey=hk), 100.0 + i) for i, hk in enumerate(["again", "fresh"])}
    verdicts = fast_evaluate(results, probes, LR, rules=_rules(duplicate_threshold=0.98), salt=7,
                             replayed={"again": Sighting("someone", 3)})
    assert verdicts["again"].status == "replay" and verdicts["again"].copied_from == "someone"
    assert not verdicts["again"].passed and not verdicts["again"].status.earns
    assert verdicts["fresh"].passed
    assert all(v.passed for v in _evaluate(results, probes).values())


def _aggregate_copy(payloads: list[dict[str, Compressed]], factor: float) -> dict[str, Compressed]:
    """What a copier of an earlier window's aggregate uploads: the mean of the aggregated payloads
    (each normalised per tensor, as aggregation does), top-k per chunk, rescaled by `factor` times
    the members' typical norm (so the scale check has nothing to say)."""
    out = {}
    for name, first in payloads[0].items():
        rows = []
        norm = float(torch.stack([t[name].values.float().norm() for t in payloads]).mean())
        for tensors in payloads:
            c = tensors[name]
            dense = torch.zeros(c.indices.shape[0], c.plan.chunk_numel)
            dense.scatter_(1, c.indices, c.values.float())
            rows.append(dense / dense.norm().clamp_min(1e-30))
        mean = torch.stack(rows).mean(dim=0)
        keep = mean.abs().topk(first.k, dim=1).indices.sort(dim=1).values
        out[name] = Compressed(keep, mean.gather(1, keep) * factor * norm, first.shape, first.chunk)
    return out


def test_a_copy_of_last_windows_aggregate_or_top_g_upload_is_a_copy_and_earns_nothing(real_peers, probes):
    """Public work of an earlier window (its aggregated uploads and their mean) is a reference: a
    hotkey that uploads last window's aggregate, rescaled, or another peer's aggregated upload,
    rescaled, is `copy` and earns nothing. A peer uploading its own earlier work again is not judged
    on this path, and an independent upload passes."""
    from templar.gauntlet import Status
    from templar.gauntlet.borrowed import AGGREGATE

    _, peers = real_peers
    earlier = {4: {f"g{i}": _gradient(peers[i], probes, hotkey=f"g{i}") for i in range(3)}}
    results = {"copier": _ok(_gradient(_aggregate_copy(peers[:3], 3.0), probes, hotkey="copier"), 100.0),
               "recopier": _ok(_gradient(_scaled(peers[1], 0.5), probes, hotkey="recopier"), 101.0),
               "g0": _ok(_gradient(peers[0], probes, hotkey="g0", digest=b"g0 again"), 102.0),
               "honest": _ok(_gradient(peers[3], probes, hotkey="honest"), 103.0)}
    without = _evaluate(results, probes)
    assert all(v.passed for v in without.values()), {h: v.label for h, v in without.items()}
    verdicts = fast_evaluate(results, probes, LR, salt=7, earlier=earlier,
                             rules=_rules(duplicate_threshold=0.8, shared_positions_threshold=0.75, max_norm_ratio=100.0))
    assert verdicts["copier"].status == Status.COPY and verdicts["copier"].copied_from == AGGREGATE
    assert verdicts["recopier"].status == Status.COPY and verdicts["recopier"].copied_from == "g1"
    assert not Status.COPY.earns
    assert verdicts["g0"].passed and verdicts["honest"].passed


def test_a_flood_of_one_noisy_update_is_one_pool_against_the_validators_baseline(real_peers, probes):
    """11 of 14 uploads are one update with noise on the values: judged against the window's own
    typical pair the flood is the typical pair and hides; with the validator's `PoolBaselines`
    (ceilings a flood cannot lift) it is one pool, and the independent peers stay out."""
    from templar.validator.fast_eval import PoolBaselines

    _, peers = real_peers

    results = {f"pool{i:02d}": _ok(_gradient(_noisy(peers[0], i, 0.5), probes, hotkey=f"pool{i:02d}"), 100.0 + i) for i in range(11)}
    results |= {f"p{i}": _ok(_gradient(peers[i], probes, hotkey=f"p{i}"), 120.0 + i) for i in (1, 2, 3)}
    kwargs = {"rules": _rules(duplicate_threshold=0.8, shared_positions_threshold=0.75), "salt": 7}
    hidden = fast_evaluate(results, probes, LR, **kwargs)
    assert all(v.passed for v in hidden.values())  # the attack on a window-only baseline
    verdicts = fast_evaluate(results, probes, LR, baseline=PoolBaselines.of(kwargs["rules"]), **kwargs)
    assert verdicts["pool00"].passed and len(verdicts["pool00"].pool) == 11
    assert sum(v.status == "copy" for v in verdicts.values()) == 10
    assert all(verdicts[f"p{i}"].passed and not verdicts[f"p{i}"].pool for i in (1, 2, 3))
