"""Bucket locators: how a peer reads a node's bucket, as committed on chain (<= 128 bytes).

A locator is hostile input until parsed: `BucketLocator.parse` validates every field (hex
lengths, S3 bucket-name rules, a bare `http(s)://host[:port]` endpoint with no userinfo, path,
query or link-local address, a normalised absolute local path) so nothing a peer commits is
ever pasted into a URL unchecked. Three forms:

    r2:<base64url(account_id | read_key_id | read_secret)>[:<bucket>]
    s3:<http|https>://<host>[:<port>]|<bucket>|<read_key_id>|<read_secret>
    local:/<absolute/normalised/path>

The R2 form packs the three hex fields (128 hex characters, the reference network's whole
commitment) into 86 base64url characters, which leaves room for a bucket name of up to 38
characters (36 for a validator, whose commitment adds a 2-byte role mark); an omitted bucket means
"bucket name == account id", the reference convention.

Write credentials (`Credentials`) are a separate type that is never committed and never logged.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import json
import os
import posixpath
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

MAX_ENCODED_BYTES = 128
"""Size limit of a raw on-chain commitment (Commitments pallet)."""

WRITE_KEY_ID_ENV = "TEMPLAR_BUCKET_WRITE_KEY_ID"
WRITE_SECRET_ENV = "TEMPLAR_BUCKET_WRITE_SECRET"

_HEX32 = re.compile(r"[0-9a-f]{32}")
_HEX64 = re.compile(r"[0-9a-f]{64}")
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_LABEL = re.compile(r"(?!-)[a-z0-9-]{1,63}(?<!-)")
_KEY_ID = re.compile(r"[A-Za-z0-9_.-]{3,64}")
_SECRET = re.compile(r"[A-Za-z0-9_.+/=-]{8,128}")
_ENDPOINT = re.compile(r"(https?)://([^/?#@\s|]+)")
_PORT = re.compile(r"[1-9][0-9]{0,4}")
_NUMERIC_LABEL = re.compile(r"[0-9]+|0x[0-9a-f]*")  # a decimal, octal or hex IPv4 part to inet_aton
_PATH_CHARS = re.compile(r"/[A-Za-z0-9._+@~/-]*")
_R2_PAYLOAD_CHARS = 86  # base64url of 64 bytes, unpadded

Kind = Literal["r2", "s3", "local"]


class LocatorError(ValueError):
    """A bucket locator (usually a peer's on-chain commitment) is malformed."""


@dataclass(frozen=True)
class Credentials:
    """An S3 key pair. `repr` never shows the secret; never log or commit the write pair."""

    access_key_id: str
    secret_access_key: str = field(repr=False)

    def __post_init__(self) -> None:
        if not self.access_key_id or not self.secret_access_key:
            raise LocatorError("credentials need a non-empty access key id and secret")

    def __repr__(self) -> str:
        return f"Credentials(access_key_id={self.access_key_id!r}, secret_access_key=<hidden>)"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Credentials | None:
        """Write credentials from `TEMPLAR_BUCKET_WRITE_KEY_ID`/`_SECRET`; None when both unset."""
        env = os.environ if environ is None else environ
        key_id, secret = env.get(WRITE_KEY_ID_ENV, ""), env.get(WRITE_SECRET_ENV, "")
        if not key_id and not secret:
            return None
        if not key_id or not secret:
            raise LocatorError(f"set both {WRITE_KEY_ID_ENV} and {WRITE_SECRET_ENV}, or neither")
        return cls(key_id, secret)

    @classmethod
    def from_file(cls, path: str | Path) -> Credentials:
        """A JSON file `{"access_key_id": ..., "secret_access_key": ...}`, mode 0600 or stricter.

        A write key file that others on the machine may read or write is refused, as ssh refuses an
        open private key: a reader can overwrite the bucket, a writer can swap in its own key and
        receive the node's uploads. The mode is read from the open file, so it is the one read."""
        try:
            with open(path, "rb") as file:
                mode = stat.S_IMODE(os.fstat(file.fileno()).st_mode)
                if os.name == "posix" and mode & 0o077:
                    raise LocatorError(f"credentials file {path} is open to other users (mode {mode:04o}): a write "
                                       f"key must be private; run chmod 600 {path}")
                raw = json.loads(file.read())
        except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise LocatorError(f"cannot read credentials file {path}: {type(exc).__name__}") from exc
        if not isinstance(raw, dict) or set(raw) != {"access_key_id", "secret_access_key"}:
            raise LocatorError(f"{path}: expected exactly access_key_id and secret_access_key")
        key_id, secret = raw["access_key_id"], raw["secret_access_key"]
        if not isinstance(key_id, str) or not isinstance(secret, str):
            raise LocatorError(f"{path}: credentials must be strings")
        return cls(key_id, secret)


def refuse_write_key(locator: BucketLocator, credentials: Credentials | None) -> None:
    """Raise `LocatorError` when `locator` (about to be printed or committed on chain, both public)
    carries the WRITE key's secret: anyone reading the chain could then overwrite the bucket.

    The CLI (`templar bucket locator`) and the doctor refuse this; a node committing its
    `--bucket.locator` must ask here too, since an operator can paste any locator there. The
    message names neither key."""
    if credentials is not None and locator.read_secret and locator.read_secret == credentials.secret_access_key:
        raise LocatorError("the locator carries the WRITE key's secret (TEMPLAR_BUCKET_WRITE_* or "
                           "--bucket.credentials): a locator is public; create a read-only key for it")


def validate_bucket_name(name: str) -> str:
    """S3 bucket-name rules: 3-63 of [a-z0-9.-], alphanumeric ends, no '..', not an IP."""
    if not _BUCKET.fullmatch(name):
        raise LocatorError("bucket name must be 3-63 characters of a-z, 0-9, '.', '-' "
                           "starting and ending with a letter or digit")
    if ".." in name or ".-" in name or "-." in name:
        raise LocatorError("bucket name has adjacent '.'/'-' characters")
    if re.fullmatch(r"\d+\.\d+\.\d+\.\d+", name):
        raise LocatorError("bucket name must not look like an IP address")
    if name.startswith(("xn--", "sthree-")) or name.endswith(("-s3alias", "--ol-s3")):
        raise LocatorError("bucket name uses a reserved prefix or suffix")
    return name


def _validate_host(host: str) -> str:
    if host.startswith("["):
        if not host.endswith("]") or "%" in host:
            raise LocatorError("IPv6 literal must be [addr] without a zone")
        try:
            ip: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.IPv6Address(host[1:-1])
        except ValueError as exc:
            raise LocatorError("bad IPv6 literal") from exc
    else:
        try:
            ip = ipaddress.IPv4Address(host)
        except ValueError:
            if len(host) > 253 or not all(_LABEL.fullmatch(p) for p in host.split(".")):
                raise LocatorError("endpoint host is not a valid lowercase hostname or IP") from None
            if _NUMERIC_LABEL.fullmatch(host.rsplit(".", 1)[-1]):
                # No real hostname ends in a number (WHATWG's "ends in a number" rule); the resolver
                # (glibc's inet_aton) reads "0x7f000001", "0xa9fea9fe" or "0x7f.1" as an IPv4 address
                # that the loopback, private and metadata checks here would never see.
                raise LocatorError("endpoint host looks like a malformed IPv4 address") from None
            return host
    if not ip.is_loopback and (ip.is_link_local or ip.is_multicast or ip.is_unspecified or ip.is_reserved):
        # 169.254.169.254 and friends: cloud metadata services are never S3 endpoints.
        raise LocatorError("endpoint address is link-local, multicast, unspecified or reserved")
    return host


def _split_endpoint(endpoint: str) -> tuple[str, str, int | None]:
    match = _ENDPOINT.fullmatch(endpoint)
    if not match:
        raise LocatorError("endpoint must be http(s)://host[:port] with no path, query or userinfo")
    scheme, netloc = match.groups()
    port: int | None = None
    if netloc.startswith("["):
        host, _, rest = netloc.partition("]")
        host += "]"
        port_text = rest[1:] if rest.startswith(":") else None
        if rest and port_text is None:
            raise LocatorError("garbage after IPv6 literal")
    else:
        host, sep, port_text = netloc.partition(":")
        port_text = port_text if sep else None
    if port_text is not None:
        if not _PORT.fullmatch(port_text) or not 1 <= int(port_text) <= 65535:
            raise LocatorError("endpoint port must be 1-65535 without leading zeros")
        port = int(port_text)
    return scheme, _validate_host(host), port


def _validate_local_path(path: str) -> str:
    if not _PATH_CHARS.fullmatch(path):
        raise LocatorError("local path must be absolute and use only [A-Za-z0-9._+@~/-]")
    if path != "/" and (posixpath.normpath(path) != path or path.startswith("//")):
        raise LocatorError("local path must be normalised (no '.', '..', '//' or trailing '/')")
    if ".." in path.split("/"):
        raise LocatorError("local path must not contain '..'")
    return path


def _b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def _unb64url(text: str) -> bytes:
    if len(text) != _R2_PAYLOAD_CHARS or not re.fullmatch(r"[A-Za-z0-9_-]+", text):
        raise LocatorError(f"r2 payload must be {_R2_PAYLOAD_CHARS} base64url characters")
    try:
        raw = base64.urlsafe_b64decode(text + "==")
    except (binascii.Error, ValueError) as exc:
        raise LocatorError("r2 payload is not base64url") from exc
    if len(raw) != 64 or _b64url(raw) != text:  # canonical form only: one locator, one string
        raise LocatorError("r2 payload is not the canonical encoding of 64 bytes")
    return raw


PUBLIC_NETWORKS = frozenset({"finney", "test"})
"""The chains whose nodes refuse peers' buckets at private endpoints (`allows_private_endpoints`)."""


def allows_private_endpoints(network: str) -> bool:
    """Whether nodes on `network` (the `--subtensor.network` name) may read peers' buckets at private
    endpoints (`BucketLocator.is_private_endpoint`) and `local:` directories: on a localnet, yes; on
    finney and test, never, so that no peer can aim a validator's requests at its LAN or a metadata
    service. Decided by the name: a node that reaches finney through its own lite node names the
    network `finney` and the node with `--subtensor.chain_endpoint`; a `ws://` URL or `local` given as
    the network itself counts as a development chain. The doctor, `templar bucket check` and the nodes
    all ask here."""
    return network not in PUBLIC_NETWORKS


@dataclass(frozen=True)
class BucketLocator:
    """Where a node's bucket lives and the read-only key to read it; see the module docstring.

    Build with `r2(...)`, `s3(...)`, `local(...)` or `parse(...)`; all run the same validation.
    """

    kind: Kind
    bucket: str = ""
    account_id: str = ""
    endpoint: str = ""
    path: str = ""
    read_key_id: str = field(default="", repr=False)
    read_secret: str = field(default="", repr=False)

    def __post_init__(self) -> None:
        if self.kind == "r2":
            if not _HEX32.fullmatch(self.account_id):
                raise LocatorError("r2 account id must be 32 lowercase hex characters")
            if not _HEX32.fullmatch(self.read_key_id):
                raise LocatorError("r2 read key id must be 32 lowercase hex characters")
            if not _HEX64.fullmatch(self.read_secret):
                raise LocatorError("r2 read secret must be 64 lowercase hex characters")
            validate_bucket_name(self.bucket)
            if self.endpoint or self.path:
                raise LocatorError("r2 locators carry no endpoint or path")
        elif self.kind == "s3":
            _split_endpoint(self.endpoint)
            validate_bucket_name(self.bucket)
            if not _KEY_ID.fullmatch(self.read_key_id):
                raise LocatorError("s3 read key id must be 3-64 of [A-Za-z0-9_.-]")
            if not _SECRET.fullmatch(self.read_secret):
                raise LocatorError("s3 read secret must be 8-128 of [A-Za-z0-9_.+/=-]")
            if self.account_id or self.path:
                raise LocatorError("s3 locators carry no account id or path")
        elif self.kind == "local":
            _validate_local_path(self.path)
            if self.bucket or self.account_id or self.endpoint or self.read_key_id or self.read_secret:
                raise LocatorError("local locators carry only a path")
        else:
            raise LocatorError(f"unknown locator kind {self.kind!r}")

    # -- constructors ------------------------------------------------------------------------

    @classmethod
    def r2(cls, account_id: str, read_key_id: str, read_secret: str, bucket: str | None = None) -> BucketLocator:
        """Cloudflare R2; `bucket` defaults to the account id (the reference convention)."""
        return cls("r2", bucket=bucket or account_id, account_id=account_id,
                   read_key_id=read_key_id, read_secret=read_secret)

    @classmethod
    def s3(cls, endpoint: str, bucket: str, read_key_id: str, read_secret: str) -> BucketLocator:
        """Any S3-compatible store at `http(s)://host[:port]`."""
        return cls("s3", bucket=bucket, endpoint=endpoint, read_key_id=read_key_id, read_secret=read_secret)

    @classmethod
    def local(cls, path: str | Path) -> BucketLocator:
        """A directory on this machine (embedded runs, tests)."""
        return cls("local", path=str(path))

    # -- wire form ---------------------------------------------------------------------------

    def encode(self) -> str:
        """The commitment string; raises `LocatorError` if it would exceed 128 bytes."""
        if self.kind == "r2":
            raw = bytes.fromhex(self.account_id + self.read_key_id + self.read_secret)
            text = "r2:" + _b64url(raw)
            if self.bucket != self.account_id:
                text += ":" + self.bucket
        elif self.kind == "s3":
            text = f"s3:{self.endpoint}|{self.bucket}|{self.read_key_id}|{self.read_secret}"
        else:
            text = f"local:{self.path}"
        if len(text.encode("ascii")) > MAX_ENCODED_BYTES:
            raise LocatorError(f"encoded locator is {len(text)} bytes, over the {MAX_ENCODED_BYTES}-byte "
                               "commitment limit (use a shorter bucket name or endpoint)")
        return text

    @classmethod
    def parse(cls, text: str | bytes) -> BucketLocator:
        """Parse and fully validate a commitment; raises `LocatorError` for anything malformed."""
        if isinstance(text, bytes | bytearray):
            try:
                text = bytes(text).decode("ascii")
            except UnicodeDecodeError as exc:
                raise LocatorError("locator is not ASCII") from exc
        if not isinstance(text, str):
            raise LocatorError("locator must be a string")
        if len(text) > MAX_ENCODED_BYTES or not text.isascii() or not text.isprintable():
            raise LocatorError("locator must be printable ASCII of at most 128 bytes")
        kind, sep, body = text.partition(":")
        if not sep:
            raise LocatorError("locator has no 'kind:' prefix")
        if kind == "r2":
            payload, sep, bucket = body.partition(":")
            if sep and not bucket:
                raise LocatorError("r2 locator has an empty bucket name")
            raw = _unb64url(payload)
            account, key_id, secret = raw[:16].hex(), raw[16:32].hex(), raw[32:].hex()
            if sep and bucket == account:
                raise LocatorError("r2 bucket equal to the account id must be omitted (canonical form)")
            return cls.r2(account, key_id, secret, bucket or None)
        if kind == "s3":
            parts = body.split("|")
            if len(parts) != 4:
                raise LocatorError("s3 locator must be endpoint|bucket|key_id|secret")
            return cls.s3(*parts)
        if kind == "local":
            return cls.local(body)
        raise LocatorError(f"unknown locator kind {kind!r}")

    # -- use ---------------------------------------------------------------------------------

    @property
    def endpoint_url(self) -> str | None:
        """The S3 endpoint to talk to (None for local buckets)."""
        if self.kind == "r2":
            return f"https://{self.account_id}.r2.cloudflarestorage.com"
        if self.kind == "s3":
            return self.endpoint
        return None

    @property
    def read_credentials(self) -> Credentials | None:
        """The read-only key pair committed with the locator (None for local buckets)."""
        if self.kind == "local":
            return None
        return Credentials(self.read_key_id, self.read_secret)

    @property
    def is_private_endpoint(self) -> bool:
        """True for `localhost` and every literal IP that is not globally routable (fine on a
        localnet, refused on mainnet): loopback, private, and also shared address space
        (100.64.0.0/10, where Alibaba Cloud's metadata service answers at 100.100.100.200), which
        is neither `is_private` nor link-local.

        Only the locator's own text is judged here. A hostname that resolves to a private address is
        refused where it is resolved: `open_bucket(allow_private=False)` connects only to the public
        addresses a name resolves to (`storage.resolve.PeerResolver`).
        """
        if self.kind != "s3":
            return self.kind == "local"
        host = _split_endpoint(self.endpoint)[1].strip("[]")
        if host == "localhost":
            return True
        try:
            ipaddress.ip_address(host)
        except ValueError:
            return False
        return not is_public_address(host)

    def __repr__(self) -> str:
        where = {"r2": f"account={self.account_id}", "s3": f"endpoint={self.endpoint}",
                 "local": f"path={self.path}"}[self.kind]
        bucket = f", bucket={self.bucket}" if self.bucket else ""
        key = f", read_key_id={self.read_key_id}" if self.read_key_id else ""
        return f"BucketLocator({self.kind}, {where}{bucket}{key})"

    __str__ = __repr__


def redact_locator(value: str | None) -> str:
    """What `show` may print of a committed locator: its kind and bucket, never its keys."""
    if not value:
        return "-"
    kind, sep, body = value.partition(":")
    if sep and kind == "s3":
        parts = body.split("|")
        return f"s3:{parts[1]}" if len(parts) == 4 else "s3:?"
    if sep and kind == "r2":
        bucket = body.partition(":")[2]
        return f"r2:{bucket or '(account bucket)'}"
    if sep and kind == "local":
        return f"local:{body[:48]}"
    return value[:16] + ("…" if len(value) > 16 else "")


_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")


def is_public_address(address: str) -> bool:
    """Whether a literal IP address is globally routable: the one test of "public" for a locator's
    literal IP and for every address a peer's hostname resolves to. Loopback, private, link-local,
    multicast, reserved and shared address space (100.64.0.0/10, where one cloud's metadata service
    answers) are not. An IPv6 address that carries an IPv4 one to a gateway (IPv4-mapped, NAT64's
    well-known prefix, 6to4) is judged as the IPv4 address it reaches: `64:ff9b::a00:5` is 10.0.0.5
    to a NAT64 gateway, and the DNS64 of an IPv6-only host answers it for a private A record."""
    ip: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        elif ip in _NAT64:
            ip = ipaddress.IPv4Address(int(ip) & 0xFFFF_FFFF)
        elif ip.sixtofour is not None:
            ip = ip.sixtofour
    return ip.is_global and not (ip.is_reserved or ip.is_multicast or ip.is_link_local)


def loopback_hosts(host: str) -> list[str] | None:
    """The Host headers a server listening on `host` accepts: loopback names when it is bound to this
    machine only, so that a web page elsewhere cannot read it through a name it re-points at 127.0.0.1
    (DNS rebinding); None (any) when it listens on the network anyway."""
    return ["localhost", "127.0.0.1", "::1", "[::1]"] if is_loopback(host) else None


def is_loopback(host: str) -> bool:
    """Whether a listening address is this machine only ("localhost", 127.0.0.0/8, ::1): what the
    dashboard and the metrics exporter bind to unless told otherwise."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
