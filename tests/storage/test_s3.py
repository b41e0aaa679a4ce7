"""S3-specific behaviour: multipart, credentials, and endpoints that hang, refuse or lie."""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from pathlib import Path

import pytest
from tests.conftest import KeepAliveServer

from templar.storage import (
    BucketUnreachable,
    LocalBucket,
    ObjectTooLarge,
    S3Bucket,
    StorageError,
    StorageTimeout,
    open_bucket,
)
from templar.storage.locator import BucketLocator, Credentials, LocatorError


def test_multipart_upload_round_trip(seaweed, new_bucket, tmp_path: Path) -> None:
    name = new_bucket()
    src = tmp_path / "ckpt.bin"
    data = os.urandom(11 << 20)  # 3 parts of 5 MiB, 5 MiB, 1 MiB
    src.write_bytes(data)

    async def body() -> None:
        async with S3Bucket(seaweed.endpoint_url, name, seaweed.admin, multipart_threshold=5 << 20,
                            part_size=5 << 20) as b:
            await b.put_file("v1/checkpoint/3/model.safetensors", src)
            info = await b.head("v1/checkpoint/3/model.safetensors")
            assert info.size == len(data)
            assert info.etag.endswith("-3")  # really went through multipart
            out = tmp_path / "back.bin"
            await b.get_file("v1/checkpoint/3/model.safetensors", out, max_bytes=len(data))
            assert hashlib.sha256(out.read_bytes()).digest() == hashlib.sha256(data).digest()

    asyncio.run(body())


def test_read_only_key_reads_but_cannot_write(seaweed, new_bucket) -> None:
    name = new_bucket()

    async def body() -> None:
        async with S3Bucket(seaweed.endpoint_url, name, seaweed.admin) as own:
            await own.put("v1/gradient/1.safetensors", b"mine")
        locator = BucketLocator.parse(seaweed.locator(name).encode())
        async with open_bucket(locator) as peer:
            assert await peer.get("v1/gradient/1.safetensors", max_bytes=10) == b"mine"
            with pytest.raises(BucketUnreachable, match="AccessDenied"):
                await peer.put("v1/gradient/1.safetensors", b"overwrite")
        async with open_bucket(locator, seaweed.admin) as writer:  # write credentials win
            await writer.put("v1/gradient/2.safetensors", b"ok")

    asyncio.run(body())


def test_wrong_secret_and_missing_bucket_are_unreachable(seaweed, new_bucket) -> None:
    name = new_bucket()

    async def body() -> None:
        bad = Credentials(seaweed.reader.access_key_id, "0" * 40)
        async with S3Bucket(seaweed.endpoint_url, name, bad) as b:
            with pytest.raises(BucketUnreachable):
                await b.get("x", max_bytes=10)
        async with S3Bucket(seaweed.endpoint_url, "no-such-bucket-here", seaweed.admin) as b:
            with pytest.raises(BucketUnreachable):
                await b.get("x", max_bytes=10)

    asyncio.run(body())


def test_hanging_endpoint_times_out_on_time(hanging) -> None:
    async def body() -> None:
        async with S3Bucket(hanging.url, "peer", Credentials("key", "secretsecret")) as b:
            started = time.monotonic()
            with pytest.raises(StorageTimeout):
                await b.head("v1/gradient/1.safetensors", timeout=0.8)
            # the call's own 0.8 s, not the default 30 s; the slack is for a loaded machine (3 workers, 2 cores)
            assert time.monotonic() - started < 4.0

    asyncio.run(body())


def test_refused_endpoint_is_unreachable(dead_endpoint) -> None:
    async def body() -> None:
        async with S3Bucket(dead_endpoint, "peer", Credentials("key", "secretsecret")) as b:
            started = time.monotonic()
            with pytest.raises(BucketUnreachable):
                await b.get("v1/gradient/1.safetensors", max_bytes=10, timeout=5.0)
            assert time.monotonic() - started < 5.0

    asyncio.run(body())


def test_endless_body_is_cut_at_the_cap(endless_server) -> None:
    async def body() -> None:
        async with S3Bucket(endless_server.url, "peer", Credentials("key", "secretsecret")) as b:
            with pytest.raises(ObjectTooLarge, match="streamed"):
                await b.get("v1/gradient/1.safetensors", max_bytes=200_000, timeout=5.0)
        # We stopped reading shortly after the cap (the kernel buffers a few MB at most).
        assert endless_server.sent < 64 << 20

    asyncio.run(body())


