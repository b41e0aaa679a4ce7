"""`S3Bucket`: AWS S3, Cloudflare R2 or any S3-compatible store, on aiobotocore.

One client per bucket holds a bounded connection pool. botocore's own retries ("standard"
mode, few attempts) absorb transient 5xx/throttling, and connect/read timeouts catch dead or
stalled servers; the caller's `timeout` then bounds the whole call, retries included, so a
retry can never outlive a gather deadline. Failures are translated into the typed errors of
`templar.storage.base`; nothing is swallowed.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
from aiobotocore.awsrequest import AioAWSResponse
from aiobotocore.config import AioConfig
from aiobotocore.httpsession import AIOHTTPSession
from aiobotocore.session import AioSession, get_session
from aiohttp.abc import AbstractResolver
from botocore.exceptions import BotoCoreError, ClientError, ConnectionClosedError, ReadTimeoutError

from templar.core.log import peer_text
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
    validate_prefix,
    validate_range,
)
from templar.storage.locator import Credentials
from templar.storage.resolve import NotPublicAddress, PeerResolver

MULTIPART_THRESHOLD = 64 << 20
PART_SIZE = 16 << 20
_CHUNK = 1 << 16
MAX_RESPONSE_BYTES = 2 << 20
"""Cap on a successful response body that botocore buffers whole: a LIST page, a PUT's answer. A
1000-key LIST page of this project's keys is about 300 KB (with owners and storage classes, about
400 bytes a key); an object's own body is never buffered here but streamed under the caller's
`max_bytes`. botocore parses what it buffers on the event loop, where no timeout can interrupt it:
16 MiB of XML elements held every node's loop for 9 s."""
MAX_ERROR_BODY_BYTES = 64 << 10
"""Cap on an error's body (any status >= 300, a GET's too): S3's error XML is under 1 KB."""

_NOT_FOUND = {"NoSuchKey", "NotFound", "404"}
_CHANGED = {"PreconditionFailed", "412"}
_DENIED = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403"}
_UNUSABLE = {"NoSuchBucket", "PermanentRedirect", "301", "AuthorizationHeaderMalformed", "InvalidBucketName"}

_session: AioSession | None = None


def _shared_session() -> AioSession:
    """One botocore session per process: service models are parsed once, not per bucket."""
    global _session
    if _session is None:
        _session = get_session()
    return _session


def r2_endpoint(account_id: str) -> str:
    """Cloudflare R2's S3 endpoint for an account."""
    return f"https://{account_id}.r2.cloudflarestorage.com"


def _server_time(response: dict[str, Any]) -> float | None:
    """The server's clock from a response's `Date` header (1 s resolution), None if absent or mangled."""
    header = response.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
    try:
        return email.utils.parsedate_to_datetime(header).timestamp() if isinstance(header, str) else None
    except (TypeError, ValueError, IndexError, OverflowError):
        return None


class _ResponseTooLarge(Exception):
    """A body botocore would buffer whole passed its cap (`S3Bucket` names the key)."""


class _ResponseRefused(Exception):
    """A body botocore would parse holds an XML document type declaration (`S3Bucket` names the key)."""


class _Redirected(Exception):
    """The endpoint answered with an HTTP redirect, which is never followed (`S3Bucket` names the key)."""


class _CappedBody:
    """An aiohttp response whose whole-body `read()` stops past `cap` bytes; all else delegated."""

    def __init__(self, raw: aiohttp.ClientResponse, cap: int) -> None:
        self._raw, self._cap = raw, cap

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)

    async def read(self) -> bytes:
        data = bytearray()
        while chunk := await self._raw.content.read(_CHUNK):
            data += chunk
            if len(data) > self._cap:
                self._raw.close()
                raise _ResponseTooLarge(f"response body over {self._cap} bytes")
        if b"<!DOCTYPE" in data or b"<!ENTITY" in data:
            # S3 never sends one; botocore's parser (expat) expands the entities it declares, on the event
            # loop: 16 MB of references to a 280-byte entity held a reader's loop for 18 s and grew it by 3.3 GB
            raise _ResponseRefused("response body declares an XML document type (entities); S3 sends none")
        return bytes(data)


