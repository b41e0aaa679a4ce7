"""Object keys of the exchange, all under the protocol version so versions never mix."""

from __future__ import annotations

import re
from collections.abc import Callable

from templar.core.config import PROTOCOL_VERSION


def _root(version: int) -> str:
    return f"v{version}"


def gradient_key(window: int, version: int = PROTOCOL_VERSION) -> str:
    """A miner's compressed pseudo-gradient for `window`."""
    return f"{_root(version)}/gradient/{_window(window)}.safetensors"


def commit_key(window: int, version: int = PROTOCOL_VERSION) -> str:
    """A miner's commitment to its `window` gradient's content digest (docs/scoring.md §8)."""
    return f"{_root(version)}/commit/{_window(window)}.json"


def peers_prefix(version: int = PROTOCOL_VERSION) -> str:
    return f"{_root(version)}/peers/"


def peers_key(window: int, version: int = PROTOCOL_VERSION) -> str:
    """The lead validator's top-G list in effect from `window`."""
    return f"{peers_prefix(version)}{_window(window)}.json"


def peers_index_key(version: int = PROTOCOL_VERSION) -> str:
    """The lead's index of its newest peer-list windows (so readers never LIST the prefix)."""
    return f"{peers_prefix(version)}index.json"


def aggregate_key(window: int, version: int = PROTOCOL_VERSION) -> str:
    """The signed update applied at `window` (for catch-up)."""
    return f"{_root(version)}/aggregate/{_window(window)}.safetensors"


def inputs_key(window: int, version: int = PROTOCOL_VERSION) -> str:
    """The lead's signed record of the payloads it aggregated at `window` (`templar.wire.inputs`)."""
    return f"{_root(version)}/inputs/{_window(window)}.safetensors"


def progress_key(window: int, version: int = PROTOCOL_VERSION) -> str:
    """The global_step and model fingerprint after `window`, by the validator that led it."""
    return f"{_root(version)}/progress/{_window(window)}.json"


def start_window_key(version: int = PROTOCOL_VERSION) -> str:
    """The run's first window (global_step 0)."""
    return f"{_root(version)}/start_window.json"


def checkpoint_prefix(version: int = PROTOCOL_VERSION) -> str:
    return f"{_root(version)}/checkpoint/"


def checkpoint_dir(window: int, version: int = PROTOCOL_VERSION) -> str:
    return f"{checkpoint_prefix(version)}{_window(window)}/"


def checkpoint_file_key(window: int, name: str, version: int = PROTOCOL_VERSION) -> str:
    return checkpoint_dir(window, version) + name


def checkpoint_manifest_key(window: int, version: int = PROTOCOL_VERSION) -> str:
    return checkpoint_dir(window, version) + "manifest.json"


def latest_checkpoint_key(version: int = PROTOCOL_VERSION) -> str:
    """Pointer to the newest complete checkpoint; written last."""
    return f"{checkpoint_prefix(version)}latest.json"


def folder_of(key_of: Callable[[int], str]) -> str:
    """The folder of a per-window key: `folder_of(gradient_key)` is "v4/gradient/" (what a cleanup lists)."""
    return key_of(0).rsplit("/", 1)[0] + "/"


def window_of(key: str, prefix: str, suffix: str) -> int | None:
    """The window number in `<prefix><window><suffix>`, or None for any other key."""
    if not key.startswith(prefix) or not key.endswith(suffix):
        return None
    middle = key[len(prefix):len(key) - len(suffix)]
    return int(middle) if re.fullmatch(r"0|[1-9][0-9]{0,17}", middle) else None


def _window(window: int) -> int:
    if not isinstance(window, int) or isinstance(window, bool) or window < 0:
        raise ValueError(f"window must be a non-negative int, got {window!r}")
    return window
