"""The one rule for "this node holds the run's model" (`model_in_sync`): a missed, doubled or
foreign window always fails it; ulp-level rounding and a few cross-device sign flips never do.
And the fingerprint's transport in the lead's progress record."""

from __future__ import annotations

import pytest
import torch

from templar.comms import RecordError
from templar.comms.progress import Progress, decode_fingerprint, encode_fingerprint
from templar.core.config import PROTOCOL_VERSION, load_hparams
from templar.core.model import build_model
from templar.core.schedule import learning_rate
from templar.runtime.consensus.fingerprint import model_fingerprint, model_in_sync
from templar.runtime.consensus.outer import apply_update

SEED, WINDOW = 1234, 17
SYNC = load_hparams().sync
"""Production's rules: 256 positions, 1/32 of them may be off."""
FINGERPRINT_POSITIONS, MAX_OFF_SHARE = SYNC.fingerprint_positions, SYNC.max_off_share


def _print(model: torch.nn.Module, window: int = WINDOW) -> torch.Tensor:
    return model_fingerprint(model, SEED, window, FINGERPRINT_POSITIONS)


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
    return _print(copy)


def test_missed_doubled_and_foreign_windows_always_fail(model, hp):
    step = 5
    lr = learning_rate(step, hp.optimizer)
    ours, theirs = _signs(model, 1), _signs(model, 2)
    lead = _after(model, hp, (ours, step))
    assert model_in_sync(_after(model, hp, (ours, step)), lead, lr, SYNC)
    assert not model_in_sync(_print(model), lead, lr, SYNC), "missed window"
    assert not model_in_sync(_after(model, hp, (ours, step), (ours, step)), lead, lr, SYNC), "doubled window"
    assert not model_in_sync(_after(model, hp, (theirs, step)), lead, lr, SYNC), "foreign window"


def test_ulp_rounding_and_a_few_sign_flips_never_fail(model, hp):
    lr = learning_rate(0, hp.optimizer)  # the smallest step of the run: the tightest tolerance
    lead = _print(model)
    toward = torch.where(torch.arange(lead.numel()) % 2 == 0, torch.inf, -torch.inf)
    ulps = lead.clone()
    for _ in range(4):  # 4 ulps off at every position, alternately up and down
        ulps = torch.nextafter(ulps, toward)
    assert not torch.equal(ulps, lead)
    assert model_in_sync(ulps, lead, lr, SYNC)
    allowed = int(FINGERPRINT_POSITIONS * MAX_OFF_SHARE)
    flipped = lead.clone()
    flipped[:allowed] += 2 * lr  # a near-zero coefficient's sign flipped on another device
    assert model_in_sync(flipped, lead, lr, SYNC)
    flipped[allowed] += 2 * lr
    assert not model_in_sync(flipped, lead, lr, SYNC)


def test_non_finite_or_misshapen_fingerprints_are_out_of_sync(model, hp):
    lr = learning_rate(3, hp.optimizer)
    lead = _print(model)
    broken = lead.clone()
    broken[: int(FINGERPRINT_POSITIONS * MAX_OFF_SHARE) + 1] = torch.nan
    assert not model_in_sync(broken, lead, lr, SYNC)
    assert not model_in_sync(lead[:-1], lead, lr, SYNC)
    with pytest.raises(ValueError):
        model_in_sync(lead, lead, 0.0, SYNC)


def test_positions_are_public_and_change_with_the_window(model, hp):
    again = build_model(hp)
    assert torch.equal(_print(model), _print(again))
    assert not torch.equal(_print(model), _print(model, WINDOW + 1))
    assert _print(model).shape == (FINGERPRINT_POSITIONS,)
    assert model_fingerprint(model, SEED, WINDOW, 16).shape == (16,)  # the count is the run's


def test_progress_carries_the_fingerprint_strictly(model):
    values = _print(model)
    text = encode_fingerprint(values)
    record = Progress(protocol=PROTOCOL_VERSION, netuid=1, run="ab" * 32, window=3, global_step=2, fingerprint=text)
    assert len(record.model_dump_json()) < 4096
    assert torch.equal(decode_fingerprint(record.fingerprint, FINGERPRINT_POSITIONS), values)
    with pytest.raises(RecordError):
        decode_fingerprint(text, FINGERPRINT_POSITIONS - 1)
    with pytest.raises(RecordError):
        decode_fingerprint(encode_fingerprint(torch.full((FINGERPRINT_POSITIONS,), torch.inf)),
                           FINGERPRINT_POSITIONS)
    with pytest.raises(RecordError):
        decode_fingerprint("not base64!", FINGERPRINT_POSITIONS)


def test_a_missed_sparse_window_fails_where_half_an_alpha_would_hide_it(model):
    """SparseLoCo's step moves a share of the coordinates by α times a small value: a missed window
    is far inside α/2 everywhere, so the rule counts positions off beyond rounding instead; its exact
    aggregate leaves honest nodes a few ulps apart at most, which never count."""
    hp = load_hparams("tiny-sparseloco")
    step = 5
    lr = learning_rate(step, hp.optimizer)
    g = torch.Generator().manual_seed(3)
    update = {n: (torch.rand(p.shape, generator=g) < 0.1) * torch.randn(p.shape, generator=g) * 1e-3
              for n, p in model.named_parameters()}  # a tenth of θ moved by α·1e-3-ish
    lead = _after(model, hp, (update, step))
    missed = _print(model)
    assert model_in_sync(missed, lead, lr, SYNC), "α/2 hides the missed window"
    assert not model_in_sync(missed, lead, lr, SYNC, moves_every_coordinate=False)
    ulps = lead * (1 + 2.0**-23)  # another device's rounding of the same step
    assert model_in_sync(ulps, lead, lr, SYNC, moves_every_coordinate=False)
    assert not model_in_sync(_after(model, hp, (update, step), (update, step)), lead, lr, SYNC,
                             moves_every_coordinate=False), "doubled window"
