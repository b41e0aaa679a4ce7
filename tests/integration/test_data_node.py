"""A node's corpus: read from a real S3 data bucket by ranged GETs, and refused when its
manifest is not the one pinned in hparams (the node stops at start with one clear line)."""

from __future__ import annotations

import asyncio
import json

import pytest

from templar.core.config import PRESETS_DIR, load_hparams, resolve_asset
from templar.data import LocalCorpus
from templar.data.prepare import upload
from templar.runtime.node import EXIT_CONFIG, run_node
from templar.storage import S3Bucket
from templar.storage.locator import BucketLocator
from templar.storage.seaweed import SeaweedServer

from .harness import Subnet

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def seaweed(tmp_path_factory: pytest.TempPathFactory):
    server = SeaweedServer(tmp_path_factory.mktemp("seaweed-data"))
    server.start()
    try:
        yield server
    finally:
        server.stop(kill=True)


def test_node_reads_its_pages_from_an_s3_data_bucket(tmp_path, seaweed: SeaweedServer) -> None:
    subnet = Subnet.create(tmp_path, {"m0": 0.0})
    hp = load_hparams(subnet.hparams)
    local = LocalCorpus(resolve_asset(hp.data.corpus), digest=hp.data.manifest)
    seaweed.create_bucket("run-data")
    locator = BucketLocator.s3(seaweed.endpoint_url, "run-data", seaweed.reader.access_key_id,
                                 seaweed.reader.secret_access_key)

    async def scenario() -> None:
        async with S3Bucket(seaweed.endpoint_url, "run-data", seaweed.admin) as bucket:
            await upload(local.root, bucket, "sample/", local.manifest)
        node = await subnet.node("m0", "--data.locator", locator.encode(), "--data.prefix", "sample/")
        try:
            assert node.plan.num_pages == local.num_pages
            pages = node.plan.assigned_pages(node.uid, 3, hp.data.pages_per_window)
            batch, got = await node.pages.fetch(pages)
            assert got == pages and batch.equal(local.batch(pages))
            assert node.pages.stats["remote"] == len(pages)
        finally:
            await node.aclose()

    asyncio.run(scenario())


def test_node_with_a_different_corpus_stops_at_start_with_one_line(tmp_path) -> None:
    subnet = Subnet.create(tmp_path, {"m0": 0.0})
    preset = tmp_path / "other-corpus.json"
    preset.write_text(json.dumps({"base": str(PRESETS_DIR / "tiny.json"), "name": "tiny-other",
                                  "data": {"manifest": "3" * 64}}))
    subnet.hparams = preset
    logfile = tmp_path / "node.log"

    # through the entry points' runner: the library raises, `run_node` logs one line and exits 3
    code = run_node(subnet.args("m0", "--logging.file", str(logfile)), "miner", lambda node: asyncio.sleep(0))
    assert code == EXIT_CONFIG
    errors = [line for line in logfile.read_text().splitlines() if "ERROR" in line]
    assert len(errors) == 1 and "does not match the pinned data.manifest" in errors[0], errors