class _NoRedirects:
    """An aiohttp session whose requests never follow an HTTP redirect; all else delegated."""

    def __init__(self, session: aiohttp.ClientSession) -> None:
        self._session = session

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)

    def request(self, *args: Any, **kwargs: Any) -> Any:
        return self._session.request(*args, **kwargs, allow_redirects=False)


class _PeerHTTPSession(AIOHTTPSession):
    """aiobotocore's HTTP session, with two refusals that an endpoint chosen by a peer calls for.

    - No redirects. aiohttp follows them by default: a peer's public endpoint answering
      `307 Location: http://169.254.169.254/<any path>` sent every reader's requests to a metadata
      service or a loopback port, past every check of the locator. botocore may not see a 3xx either:
      its S3 region redirector answers one with a HeadBucket to the same endpoint, and a 307 to that
      with another, until the stack overflows. A 3xx (but 304) ends the call here: S3 needs none
      (its wrong-region 301 is an unusable bucket either way).
    - No unbounded buffers, nothing costly to parse. botocore reads error bodies (a GET's too) and
      non-streamed answers (LIST pages) into memory whole: an endpoint answering with `404` and an
      endless body grew the reader by 3.9 GB within a 4 s call (the call's timeout bounds the time,
      not the memory). Such a body is read here, under `MAX_ERROR_BODY_BYTES` or `MAX_RESPONSE_BYTES`,
      and refused if it declares a document type: botocore parses it on the event loop, where one
      peer's entity expansion held every transfer and read of the node past its deadline.
    """

    async def _get_session(self, proxy_url: str | None) -> Any:
        return _NoRedirects(await super()._get_session(proxy_url))

    async def send(self, request: Any) -> Any:
        streamed = request.stream_output
        request.stream_output = True  # leave the body unread: it is read below, capped
        try:
            response = await super().send(request)
        finally:
            request.stream_output = streamed
        if 300 <= response.status_code < 400 and response.status_code != 304:
            response.raw.close()
            raise _Redirected(f"answered HTTP {response.status_code}: redirects are not followed")
        if streamed and response.status_code < 300:
            return response  # an object's body: `S3Bucket` streams it under the caller's cap
        cap = MAX_ERROR_BODY_BYTES if response.status_code >= 300 else MAX_RESPONSE_BYTES
        capped = AioAWSResponse(response.url, response.status_code, response.headers,
                                _CappedBody(response.raw, cap))
        try:
            await capped.content
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError) as exc:  # as the session maps them
            raise ConnectionClosedError(error=exc, request=request, endpoint_url=request.url) from exc
        except TimeoutError as exc:  # aiohttp's socket read timeout
            raise ReadTimeoutError(endpoint_url=request.url, error=exc) from exc
        return capped


def _not_public(exc: BaseException) -> NotPublicAddress | None:
    """The `PeerResolver` refusal under botocore's and aiohttp's wrappers, if that is the cause."""
    seen: set[int] = set()
    stack: list[BaseException | None] = [exc]
    while stack:
        cause = stack.pop()
        if cause is None or id(cause) in seen:
            continue
        if isinstance(cause, NotPublicAddress):
            return cause
        seen.add(id(cause))
        kwargs = getattr(cause, "kwargs", None)  # botocore keeps the underlying error in kwargs["error"]
        stack += [cause.__cause__, cause.__context__, getattr(cause, "os_error", None),
                  kwargs.get("error") if isinstance(kwargs, dict) else None]
    return None


