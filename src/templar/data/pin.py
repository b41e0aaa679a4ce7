"""Pinning a published corpus in a run's hyperparameters (`templar data pin`).

The last step of publishing a run's data: the manifest is read back through the corpus' *read*
locator, exactly as every node will read it, its geometry checked against the run's, and its
location and sha256 written into the run's hparams file (`data.corpus`, `data.corpus_prefix`,
`data.manifest`). From then on a node reading any other bytes refuses to start. An existing file
keeps every other setting; a new one is written out in full from `base` (every setting, no `base`
reference): the file is the run, to be published and read on other machines, so it names nothing
of this one (no path of this clone; a corpus folder inside the repository is written relative to
it, as `hparams/tiny.json` does) and does not change if a preset changes later.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from templar.core.config import REPO_ROOT, HParams, HParamsError, load_hparams
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


def portable_location(corpus: str) -> str:
    """`corpus` as the run file should name it: a folder inside the repository relative to its root
    (how hparams name the sample corpus); a locator or any other folder as given."""
    if corpus.startswith(("r2:", "s3:", "local:")):
        return corpus  # a `local:` locator is absolute by definition (a machine path: see machine_paths)
    try:
        return str(Path(corpus).expanduser().resolve().relative_to(REPO_ROOT))
    except ValueError:
        return corpus


def machine_paths(corpus: str) -> str | None:
    """Why a run file naming `corpus` would only work on this machine (None if it would not)."""
    if corpus.startswith(("r2:", "s3:")):
        return None
    if corpus.startswith("local:") or Path(corpus).is_absolute():
        return (f"the corpus {corpus} is a folder of this machine: only nodes here can read it. For a run "
                "others join, publish it to a bucket (templar data prepare --out r2:…/s3:…) and pin that")
    return None


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
        try:
            body = load_hparams(base).model_dump(mode="json")
        except HParamsError as exc:
            raise PinError(str(exc)) from exc
        body["name"] = name or hparams.stem
    body.setdefault("data", {})
    body["data"].update({"corpus": portable_location(corpus), "corpus_prefix": prefix, "manifest": digest})
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
