"""Bucket locators: round trips, the 128-byte limit, and hostile commitments."""

from __future__ import annotations

import json
import secrets

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from templar.storage.locator import (
    MAX_ENCODED_BYTES,
    BucketLocator,
    Credentials,
    LocatorError,
    refuse_write_key,
    validate_bucket_name,
)

ACCOUNT = "0123456789abcdef0123456789abcdef"
KEY_ID = "fedcba9876543210fedcba9876543210"
SECRET = "ab" * 32


def test_r2_round_trip_default_bucket_is_account_id() -> None:
    loc = BucketLocator.r2(ACCOUNT, KEY_ID, SECRET)
    text = loc.encode()
    assert text.startswith("r2:") and len(text) == 3 + 86  # 128 hex chars packed into 86 base64url
    back = BucketLocator.parse(text)
    assert back == loc
    assert back.bucket == ACCOUNT
    assert back.endpoint_url == f"https://{ACCOUNT}.r2.cloudflarestorage.com"
    assert back.read_credentials == Credentials(KEY_ID, SECRET)


def test_r2_with_named_bucket_fits_and_round_trips() -> None:
    bucket = "templar-gradients-" + "x" * 20  # 38 characters: the longest that fits
    loc = BucketLocator.r2(ACCOUNT, KEY_ID, SECRET, bucket)
    text = loc.encode()
    assert len(text.encode()) == MAX_ENCODED_BYTES
    assert BucketLocator.parse(text) == loc
    with pytest.raises(LocatorError, match="128"):
        BucketLocator.r2(ACCOUNT, KEY_ID, SECRET, bucket + "y").encode()


def test_s3_and_local_round_trip() -> None:
    s3 = BucketLocator.s3("http://127.0.0.1:8333", "alice", "reader123", "s3cr3t-value")
    assert BucketLocator.parse(s3.encode()) == s3
    v6 = BucketLocator.s3("https://[::1]:9000", "b-1.x", "key", "secretsecret")
    assert BucketLocator.parse(v6.encode()) == v6
    host = BucketLocator.s3("https://s3.us-west-2.amazonaws.com", "my.bucket", "AKIAEXAMPLE", "a/b+c=d12345")
    assert BucketLocator.parse(host.encode()) == host
    local = BucketLocator.local("/tmp/templar/bucket-0")
    assert BucketLocator.parse(local.encode()) == local
    assert BucketLocator.parse(local.encode().encode()) == local  # raw bytes from chain


def test_repr_never_shows_secrets() -> None:
    for loc in (BucketLocator.r2(ACCOUNT, KEY_ID, SECRET),
                BucketLocator.s3("http://10.0.0.1:80", "bucket", "readerkey", "topsecretvalue")):
        text = repr(loc) + str(loc) + repr(loc.read_credentials)
        assert SECRET not in text and "topsecretvalue" not in text
    assert "hunter22" not in repr(Credentials("id", "hunter22"))


