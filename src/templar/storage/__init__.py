"""Buckets: one async interface over a local directory or any S3-compatible store.

    bucket = open_bucket(BucketLocator.parse(commitment))        # a peer's bucket, read-only key
    own = open_bucket(my_locator, Credentials.from_env())         # our bucket, write key
    async with own:
        await own.put("v1/gradient/42.safetensors", payload)
"""

from __future__ import annotations

import re

from templar.core.clock import Now
from templar.storage.base import (
    DEFAULT_TIMEOUT,
    AccessDenied,
    Blob,
    Bucket,
    BucketUnreachable,
    EndpointNotPublic,
    InvalidKey,
    ObjectChanged,
    ObjectExists,
    ObjectInfo,
    ObjectNotFound,
    ObjectTooLarge,
    ShortRead,
    StorageError,
    StorageTimeout,
    validate_key,
)
from templar.storage.counting import observed
from templar.storage.local import LocalBucket
from templar.storage.locator import BucketLocator, Credentials, LocatorError
from templar.storage.resolve import Lookup, PeerResolver, system_lookup
from templar.storage.s3 import S3Bucket

__all__ = [
    "DEFAULT_TIMEOUT",
    "AccessDenied",
    "Blob",
    "Bucket",
    "BucketUnreachable",
    "EndpointNotPublic",
    "InvalidKey",
    "LocalBucket",
    "ObjectChanged",
    "ObjectExists",
    "ObjectInfo",
    "ObjectNotFound",
    "ObjectTooLarge",
    "S3Bucket",
    "ShortRead",
    "StorageError",
    "StorageTimeout",
    "open_bucket",
    "validate_key",
]


def open_bucket(locator: BucketLocator, credentials: Credentials | None = None, *,
                allow_private: bool = True, own: bool = False, now: Now | None = None,
                lookup: Lookup = system_lookup, **s3_options: object) -> Bucket:
    """A bucket for `locator`: our own with write `credentials`, or a peer's with its read key.

    `allow_private=False` (mainnet validators) refuses loopback/private-IP endpoints a hostile
    peer might commit to aim our requests at internal services, and connects to a hostname only at
    the public addresses it resolves to (behind an HTTP(S) proxy, the proxy resolves it: see
    `storage.resolve`). `own=True` for our own bucket: only then may a local
    bucket's directory be created (a peer's locator never creates anything on our disk). `now`
    stamps a local bucket's writes (an S3 server stamps its own). `lookup` asks the endpoint's name
    (the system's resolver; a test's table). `s3_options` go to `S3Bucket` (timeouts, pool size).
    Call inside the event loop that will use the bucket.
    """
    if locator.kind == "local":
        if not allow_private:
            raise LocatorError("local buckets are refused when allow_private=False")
        return observed(LocalBucket(locator.path, create=own, now=now), own)
    if not allow_private and locator.is_private_endpoint:
        raise LocatorError(f"refusing private/loopback endpoint {locator.endpoint}")
    creds = credentials or locator.read_credentials
    assert creds is not None  # r2/s3 locators always carry a read key
    # a hostname is judged by the addresses it resolves to, when it is resolved (`storage.resolve`)
    resolver = PeerResolver(public_only=not allow_private, lookup=lookup)
    return observed(S3Bucket(locator.endpoint_url, locator.bucket, creds, _region(locator), resolver=resolver,
                             **s3_options), own)  # type: ignore[arg-type]


def _region(locator: BucketLocator) -> str:
    """SigV4 needs a region: R2 takes "auto"; AWS hosts name theirs; clones accept us-east-1."""
    if locator.kind == "r2":
        return "auto"
    match = re.fullmatch(r"https://s3[.-]([a-z0-9-]+)\.amazonaws\.com(:443)?", locator.endpoint)
    return match.group(1) if match else "us-east-1"
