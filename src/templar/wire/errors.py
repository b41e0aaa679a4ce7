"""The one exception every reader of peer bytes raises, with a short stable reason code."""

from __future__ import annotations

__all__ = ["REASONS", "PayloadError"]

REASONS = frozenset(
    {
        "oversize",  # larger than the cap for the expected schema (checked before parsing)
        "not_safetensors",  # truncated, not JSON, bad offsets, duplicate keys
        "header_too_large",  # safetensors header length above the cap
        "missing_tensor",  # an expected tensor is absent
        "unexpected_tensor",  # a tensor the schema does not name
        "bad_dtype",  # a tensor has the wrong dtype
        "bad_shape",  # a tensor has the wrong shape
        "bad_encoding",  # bit streams that do not decode canonically (the gap coding of indices
        # cannot express a duplicate index, so there is no separate duplicate reason)
        "index_range",  # a coefficient index outside its chunk
        "non_finite",  # NaN/Inf values, probes or scales
        "bad_metadata",  # metadata missing, oversized, wrongly typed or inconsistent with hparams
        "bad_signature",  # signature malformed or not by the claimed hotkey
        "wrong_protocol",  # another protocol version
        "wrong_hotkey",  # signed by a different hotkey than the bucket owner
        "wrong_window",  # stamped with another window
        "wrong_run",  # signed for another subnet (netuid) or another run (hparams digest)
    }
)


class PayloadError(ValueError):
    """Malformed or unauthenticated peer data. `reason` is one of `REASONS`; the message has detail."""

    def __init__(self, reason: str, detail: str = "") -> None:
        if reason not in REASONS:
            raise ValueError(f"unknown PayloadError reason {reason!r}")
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}" if detail else reason)