@pytest.mark.parametrize("text", [
    "",
    "r2",
    "ftp:whatever",
    "r2:" + "A" * 85,                                            # short payload
    "r2:" + "A" * 86 + ":",                                      # empty bucket
    "r2:" + "A" * 86 + ":UPPER",                                 # bad bucket name
    "r2:" + "A" * 85 + "B",                                      # non-canonical base64 (padding bits)
    "r2:" + "=" * 86,
    "s3:http://127.0.0.1:8333|alice|key",                        # missing field
    "s3:http://user:pw@127.0.0.1:8333|alice|keyid|secretsecret",   # userinfo
    "s3:http://127.0.0.1:8333/path|alice|keyid|secretsecret",      # path
    "s3:http://127.0.0.1:8333?x=1|alice|keyid|secretsecret",       # query
    "s3:http://127.0.0.1:0|alice|keyid|secretsecret",              # port 0
    "s3:http://127.0.0.1:65536|alice|keyid|secretsecret",          # port range
    "s3:http://127.0.0.1:080|alice|keyid|secretsecret",            # leading zero
    "s3:http://169.254.169.254|alice|keyid|secretsecret",          # cloud metadata (link-local)
    "s3:http://0.0.0.0:80|alice|keyid|secretsecret",
    "s3:http://999.1.1.1|alice|keyid|secretsecret",
    "s3:http://0xa9fea9fe|alice|keyid|secretsecret",               # 169.254.169.254 to inet_aton
    "s3:http://0x7f000001:8333|alice|keyid|secretsecret",          # 127.0.0.1 to inet_aton
    "s3:http://0x7f.1|alice|keyid|secretsecret",
    "s3:http://0xa9.0xfe.0xa9.0xfe|alice|keyid|secretsecret",
    "s3:http://s3.example.0x1|alice|keyid|secretsecret",
    "s3:http://Host.Example|alice|keyid|secretsecret",             # uppercase host
    "s3:http://-bad.example|alice|keyid|secretsecret",
    "s3:file://127.0.0.1|alice|keyid|secretsecret",
    "s3:http://127.0.0.1|Al|keyid|secretsecret",                   # bucket rules
    "s3:http://127.0.0.1|a..b|keyid|secretsecret",
    "s3:http://127.0.0.1|192.168.1.1|keyid|secretsecret",
    "s3:http://127.0.0.1|alice|k|secretsecret",                    # key id too short
    "s3:http://127.0.0.1|alice|keyid|short",                       # secret too short
    "s3:http://127.0.0.1|alice|keyid|secret secret",
    "local:relative/path",
    "local:/a/../etc",
    "local:/a/./b",
    "local:/a//b",
    "local:/a/b/",
    "local:/a/b\x00c",
    "local:/tmp/x\n",
    "x" * 129,
])
def test_malformed_commitments_are_rejected(text: str) -> None:
    with pytest.raises(LocatorError):
        BucketLocator.parse(text)


def test_non_ascii_bytes_and_bad_fields_rejected() -> None:
    with pytest.raises(LocatorError):
        BucketLocator.parse(b"local:/tmp/\xff")
    with pytest.raises(LocatorError):
        BucketLocator.r2(ACCOUNT.upper(), KEY_ID, SECRET)
    with pytest.raises(LocatorError):
        BucketLocator.r2(ACCOUNT, KEY_ID, SECRET[:-2])
    with pytest.raises(LocatorError):  # the canonical r2 form omits a bucket equal to the account id
        BucketLocator.parse(BucketLocator.r2(ACCOUNT, KEY_ID, SECRET).encode() + ":" + ACCOUNT)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=140) | st.binary(max_size=140))
def test_parse_raises_only_locator_error(blob: str | bytes) -> None:
    try:
        loc = BucketLocator.parse(blob)
    except LocatorError:
        return
    assert BucketLocator.parse(loc.encode()) == loc


@settings(max_examples=100, deadline=None)
@given(st.binary(min_size=64, max_size=64))
def test_r2_packs_any_hex_triple(raw: bytes) -> None:
    loc = BucketLocator.r2(raw[:16].hex(), raw[16:32].hex(), raw[32:].hex())
    assert BucketLocator.parse(loc.encode()) == loc


def test_private_endpoint_flag() -> None:
    assert BucketLocator.s3("http://127.0.0.1:1", "abc", "key", "secretsecret").is_private_endpoint
    assert BucketLocator.s3("http://10.1.2.3", "abc", "key", "secretsecret").is_private_endpoint
    assert not BucketLocator.s3("https://s3.example.com", "abc", "key", "secretsecret").is_private_endpoint
    assert not BucketLocator.r2(ACCOUNT, KEY_ID, SECRET).is_private_endpoint
    # shared address space: Alibaba Cloud's metadata service, neither `is_private` nor link-local
    assert BucketLocator.s3("http://100.100.100.200", "abc", "key", "secretsecret").is_private_endpoint
    assert not BucketLocator.s3("http://8.8.8.8", "abc", "key", "secretsecret").is_private_endpoint
    assert not BucketLocator.s3("https://s3.0x1.example", "abc", "key", "secretsecret").is_private_endpoint


