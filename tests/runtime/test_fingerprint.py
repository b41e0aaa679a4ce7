"""The one rule for "this node holds the run's model" (`model_in_sync`): a missed, doubled or
foreign window always fails it; ulp-level rounding and a few cross-device sign flips never do.
And the fingerprint's transport in the lead's progress record."""

from __future__ import annotations

import pytest
import torch

from templar.comms import RecordError
from templar.comms.progress import Progress, decode_fingerprint, encode_fingerprint
from templar.core.model import build_model
from templar.core.schedule import learning_rate
from templar.runtime.fingerprint import FINGERPRINT_POSITIONS, MAX_OFF_SHARE, model_fingerprint, model_in_sync
from templar.runtime.outer import apply_update

SEED, WINDOW = 1234, 17


@pytest.fixture(scope="module")
def model(hp):
    return build_model(hp)


def _signs(model, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {n: torch.randint(0, 2, p.shape, generator=g).float() * 2 - 1 for n, p in model.named_parameters()}


def _after(model, hp, *updates: tuple[dict[str, torch.Tensor], int]) -> torch.Tensor:
    """The fingerprint of a copy of `model` after applying `updates` (signs, step) in order."""
    copy = build_model(hp)
    copy.load_state_dict(model.state_dict())
    for signs, step in updates:
        apply_update(copy, signs, step, hp)
    return model_fingerprint(copy, SEED, WINDOW)


def test_missed_doubled_and_foreign_windows_always_fail(model, hp):
    step = 5
    lr = learning_rate(step, hp.optimizer)
    ours, theirs = _signs(model, 1), _signs(model, 2)
    lead = _after(model, hp, (ours, step))
    assert model_in_sync(_after(model, hp, (ours, step)), lead, lr)
    assert not model_in_sync(model_fingerprint(model, SEED, WINDOW), lead, lr), "missed window"
    assert not model_in_sync(_after(model, hp, (ours, step), (ours, step)), lead, lr), "doubled window"
    assert not model_in_sync(_after(model, hp, (theirs, step)), lead, lr), "foreign window"


def test_ulp_rounding_and_a_few_sign_flips_never_fail(model, hp):
    lr = learning_rate(0, hp.optimizer)  # the smallest step of the run: the tightest tolerance
    lead = model_fingerprint(model, SEED, WINDOW)
    toward = torch.where(torch.arange(lead.numel()) % 2 == 0, torch.inf, -torch.inf)
    ulps = lead.clone()
    for _ in range(4):  # 4 ulps off at every position, alternately up and down
        ulps = torch.nextafter(ulps, toward)
    assert not torch.equal(ulps, lead)
    assert model_in_sync(ulps, lead, lr)
    allowed = int(FINGERPRINT_POSITIONS * MAX_OFF_SHARE)
    flipped = lead.clone()
    flipped[:allowed] += 2 * lr  # a near-zero coefficient's sign flipped on another device
    assert model_in_sync(flipped, lead, lr)
    flipped[allowed] += 2 * lr
    assert not model_in_sync(flipped, lead, lr)


def test_non_finite_or_misshapen_fingerprints_are_out_of_sync(model, hp):
    lr = learning_rate(3, hp.optimizer)
    lead = model_fingerprint(model, SEED, WINDOW)
    broken = lead.clone()
    broken[: int(FINGERPRINT_POSITIONS * MAX_OFF_SHARE) + 1] = torch.nan
    assert not model_in_sync(broken, lead, lr)
    assert not model_in_sync(lead[:-1], lead, lr)
    with pytest.raises(ValueError):
        model_in_sync(lead, lead, 0.0)


def test_positions_are_public_and_change_with_the_window(model, hp):
    again = build_model(hp)
    assert torch.equal(model_fingerprint(model, SEED, WINDOW), model_fingerprint(again, SEED, WINDOW))
    assert not torch.equal(model_fingerprint(model, SEED, WINDOW), model_fingerprint(model, SEED, WINDOW + 1))
    assert model_fingerprint(model, SEED, WINDOW).shape == (FINGERPRINT_POSITIONS,)


def test_progress_carries_the_fingerprint_strictly(model):
    values = model_fingerprint(model, SEED, WINDOW)
    text = encode_fingerprint(values)
    record = Progress(protocol=2, netuid=1, run="ab" * 32, window=3, global_step=2, fingerprint=text)
    assert len(record.model_dump_json()) < 4096
    assert torch.equal(decode_fingerprint(record.fingerprint, FINGERPRINT_POSITIONS), values)
    with pytest.raises(RecordError):
        decode_fingerprint(text, FINGERPRINT_POSITIONS - 1)
    with pytest.raises(RecordError):
        decode_fingerprint(encode_fingerprint(torch.full((FINGERPRINT_POSITIONS,), torch.inf)),
                           FINGERPRINT_POSITIONS)
    with pytest.raises(RecordError):
        decode_fingerprint("not base64!", FINGERPRINT_POSITIONS)