def test_announced_huge_body_rejected_before_reading(huge_length_server) -> None:
    async def body() -> None:
        async with S3Bucket(huge_length_server.url, "peer", Credentials("key", "secretsecret")) as b:
            with pytest.raises(ObjectTooLarge, match="10000000000 bytes"):
                await b.get("v1/gradient/1.safetensors", max_bytes=1 << 20, timeout=5.0)

    asyncio.run(body())


_LIST_1E300 = (b'<?xml version="1.0" encoding="UTF-8"?><ListBucketResult><Name>peer</Name><IsTruncated>false</IsTruncated>'
               b"<Contents><Key>k</Key><LastModified>1e300</LastModified><Size>5</Size></Contents></ListBucketResult>")
"""A LIST page whose one object's timestamp is past any datetime."""


@pytest.mark.parametrize("response", [
    b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",                                   # no Last-Modified
    b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nLast-Modified: garbage\r\n\r\nhello",
    # A number botocore reads as epoch seconds past any datetime: its parser raised RuntimeError ("Unable
    # to calculate correct timezone offset"), which crashed gather, the commitment reader and succession.
    b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nLast-Modified: 1e300\r\n\r\nhello",
    b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nLast-Modified: inf\r\n\r\nhello",
    b"HTTP/1.1 200 OK\r\nContent-Type: application/xml\r\nContent-Length: %d\r\n\r\n%s" % (len(_LIST_1E300), _LIST_1E300),
    b"HTTP/1.1 200 OK\r\nContent-Length: abc\r\n\r\nhello",
    b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\nLast-Modified: Wed, 21 Oct 2026 07:28:00 GMT\r\n\r\nhi",
    b"HTTP/1.1 500 Oops\r\nContent-Length: 9\r\n\r\n<<<<<<<<<",
    b"SSH-2.0-OpenSSH_9.2\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nX-Pad: " + b"a" * 200_000 + b"\r\nContent-Length: 5\r\n\r\nhello",
])
def test_mangled_responses_raise_storage_errors_only(hostile_server, response: bytes) -> None:
    """Whatever a hostile endpoint sends, callers see a StorageError, never a parser's KeyError."""
    server = hostile_server(response)

    async def body() -> None:
        # One attempt: retries only add backoff here; the error type is what is under test.
        async with S3Bucket(server.url, "peer", Credentials("key", "secretsecret"), max_attempts=1) as b:
            for call in (b.head("k", timeout=5.0), b.get("k", max_bytes=100, timeout=5.0),
                         b.list("", timeout=5.0)):
                with pytest.raises(StorageError):
                    await call

    asyncio.run(body())


@pytest.mark.parametrize("status", [b"404 Not Found", b"200 OK"])
def test_a_buffered_body_is_cut_at_the_response_cap(hostile_server, status: bytes) -> None:
    """botocore reads an error's body (a GET's too) and a LIST page into memory whole: an endpoint
    answering with an endless one grew the reader by 3.9 GB within a 4 s call. 48 MiB stands for it."""
    size = 48 << 20
    server = hostile_server(b"HTTP/1.1 " + status + b"\r\nContent-Type: application/xml\r\n"
                            b"Content-Length: %d\r\n\r\n" % size + b"<" * size)

    async def body() -> None:
        async with S3Bucket(server.url, "peer", Credentials("key", "secretsecret"), max_attempts=1) as b:
            calls = [lambda: b.list("", timeout=10.0)]
            if status.startswith(b"404"):  # a 200 GET's body is streamed under max_bytes instead
                calls.append(lambda: b.get("k", max_bytes=100, timeout=10.0))
            for call in calls:
                with pytest.raises(ObjectTooLarge, match="response body over"):
                    await call()

    asyncio.run(body())