def test_numeric_hosts_never_reach_the_resolver() -> None:
    """glibc's resolver reads "0x7f000001" as 127.0.0.1 and "0xa9fea9fe" as the metadata address: a
    host ending in a number must be refused, not judged as a name (it would pass every check)."""
    for host in ("0xa9fea9fe", "0x7f000001", "0x7f.0.0.1", "0x0", "a.b.017700000001"):
        with pytest.raises(LocatorError, match="IPv4"):
            BucketLocator.s3(f"http://{host}", "abc", "key", "secretsecret")


def test_bucket_name_rules() -> None:
    for good in ("abc", "a-b.c", "x" * 63, "0bucket9"):
        assert validate_bucket_name(good) == good
    for bad in ("ab", "x" * 64, "-abc", "abc-", "a_b", "xn--abc", "a.-b", "10.0.0.1"):
        with pytest.raises(LocatorError):
            validate_bucket_name(bad)


def test_credentials_from_env_and_file(tmp_path) -> None:
    secret = secrets.token_hex(20)
    env = {"TEMPLAR_BUCKET_WRITE_KEY_ID": "writer", "TEMPLAR_BUCKET_WRITE_SECRET": secret}
    assert Credentials.from_env(env) == Credentials("writer", secret)
    assert Credentials.from_env({}) is None
    with pytest.raises(LocatorError, match="both"):
        Credentials.from_env({"TEMPLAR_BUCKET_WRITE_KEY_ID": "writer"})
    path = tmp_path / "creds.json"
    path.write_text(json.dumps({"access_key_id": "writer", "secret_access_key": secret}))
    path.chmod(0o600)
    assert Credentials.from_file(path) == Credentials("writer", secret)
    path.chmod(0o400)
    assert Credentials.from_file(path) == Credentials("writer", secret)
    for open_mode in (0o644, 0o640, 0o602):  # readable by the group or the world, or writable by others
        path.chmod(open_mode)
        with pytest.raises(LocatorError, match=f"mode {open_mode:04o}.*chmod 600") as info:
            Credentials.from_file(path)
        assert secret not in str(info.value)
    path.chmod(0o600)
    path.write_text(json.dumps({"access_key_id": "writer"}))
    with pytest.raises(LocatorError):
        Credentials.from_file(path)
    with pytest.raises(LocatorError) as info:
        Credentials.from_file(tmp_path / "missing.json")
    assert secret not in str(info.value)


def test_a_locator_carrying_the_write_secret_is_refused() -> None:
    """A node commits its `--bucket.locator` as given: one pasted with the WRITE key would publish
    that key on chain for anyone to overwrite the bucket; `refuse_write_key` is the guard."""
    write = Credentials("writekeyid", "writesecret1234567890")
    leaky = BucketLocator.s3("https://s3.example.com", "my-bucket", "writekeyid", write.secret_access_key)
    with pytest.raises(LocatorError, match="WRITE") as info:
        refuse_write_key(leaky, write)
    assert write.secret_access_key not in str(info.value)
    refuse_write_key(BucketLocator.s3("https://s3.example.com", "my-bucket", "reader", "readsecret123"), write)
    refuse_write_key(leaky, None)
    refuse_write_key(BucketLocator.local("/srv/bucket"), write)


def test_only_the_public_networks_refuse_private_endpoints():
    """One rule for the nodes, the doctor and `templar bucket check`: finney and test refuse peers'
    private endpoints; a localnet's chain (embedded, local, a ws:// URL given as the network) reads them."""
    from templar.storage.locator import allows_private_endpoints

    assert not allows_private_endpoints("finney") and not allows_private_endpoints("test")
    assert all(allows_private_endpoints(n) for n in ("embedded", "local", "ws://127.0.0.1:9944"))
