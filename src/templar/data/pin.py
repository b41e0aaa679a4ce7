"""Pinning a published corpus in a run's hyperparameters (`templar data pin`).

The last step of publishing a run's data: the manifest is read back through the corpus' *read*
locator, exactly as every node will read it, its geometry checked against the run's, and its
location and sha256 written into the run's hparams file (`data.corpus`, `data.corpus_prefix`,
`data.manifest`). From then on a node reading any other bytes refuses to start. An existing file
keeps every other setting; a new one builds on `base`.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from templar.core.config import HParams, HParamsError, load_hparams, resolve_hparams_path
from templar.data.manifest import MANIFEST_KEY, MAX_MANIFEST_BYTES, Manifest, ManifestError, parse_manifest
from templar.data.source import check_geometry, corpus_bucket
from templar.storage import StorageError
from templar.storage.locator import LocatorError


class PinError(Exception):
    """The corpus could not be read or does not fit the run; nothing was written."""


async def read_published_manifest(corpus: str, prefix: str) -> tuple[str, Manifest]:
    """(sha256, manifest) of the corpus' manifest, read with the locator's read key."""
    try:
        async with corpus_bucket(corpus) as bucket:
            data = await bucket.get(prefix + MANIFEST_KEY, max_bytes=MAX_MANIFEST_BYTES, timeout=60)
    except (LocatorError, StorageError) as exc:
        raise PinError(f"cannot read {prefix}{MANIFEST_KEY} from the corpus: {exc}") from exc
    try:
        manifest = parse_manifest(data)
    except ManifestError as exc:
        raise PinError(str(exc)) from exc
    return hashlib.sha256(data).hexdigest(), manifest


async def pin_corpus(corpus: str, hparams: Path, *, base: str | None = None, prefix: str = "",
                     name: str | None = None) -> tuple[str, str]:
    """Write the corpus into `hparams` (created from `base` if missing); returns (manifest sha256,
    the run's digest). Raises `PinError` without writing when anything does not fit."""
    digest, manifest = await read_published_manifest(corpus, prefix)
    hparams = Path(hparams)
    if hparams.exists():
        try:
            body = json.loads(hparams.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise PinError(f"{hparams}: {exc}") from exc
        if not isinstance(body, dict):
            raise PinError(f"{hparams}: not a JSON object")
    elif base is None:
        raise PinError(f"{hparams} does not exist: give --base PRESET to create it")
    else:
        body = {"base": str(resolve_hparams_path(base).resolve()), "name": name or hparams.stem}
    body.setdefault("data", {})
    body["data"].update({"corpus": corpus, "corpus_prefix": prefix, "manifest": digest})
    hparams.parent.mkdir(parents=True, exist_ok=True)
    staged = hparams.with_name(f".{hparams.name}.{os.getpid()}.tmp")
    staged.write_text(json.dumps(body, indent=2) + "\n")
    try:
        hp: HParams = load_hparams(staged)
        check_geometry(manifest, hp)
    except (HParamsError, ManifestError) as exc:
        staged.unlink(missing_ok=True)
        raise PinError(f"the corpus does not fit the run: {exc}") from exc
    os.replace(staged, hparams)
    return digest, hp.digest()