def test_an_error_body_is_cut_at_its_own_cap_and_one_declaring_entities_is_refused(hostile_server) -> None:
    """botocore parses a buffered body on the event loop, where no timeout interrupts it: a peer's `500`
    whose XML declared a 280-byte entity and referenced it through 16 MB held a reader's loop for 18 s
    and grew it by 3.3 GB (every other peer's transfer and commitment read ran past its deadline). An
    error's body is cut at 64 KiB, and a body declaring a document type is refused before it is parsed."""
    entity = b'<?xml version="1.0"?><!DOCTYPE Error [<!ENTITY a "' + b"A" * 280 + b'">]><Error><Message>'
    bomb = entity + b"&a;" * 10_000 + b"</Message></Error>"
    large = b"<Error><Message>" + b"A" * (256 << 10) + b"</Message></Error>"

    def answer(status: bytes, body: bytes) -> bytes:
        return (b"HTTP/1.1 " + status + b"\r\nContent-Type: application/xml\r\nContent-Length: %d\r\n\r\n"
                % len(body) + body)

    async def calls(server, error: type[StorageError], match: str, names: tuple[str, ...]) -> None:
        async with S3Bucket(server.url, "peer", Credentials("key", "secretsecret"), max_attempts=1) as b:
            made = {"get": lambda: b.get("k", max_bytes=100, timeout=10.0), "list": lambda: b.list("", timeout=10.0)}
            for name in names:  # (a HEAD's answer has no body; a 200 GET's body is streamed, never parsed)
                with pytest.raises(error, match=match):
                    await made[name]()

    refused = (BucketUnreachable, "declares an XML document type")
    asyncio.run(calls(hostile_server(answer(b"500 Oops", bomb)), *refused, ("get", "list")))
    asyncio.run(calls(hostile_server(answer(b"200 OK", bomb)), *refused, ("list",)))
    asyncio.run(calls(hostile_server(answer(b"404 Not Found", large)), ObjectTooLarge, "response body over 65536",
                      ("get", "list")))


def test_a_redirect_is_never_followed(hostile_server, hanging) -> None:
    """aiohttp followed redirects: a public endpoint answering `307 Location: <anywhere>` sent every
    reader's requests, with a path of its choosing, to a metadata service or a loopback port."""
    server = hostile_server(b"HTTP/1.1 307 Temporary Redirect\r\nLocation: %s/latest/meta-data/\r\n"
                            b"Content-Length: 0\r\n\r\n" % hanging.url.encode())

    async def body() -> None:
        async with S3Bucket(server.url, "peer", Credentials("key", "secretsecret")) as b:
            for call in (lambda: b.head("k", timeout=3.0), lambda: b.get("k", max_bytes=10, timeout=3.0),
                         lambda: b.list("", timeout=3.0)):
                with pytest.raises(BucketUnreachable, match="redirects are not followed"):
                    await call()

    asyncio.run(body())
    assert hanging.conns == []  # the redirect's target never heard from us


def test_a_bare_redirect_status_cannot_overflow_the_stack() -> None:
    """botocore's S3 region redirector answers a 301 it cannot place with a HeadBucket to the same
    endpoint, and that one's 301 with another: a peer answering `301` made `head` and `get` raise
    RecursionError (and `gather` with them), past every `except StorageError`."""
    server = KeepAliveServer(b"HTTP/1.1 301 Moved Permanently\r\nContent-Length: 0\r\n\r\n")

    async def body() -> None:
        async with S3Bucket(server.url, "peer", Credentials("key", "secretsecret")) as b:
            for call in (lambda: b.head("k", timeout=5.0), lambda: b.get("k", max_bytes=10, timeout=5.0)):
                with pytest.raises(StorageError):
                    await call()

    try:
        asyncio.run(body())
    finally:
        server.close()
    assert server.requests <= 4  # one request a call and a retry at most, not one per stack frame


def test_a_servers_error_message_reaches_logs_as_one_short_line(hostile_server) -> None:
    """An endpoint's error text is peer-supplied: its newlines would forge log lines (`[SYNC]` logs it)."""
    message = "denied\n2026-01-01 | INFO | [LEAD] forged line\n" + "x" * 5000
    xml = f"<?xml version='1.0'?><Error><Code>Weird\nCode</Code><Message>{message}</Message></Error>".encode()
    server = hostile_server(b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/xml\r\n"
                            b"Content-Length: %d\r\n\r\n" % len(xml) + xml)

    async def body() -> None:
        async with S3Bucket(server.url, "peer", Credentials("key", "secretsecret"), max_attempts=1) as b:
            with pytest.raises(StorageError) as info:
                await b.get("k", max_bytes=100, timeout=5.0)
        text = str(info.value)
        assert "\n" not in text and len(text) < 400 and "Weird Code denied" in text

    asyncio.run(body())


