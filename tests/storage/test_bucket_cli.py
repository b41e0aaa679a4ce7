"""`templar bucket locator|check`: locators built by the code that parses them, never carrying or
echoing the write key, and read back as a peer would (a real SeaweedFS server)."""

from __future__ import annotations

import json

import pytest

from templar.cli import main
from templar.storage.locator import WRITE_KEY_ID_ENV, WRITE_SECRET_ENV, BucketLocator

ACCOUNT, KEY, SECRET = "a" * 32, "b" * 32, "c" * 64


@pytest.fixture(autouse=True)
def _no_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (WRITE_KEY_ID_ENV, WRITE_SECRET_ENV, "TEMPLAR_BUCKET_CREDENTIALS", "TEMPLAR_BUCKET_READ_KEY_ID",
                 "TEMPLAR_BUCKET_READ_SECRET"):
        monkeypatch.delenv(name, raising=False)


def test_locators_round_trip_and_say_what_they_are(capsys, tmp_path):
    assert main(["bucket", "locator", "r2", "--account-id", ACCOUNT, "--bucket", "my-templar", "--read-key-id", KEY,
                 "--read-secret", SECRET]) == 0
    out, err = capsys.readouterr()
    text = out.strip()
    assert BucketLocator.parse(text) == BucketLocator.r2(ACCOUNT, KEY, SECRET, "my-templar")
    assert "of 128 bytes" in err and SECRET not in err  # stdout is only the locator: $(...) captures it
    assert "validator" not in err
    assert main(["bucket", "locator", "r2", "--account-id", ACCOUNT, "--bucket", "b" * 38, "--read-key-id", KEY,
                 "--read-secret", SECRET]) == 0  # the longest a miner may commit, 2 bytes over a validator's
    out, err = capsys.readouterr()
    assert len(out.strip()) == 128 and "over a validator's 126" in err
    from templar.chain import VALIDATOR_LOCATOR_BYTES
    from templar.storage import cli as bucket_cli

    assert bucket_cli.VALIDATOR_LOCATOR_BYTES == VALIDATOR_LOCATOR_BYTES  # (the command's copy, without the SDK)
    assert main(["bucket", "locator", "s3", "--endpoint", "https://s3.us-east-1.amazonaws.com", "--bucket",
                 "my-templar", "--read-key-id", "READKEY", "--read-secret", "readsecret1"]) == 0
    assert BucketLocator.parse(capsys.readouterr().out.strip()).endpoint_url == "https://s3.us-east-1.amazonaws.com"
    assert main(["bucket", "locator", "local", str(tmp_path / "b")]) == 0
    assert capsys.readouterr().out.strip() == f"local:{tmp_path / 'b'}"


@pytest.mark.parametrize("argv, message", [
    (["r2", "--account-id", "xyz", "--read-key-id", KEY, "--read-secret", SECRET], "account id"),
    (["r2", "--account-id", ACCOUNT, "--read-key-id", KEY], "read-only key"),
    (["s3", "--endpoint", "https://h/path", "--bucket", "ok-bucket", "--read-key-id", "k12", "--read-secret",
      "s1234567"], "endpoint"),
    (["s3", "--endpoint", "https://h", "--bucket", "x" * 80, "--read-key-id", "k12", "--read-secret", "s1234567"],
     "bucket name"),
])
def test_malformed_fields_are_named(capsys, argv, message):
    assert main(["bucket", "locator", *argv]) == 2
    out, err = capsys.readouterr()
    assert out == "" and message in err


