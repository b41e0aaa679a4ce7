"""`--storage s3` for the localnet: one real S3 server (SeaweedFS) on 127.0.0.1, a bucket per node.

Each node commits a locator with the server's read-only key and writes with the admin key, which
reaches it through the environment, as a production node's write key would.
"""

from __future__ import annotations

from pathlib import Path

from templar.storage.locator import WRITE_KEY_ID_ENV, WRITE_SECRET_ENV
from templar.storage.seaweed import SeaweedServer


class LocalS3:
    def __init__(self, data_dir: Path):
        self.server = SeaweedServer(data_dir)

    def start(self) -> None:
        self.server.start()

    def stop(self) -> None:
        self.server.stop()

    def node_bucket(self, bucket: str) -> tuple[str, dict[str, str]]:
        """Create `bucket`; return (read locator to commit, environment holding the write key)."""
        self.server.create_bucket(bucket)
        admin = self.server.admin
        return self.server.locator(bucket).encode(), {
            WRITE_KEY_ID_ENV: admin.access_key_id, WRITE_SECRET_ENV: admin.secret_access_key}