def test_open_bucket_dispatch_and_private_policy(tmp_path: Path) -> None:
    local = open_bucket(BucketLocator.local(str(tmp_path / "b")))
    assert isinstance(local, LocalBucket)
    s3 = BucketLocator.s3("http://127.0.0.1:9", "abc", "key", "secretsecret")
    with pytest.raises(LocatorError):
        open_bucket(s3, allow_private=False)
    with pytest.raises(LocatorError):
        open_bucket(BucketLocator.local(str(tmp_path)), allow_private=False)
    r2 = open_bucket(BucketLocator.r2("a" * 32, "b" * 32, "c" * 64, "grads"), allow_private=False)
    assert isinstance(r2, S3Bucket)
    assert r2.endpoint_url == f"https://{'a' * 32}.r2.cloudflarestorage.com" and r2.bucket == "grads"
    assert "c" * 64 not in repr(r2)


def test_a_nearly_full_disk_is_named_before_weed_starts(tmp_path: Path, monkeypatch) -> None:
    """SeaweedFS marks its volumes read-only below 1 % free disk: the server would start and refuse
    every write, which reads as 'not ready after 30 s', three times. The start says why at once."""
    import shutil
    from types import SimpleNamespace

    from templar.storage import seaweed

    usage = shutil.disk_usage(tmp_path)  # this machine's own disk, as it is
    assert (seaweed.disk_space_problem(tmp_path) is None) == (usage.free >= usage.total / 100)
    assert "free some space" in seaweed.disk_space_problem(tmp_path, min_free_fraction=1.01)  # no disk is 101 % free

    full = SimpleNamespace(total=100 << 30, used=(100 << 30) - (200 << 20), free=200 << 20)  # as disk_usage gives
    monkeypatch.setattr(seaweed.shutil, "disk_usage", lambda path: full)
    spawned = []
    monkeypatch.setattr(seaweed.SeaweedServer, "_spawn", lambda self: spawned.append(self))
    with pytest.raises(seaweed.SeaweedError, match=r"cannot take writes: only 200 MiB of 100 GiB free"):
        seaweed.SeaweedServer(tmp_path / "s3").start(timeout=1)
    assert spawned == []  # no process was started, no 30-second wait


@pytest.mark.slow(seconds=4, waits=True)
def test_weed_retries_on_fresh_ports_after_one_is_taken(tmp_path: Path, monkeypatch) -> None:
    """Free ports are chosen, then bound by weed: another process can take one in between (seen
    in a loaded suite: 'bind: address already in use'). The next attempt's new ports must be the
    ones its readiness probe writes to; the probe once kept the first attempt's S3 port, so every
    retry waited its whole timeout on a port weed was not on and the start failed."""
    import socket

    from templar.storage import seaweed

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))  # held, so weed cannot bind it (not listening: a probe there is refused at once)
    real, calls = seaweed._free_service_ports, []

    def first_s3_port_taken(services: int, host: str) -> list[int]:
        ports = real(services, host)
        if not calls:  # the first attempt's S3 port is one something else already listens on
            ports[seaweed._SERVICES.index("s3")] = taken.getsockname()[1]
        calls.append(ports)
        return ports

    monkeypatch.setattr(seaweed, "_free_service_ports", first_s3_port_taken)
    server = seaweed.SeaweedServer(tmp_path / "s3")
    try:
        server.start(timeout=30)
        assert len(calls) == 2 and server.ports["s3.port"] == calls[1][seaweed._SERVICES.index("s3")]
        assert server._client().put_object(Bucket="templar-ready-probe", Key="again", Body=b"ok")
    finally:
        server.stop()
        taken.close()


def test_the_servers_keys_are_never_readable_by_others(seaweed) -> None:
    """The bundled server's identities file holds its admin (write) key: it appears with mode 0600, set
    before the rename (`atomic_write`), where it was written with the umask's mode and narrowed afterwards."""
    identities = seaweed.data_dir / "s3.json"
    assert identities.stat().st_mode & 0o777 == 0o600
    assert seaweed.admin.secret_access_key in identities.read_text()