def _translate(exc: BaseException, where: str) -> StorageError:
    """Map a botocore/aiohttp failure onto the storage error hierarchy (the server's words clipped)."""
    if isinstance(exc, ClientError):
        err = exc.response.get("Error", {})
        code = str(err.get("Code", ""))
        status = str(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
        detail = f"{where}: {peer_text(code or status, 64)} {peer_text(err.get('Message', ''))}".strip()
        if code == "InvalidRange" or status == "416":
            return ShortRead(detail)
        if code in _CHANGED or status in _CHANGED:
            return ObjectChanged(detail)
        if code in _DENIED or status in _DENIED:
            return AccessDenied(detail)
        if code in _UNUSABLE or status in _UNUSABLE:
            return BucketUnreachable(detail)
        if code in _NOT_FOUND or status in _NOT_FOUND:
            return ObjectNotFound(detail, server_time=_server_time(exc.response))
        return StorageError(detail)
    if isinstance(exc, ReadTimeoutError | TimeoutError):
        return StorageTimeout(f"{where}: read timed out")
    if isinstance(exc, BotoCoreError | aiohttp.ClientError | OSError):
        if (refused := _not_public(exc)) is not None:
            return EndpointNotPublic(f"{where}: {refused}")
        return BucketUnreachable(f"{where}: {type(exc).__name__}: {peer_text(exc)}")
    raise TypeError(f"not a storage failure: {exc!r}")


class S3Bucket(Bucket):
    """A bucket on an S3-compatible endpoint (`endpoint_url=None` means AWS S3 itself).

    `resolver` names the endpoint's host: a `PeerResolver` (lookups in threads of their own) unless
    given one; `open_bucket` gives a peer's bucket on a public network one with `public_only`.

    Create inside the event loop that will use it; close with `aclose()` / `async with`.
    """

    def __init__(self, endpoint_url: str | None, bucket: str, credentials: Credentials, region: str = "auto",
                 *, max_pool_connections: int = 16, connect_timeout: float = 5.0, read_timeout: float = 20.0,
                 max_attempts: int = 2, multipart_threshold: int = MULTIPART_THRESHOLD,
                 part_size: int = PART_SIZE, part_concurrency: int = 4,
                 resolver: AbstractResolver | None = None):
        if part_size < 5 << 20:
            raise ValueError("S3 multipart parts must be at least 5 MiB")
        self.bucket = bucket
        self.endpoint_url = endpoint_url
        self.name = f"s3:{endpoint_url or 'aws'}/{bucket}"
        self._credentials = credentials
        self._region = "us-east-1" if region == "auto" and endpoint_url is None else region
        self._config = AioConfig(
            region_name=self._region,
            signature_version="s3v4",
            s3={"addressing_style": "path" if endpoint_url else "auto"},
            # total attempts, first included; backoff is up to 2**attempt s, so keep it small.
            retries={"mode": "standard", "total_max_attempts": max_attempts},
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            max_pool_connections=max_pool_connections,
            http_session_cls=_PeerHTTPSession,
            connector_args={"resolver": resolver or PeerResolver()},
            # Payload integrity is checked a layer up (schema validation, sha256 manifests);
            # "when_required" also keeps R2 and older S3 clones happy.
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        )
        self._multipart_threshold = multipart_threshold
        self._part_size = part_size
        self._part_concurrency = part_concurrency
        self._stack: contextlib.AsyncExitStack | None = None
        self._client: Any = None
        self._lock = asyncio.Lock()
        self._closed = False

    @classmethod
    def r2(cls, account_id: str, bucket: str, credentials: Credentials, **kwargs: Any) -> S3Bucket:
        """Cloudflare R2: endpoint derived from the account id, region "auto"."""
        return cls(r2_endpoint(account_id), bucket, credentials, "auto", **kwargs)

    async def _get_client(self) -> Any:
        if self._client is not None:
            return self._client
        async with self._lock:
            if self._closed:
                raise StorageError(f"{self.name}: bucket is closed")
            if self._client is None:
                stack = contextlib.AsyncExitStack()
                self._client = await stack.enter_async_context(_shared_session().create_client(
                    "s3", endpoint_url=self.endpoint_url, region_name=self._region, config=self._config,
                    aws_access_key_id=self._credentials.access_key_id,
                    aws_secret_access_key=self._credentials.secret_access_key,
                ))
                self._stack = stack
        return self._client

    async def aclose(self) -> None:
        async with self._lock:
            self._closed = True
            stack, self._stack, self._client = self._stack, None, None
        if stack is not None:
            await stack.aclose()

    @contextlib.asynccontextmanager
    async def _op(self, key: str, timeout: float | None) -> AsyncIterator[None]:
        """Bound a call by `timeout` seconds and translate its failures."""
        where = f"{self.name}/{key}"
        try:
            async with asyncio.timeout(timeout):
                yield
        except StorageError:
            raise
        except _ResponseTooLarge as exc:
            raise ObjectTooLarge(f"{where}: {exc}") from exc
        except (_Redirected, _ResponseRefused) as exc:
            raise BucketUnreachable(f"{where}: {exc}") from exc
        except TimeoutError as exc:
            raise StorageTimeout(f"{where}: no answer within {timeout}s") from exc
        except (ClientError, BotoCoreError, aiohttp.ClientError, OSError) as exc:
            raise _translate(exc, where) from exc
        except Exception as exc:
            # Whatever else escapes the call came from parsing what the endpoint sent, which a peer
            # chooses: botocore's parsers raise ValueError on a mangled header, RuntimeError on a
            # Last-Modified of 1e300 or inf, and others on XML they cannot place. Callers are promised
            # StorageError for anything the endpoint does (cancellation is not an Exception).
            raise StorageError(f"{where}: malformed response ({type(exc).__name__}: {peer_text(exc)})") from exc

    def _info(self, key: str, resp: dict[str, Any], size: int | None = None) -> ObjectInfo:
        """ObjectInfo from response headers, which a hostile endpoint may omit or mangle."""
        size = resp.get("ContentLength") if size is None else size
        modified = resp.get("LastModified")
        if not isinstance(size, int) or size < 0 or not isinstance(modified, datetime):
            raise StorageError(f"{self.name}/{key}: malformed response (no valid Content-Length "
                               "or Last-Modified)")
        return ObjectInfo(key=key, size=size, timestamp=modified.timestamp(),
                          etag=str(resp.get("ETag", "")).strip('"')[:128])

    # -- writes ------------------------------------------------------------------------------

    async def put(self, key: str, data: bytes, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        validate_key(key)
        async with self._op(key, timeout):
            client = await self._get_client()
            await client.put_object(Bucket=self.bucket, Key=key, Body=data, ContentLength=len(data))

    async def create(self, key: str, data: bytes, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        validate_key(key)
        try:
            async with self._op(key, timeout):
                client = await self._get_client()
                await client.put_object(Bucket=self.bucket, Key=key, Body=data, ContentLength=len(data),
                                        IfNoneMatch="*")
        except ObjectChanged as exc:  # 412 PreconditionFailed: the key is taken
            raise ObjectExists(f"{self.name}/{key}: already published (create-only)") from exc
        except StorageError as exc:
            if "ConditionalRequestConflict" in str(exc):  # AWS: a concurrent conditional write won (409)
                raise ObjectExists(f"{self.name}/{key}: already published (create-only)") from exc
            raise

    async def delete(self, key: str, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        validate_key(key)
        async with self._op(key, timeout):
            client = await self._get_client()
            await client.delete_object(Bucket=self.bucket, Key=key)

    async def put_file(self, key: str, path: Path, *, timeout: float | None = None) -> None:
        validate_key(key)
        path = Path(path)
        size = path.stat().st_size
        if size <= self._multipart_threshold:
            data = await asyncio.to_thread(path.read_bytes)
            await self.put(key, data, timeout=timeout)
            return
        async with self._op(key, timeout):
            await self._multipart(key, path, size)

    async def _multipart(self, key: str, path: Path, size: int) -> None:
        client = await self._get_client()
        upload = await client.create_multipart_upload(Bucket=self.bucket, Key=key)
        upload_id = upload["UploadId"]
        limit = asyncio.Semaphore(self._part_concurrency)

        def read_part(offset: int) -> bytes:
            with path.open("rb") as fh:
                fh.seek(offset)
                return fh.read(self._part_size)

        async def send(number: int, offset: int) -> dict[str, Any]:
            async with limit:
                body = await asyncio.to_thread(read_part, offset)
                resp = await client.upload_part(Bucket=self.bucket, Key=key, UploadId=upload_id,
                                                PartNumber=number, Body=body)
                return {"PartNumber": number, "ETag": resp["ETag"]}

        try:
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(send(i + 1, off))
                         for i, off in enumerate(range(0, size, self._part_size))]
            await client.complete_multipart_upload(
                Bucket=self.bucket, Key=key, UploadId=upload_id,
                MultipartUpload={"Parts": [t.result() for t in tasks]})
        except BaseException:
            # Leave no orphaned parts behind (they are billed); shielded so a cancelled
            # caller still cleans up, bounded so a dead server cannot hold us.
            with contextlib.suppress(ClientError, BotoCoreError, aiohttp.ClientError, OSError, TimeoutError):
                async with asyncio.timeout(5.0):
                    await asyncio.shield(client.abort_multipart_upload(
                        Bucket=self.bucket, Key=key, UploadId=upload_id))
            raise

    # -- reads -------------------------------------------------------------------------------

    async def head(self, key: str, *, timeout: float = DEFAULT_TIMEOUT) -> ObjectInfo:
        validate_key(key)
        async with self._op(key, timeout):
            client = await self._get_client()
            resp = await client.head_object(Bucket=self.bucket, Key=key)
            return self._info(key, resp)

    async def fetch(self, key: str, *, max_bytes: int, timeout: float = DEFAULT_TIMEOUT) -> Blob:
        validate_key(key)
        async with self._op(key, timeout):
            client = await self._get_client()
            resp = await client.get_object(Bucket=self.bucket, Key=key)
            body = resp["Body"]
            try:
                announced = resp.get("ContentLength")
                if announced is not None and int(announced) > max_bytes:
                    raise ObjectTooLarge(f"{self.name}/{key}: {announced} bytes > cap {max_bytes}")
                data = bytearray()
                # Never trust the announced length: cap what actually arrives.
                while chunk := await body.read(_CHUNK):
                    data += chunk
                    if len(data) > max_bytes:
                        raise ObjectTooLarge(f"{self.name}/{key}: more than {max_bytes} bytes streamed")
            finally:
                body.close()
            return Blob(info=self._info(key, resp, size=len(data)), data=bytes(data))

    async def get_range(self, key: str, start: int, length: int, *, timeout: float = DEFAULT_TIMEOUT) -> bytes:
        validate_key(key)
        validate_range(start, length)
        async with self._op(key, timeout):
            client = await self._get_client()
            resp = await client.get_object(Bucket=self.bucket, Key=key, Range=f"bytes={start}-{start + length - 1}")
            body = resp["Body"]
            try:
                # A server that ignores Range sends the whole object: skip to `start` ourselves.
                skip = start if not resp.get("ContentRange") else 0
                data = bytearray()
                while len(data) < length and (chunk := await body.read(_CHUNK)):
                    if skip:
                        dropped = min(skip, len(chunk))
                        chunk, skip = chunk[dropped:], skip - dropped
                    data += chunk[:length - len(data)]
            finally:
                body.close()
        if len(data) < length:
            raise ShortRead(f"{self.name}/{key}: range [{start}, {start + length}) past the end "
                            f"({start + len(data)} bytes)")
        return bytes(data)

    async def list(self, prefix: str = "", *, timeout: float = DEFAULT_TIMEOUT,
                   limit: int = 100_000) -> list[ObjectInfo]:
        validate_prefix(prefix)
        found: list[ObjectInfo] = []
        async with self._op(prefix, timeout):
            client = await self._get_client()
            pages = client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=prefix, PaginationConfig={"PageSize": 1000})
            async for page in pages:
                for obj in page.get("Contents", []):
                    key = obj.get("Key", "")
                    try:
                        validate_key(key)
                    except InvalidKey:
                        continue  # a key we could never ask for (or write locally) is not ours
                    found.append(self._info(key, {"ContentLength": obj.get("Size"), **obj}))
                if len(found) >= limit:
                    break
        found.sort(key=lambda o: o.key)
        return found[:limit]

    async def _read_range(self, key: str, start: int, expect: ObjectInfo) -> AsyncIterator[bytes]:
        if start >= expect.size:
            return
        args: dict[str, Any] = {"Bucket": self.bucket, "Key": key, "Range": f"bytes={start}-{expect.size - 1}"}
        if expect.etag:
            args["IfMatch"] = expect.etag  # a replaced object answers 412 → ObjectChanged
        async with self._op(key, None):
            client = await self._get_client()
            resp = await client.get_object(**args)
            body = resp["Body"]
            try:
                # A server that ignores Range sends the whole object: skip what we already have.
                skip = start if not resp.get("ContentRange") else 0
                while chunk := await body.read(1 << 20):
                    if skip:
                        dropped = min(skip, len(chunk))
                        chunk, skip = chunk[dropped:], skip - dropped
                    if chunk:
                        yield chunk
            finally:
                body.close()
