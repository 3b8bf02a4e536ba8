"""The S3 archive store runs the archive store contract against the real local SeaweedFS server."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

import pytest

from foldline.adapters.s3_archive import S3ArchiveStore
from foldline.adapters.s3_attachments import s3_client
from foldline.errors import ConfigError
from foldline.ports.archive import ArchiveStore
from tests.contracts.archive_store import ArchiveStoreContract

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

pytestmark = pytest.mark.s3


def _client(endpoint: str) -> S3Client:
    return s3_client(
        endpoint_url=endpoint,
        region=None,
        max_attempts=3,
        connect_timeout_s=2.0,
        read_timeout_s=10.0,
        max_connections=16,
    )


class TestS3ArchiveStore(ArchiveStoreContract):
    @pytest.fixture(autouse=True)
    def _bucket(self, s3_endpoint: str, s3_bucket: str, s3_admin: S3Client) -> None:
        self.endpoint = s3_endpoint
        self.bucket = s3_bucket
        self.admin = s3_admin
        self.prefix = f"archive-{uuid.uuid4().hex[:8]}/"

    def make_store(self) -> ArchiveStore:
        return S3ArchiveStore(self.bucket, client=_client(self.endpoint), prefix=self.prefix)

    def tamper(self, store: ArchiveStore, key: str, data: bytes) -> None:
        self.admin.put_object(Bucket=self.bucket, Key=self.prefix + key, Body=data)


def test_a_missing_bucket_is_created_once(s3_endpoint: str, s3_admin: S3Client) -> None:
    bucket = f"foldline-archive-{uuid.uuid4().hex[:10]}"
    store = S3ArchiveStore(bucket, client=_client(s3_endpoint))
    try:
        store.ensure_bucket()
        store.ensure_bucket()
        assert store.create("x", b"1")
    finally:
        store.delete("x")
        s3_admin.delete_bucket(Bucket=bucket)
        store.close()


def test_an_empty_bucket_name_is_a_config_error(s3_endpoint: str) -> None:
    with pytest.raises(ConfigError, match="FOLDLINE_ARCHIVE_BUCKET"):
        S3ArchiveStore("", client=_client(s3_endpoint))
