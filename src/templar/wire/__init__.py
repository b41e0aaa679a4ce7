"""Wire formats: safetensors payloads exchanged through buckets, validated strictly.

Every byte from a peer goes through `read_gradient` / `read_aggregate`, which raise `PayloadError`
(with a stable `reason`) for anything malformed; nothing here ever unpickles. Signing and
verification are injected callables (only `templar.chain` imports bittensor).
"""

from templar.wire.aggregate import Aggregate, max_aggregate_bytes, read_aggregate, write_aggregate
from templar.wire.bundle import Bundle, max_bundle_bytes, read_bundle, write_bundle
from templar.wire.codec import CODEC, CODECS, Q2_CODEC, Codec, codec_for
from templar.wire.container import Signer, Verifier
from templar.wire.errors import REASONS, PayloadError
from templar.wire.gradient import (
    Gradient,
    coefficient_count,
    document_digest,
    gradient_digest,
    max_gradient_bytes,
    read_gradient,
    write_gradient,
)
from templar.wire.inputs import StepInputs, max_inputs_bytes, read_inputs, write_inputs
from templar.wire.probes import probe_positions, take_probes
from templar.wire.schema import Run

__all__ = [
    "CODEC",
    "CODECS",
    "Q2_CODEC",
    "REASONS",
    "Aggregate",
    "Bundle",
    "Codec",
    "Gradient",
    "PayloadError",
    "Run",
    "Signer",
    "StepInputs",
    "Verifier",
    "codec_for",
    "coefficient_count",
    "document_digest",
    "gradient_digest",
    "max_aggregate_bytes",
    "max_bundle_bytes",
    "max_gradient_bytes",
    "max_inputs_bytes",
    "probe_positions",
    "read_aggregate",
    "read_bundle",
    "read_gradient",
    "read_inputs",
    "take_probes",
    "write_aggregate",
    "write_bundle",
    "write_gradient",
    "write_inputs",
]