def test_the_write_key_is_refused_and_never_echoed(capsys, monkeypatch):
    monkeypatch.setenv(WRITE_KEY_ID_ENV, KEY)
    monkeypatch.setenv(WRITE_SECRET_ENV, SECRET)
    assert main(["bucket", "locator", "r2", "--account-id", ACCOUNT, "--read-key-id", KEY, "--read-secret",
                 SECRET]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "WRITE key" in err and SECRET not in err


def test_a_write_key_that_cannot_be_used_is_named_not_skipped(capsys, monkeypatch, tmp_path):
    """The locator is compared with this machine's write key; one configured in a file the node would
    refuse (here: open to other users) was skipped, and the comparison with it."""
    key_file = tmp_path / "bucket-write.json"
    key_file.write_text(json.dumps({"access_key_id": "writer", "secret_access_key": SECRET}))
    key_file.chmod(0o644)
    monkeypatch.setenv("TEMPLAR_BUCKET_CREDENTIALS", str(key_file))
    assert main(["bucket", "locator", "r2", "--account-id", ACCOUNT, "--read-key-id", KEY, "--read-secret",
                 SECRET]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "write key this machine's node would use" in err and "chmod 600" in err
    assert SECRET not in err


def test_check_reads_as_a_peer_and_catches_a_read_key_that_writes(capsys, seaweed, new_bucket):
    name = new_bucket()
    good = seaweed.locator(name).encode()
    assert main(["bucket", "check", good, "--subtensor.network", "embedded"]) == 0
    out = capsys.readouterr().out
    assert "ok       read" in out and "refused writes" in out and "no lead records" in out
    assert seaweed.reader.secret_access_key not in out
    # on finney, peers refuse a loopback endpoint
    assert main(["bucket", "check", good, "--subtensor.network", "finney"]) == 1
    assert "refuse" in capsys.readouterr().out
    writer = BucketLocator.s3(seaweed.endpoint_url, name, seaweed.admin.access_key_id,
                              seaweed.admin.secret_access_key).encode()
    assert main(["bucket", "check", writer, "--subtensor.network", "embedded"]) == 1
    out = capsys.readouterr().out
    assert "can WRITE" in out and seaweed.admin.secret_access_key not in out
    missing = BucketLocator.s3(seaweed.endpoint_url, "no-such-bucket-here", seaweed.reader.access_key_id,
                               seaweed.reader.secret_access_key).encode()
    assert main(["bucket", "check", missing, "--subtensor.network", "embedded", "--no-write-test"]) == 1
    assert main(["bucket", "check", "s3:nonsense", "--subtensor.network", "embedded"]) == 1


def test_s3_start_refuses_missing_or_shared_keys_and_a_busy_port(monkeypatch, tmp_path, capsys):
    """`templar s3 start` (the launch page's S3 server) takes its two identities from the nodes'
    variables and checks them, and a busy port, before starting anything."""
    import socket

    argv = ["s3", "start", "--dir", str(tmp_path / "s3"), "--bucket", "rehearsal-corpus"]
    assert main(argv) == 2 and "TEMPLAR_BUCKET_WRITE_KEY_ID" in capsys.readouterr().err
    monkeypatch.setenv(WRITE_KEY_ID_ENV, "writer")
    monkeypatch.setenv(WRITE_SECRET_ENV, "write-secret")
    assert main(argv) == 2 and "TEMPLAR_BUCKET_READ_KEY_ID" in capsys.readouterr().err
    monkeypatch.setenv("TEMPLAR_BUCKET_READ_KEY_ID", "writer")
    monkeypatch.setenv("TEMPLAR_BUCKET_READ_SECRET", "read-secret")
    assert main(argv) == 2 and "must differ" in capsys.readouterr().err
    monkeypatch.setenv("TEMPLAR_BUCKET_READ_KEY_ID", "reader")
    with socket.socket() as busy:
        for port in range(20000, 55535, 997):  # one the command accepts (its gRPC port must exist too)
            try:
                busy.bind(("127.0.0.1", port))
                break
            except OSError:
                continue
        busy.listen()
        assert main([*argv, "--port", str(port)]) == 1
    assert "in use" in capsys.readouterr().err and not (tmp_path / "s3" / "server.json").exists()
    assert main(["s3", "stop", "--dir", str(tmp_path / "s3")]) == 0
    assert "no S3 server running" in capsys.readouterr().out
