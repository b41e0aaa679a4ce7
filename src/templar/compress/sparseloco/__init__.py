"""SparseLoCo's outer step: chunked top-k without a transform, 2-bit values with error feedback,
and the median-clipped mean of the top-G peers applied with outer SGD.

`SparseLoCoCompressor` has `DCTCompressor`'s interface, so `templar.compress.DeMo` runs its error
feedback unchanged; `Compressed` is the same (values hold the exact level × scale), so the wire,
fingerprints and evaluation read it unchanged. The wire format is the `rice-q2` codec
(`templar.wire.codec`). Pure tensor maths, no I/O.
"""

from templar.compress.sparseloco.aggregate import (
    aggregate_clipped_mean,
    apply_mean_update,
    clip_factor,
    clip_factors,
    clip_level,
    lower_median,
    payload_norm_squared,
)
from templar.compress.sparseloco.compressor import SparseLoCoCompressor
from templar.compress.sparseloco.grid import join, quantise, split

__all__ = [
    "SparseLoCoCompressor",
    "aggregate_clipped_mean",
    "apply_mean_update",
    "clip_factor",
    "clip_factors",
    "clip_level",
    "join",
    "lower_median",
    "payload_norm_squared",
    "quantise",
    "split",
]
