"""The key-store contract against the real local S3 server (SeaweedFS), and the bucket checks of the S3 store."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

import pytest

from foldline.adapters.s3_attachments import s3_client
from foldline.adapters.s3_keys import S3KeyStore
from foldline.adapters.sealing import kek_from_text, new_key
from foldline.errors import ConfigError
from foldline.ports.key_store import KeyStore, SessionKey
from tests.contracts.key_store import KeyStoreContract

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

pytestmark = pytest.mark.s3


def _client(endpoint: str) -> S3Client:
    return s3_client(
        endpoint_url=endpoint,
        region="us-east-1",
        max_attempts=3,
        connect_timeout_s=2,
        read_timeout_s=10,
        max_connections=16,
    )


def _held(admin: S3Client, bucket: str, prefix: str) -> bytes:
    out = []
    for page in admin.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            out.append(admin.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read())
    return b"".join(out)


class TestS3KeyStore(KeyStoreContract):
    @pytest.fixture(autouse=True)
    def _s3(self, s3_endpoint: str, s3_admin: S3Client, s3_bucket: str) -> None:
        self.endpoint, self.admin, self.bucket = s3_endpoint, s3_admin, s3_bucket
        self.prefix = f"keys-{uuid.uuid4().hex[:8]}/"

    def make_store(self) -> KeyStore:
        return S3KeyStore(self.bucket, client=_client(self.endpoint), prefix=self.prefix)

    def held_bytes(self, store: KeyStore) -> bytes:
        return _held(self.admin, self.bucket, self.prefix)


class TestS3KeyStoreWrapped(TestS3KeyStore):
    """With a key-encryption key the bucket holds only wrapped keys: the contract's bytes are looked for unwrapped."""

    def make_store(self) -> KeyStore:
        return S3KeyStore(self.bucket, client=_client(self.endpoint), prefix=self.prefix, kek=kek_from_text("ab" * 32))

    def key_forms(self, store: KeyStore, key: SessionKey) -> list[bytes]:
        assert isinstance(store, S3KeyStore)
        record = store._get_json(store._key_object(key.session_id))  # the wrapped form, as the bucket holds it
        assert record is not None
        return [*super().key_forms(store, key), str(record["wrapped"]).encode()]


def test_wrapped_keys_never_reach_the_bucket_in_the_clear(s3_endpoint: str, s3_admin: S3Client, s3_bucket: str) -> None:
    prefix = f"keys-{uuid.uuid4().hex[:8]}/"
    store = S3KeyStore(s3_bucket, client=_client(s3_endpoint), prefix=prefix, kek=kek_from_text("cd" * 32))
    key = store.create(new_key("s", 1))
    assert key.material is not None
    assert key.material not in _held(s3_admin, s3_bucket, prefix)
    plain = S3KeyStore(s3_bucket, client=_client(s3_endpoint), prefix=prefix)
    with pytest.raises(ConfigError, match="FOLDLINE_KEY_ENCRYPTION_KEY"):
        plain.get("s")
    store.close()
    plain.close()


def test_a_missing_key_bucket_is_created(s3_endpoint: str, s3_admin: S3Client) -> None:
    bucket = f"foldline-keys-{uuid.uuid4().hex[:10]}"
    store = S3KeyStore(bucket, client=_client(s3_endpoint))
    try:
        assert store.create(new_key("s", 1)).session_id == "s"
        s3_admin.head_bucket(Bucket=bucket)
    finally:
        for page in s3_admin.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            for obj in page.get("Contents", []):
                s3_admin.delete_object(Bucket=bucket, Key=obj["Key"])
        s3_admin.delete_bucket(Bucket=bucket)
        store.close()


def test_a_bucket_that_keeps_versions_is_refused(s3_endpoint: str, s3_admin: S3Client) -> None:
    bucket = f"foldline-keys-{uuid.uuid4().hex[:10]}"
    s3_admin.create_bucket(Bucket=bucket)
    store = S3KeyStore(bucket, client=_client(s3_endpoint))
    try:
        s3_admin.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
        with pytest.raises(ConfigError, match="versioning enabled"):
            store.get("s")
    finally:
        store.close()
        versions = s3_admin.list_object_versions(Bucket=bucket)
        for v in [*versions.get("Versions", []), *versions.get("DeleteMarkers", [])]:
            s3_admin.delete_object(Bucket=bucket, Key=v["Key"], VersionId=v["VersionId"])
        s3_admin.delete_bucket(Bucket=bucket)
