"""S3AttachmentStore against the real local SeaweedFS server: the shared contract plus S3-specific behaviour."""

from __future__ import annotations

import base64
import gc
import hashlib
import io
import socket
import threading
import time
import tracemalloc
import uuid
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import boto3
import pytest
from botocore.config import Config

from foldline.adapters.s3_attachments import MIB, S3AttachmentStore
from foldline.config import Config as FoldlineConfig
from foldline.config import S3Config
from foldline.config.factories import attachment_store
from foldline.core.codec import digest_bytes
from foldline.errors import (
    AttachmentCorrupt,
    AttachmentError,
    AttachmentNotFound,
    AttachmentReadFailed,
    ConfigError,
    FoldlineError,
    StoreUnavailable,
)
from foldline.ports.attachments import AttachmentMeta, AttachmentStore
from tests.contracts.attachments import AttachmentStoreContract, png

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

pytestmark = pytest.mark.s3


def _prefix() -> str:
    return f"t-{uuid.uuid4().hex[:10]}/"


def _key(store: S3AttachmentStore, attachment_id: str) -> str:
    hexd = attachment_id.removeprefix("sha256:")
    return f"{store.prefix}{hexd[:2]}/{hexd}"


class TestS3AttachmentStore(AttachmentStoreContract):
    @pytest.fixture(autouse=True)
    def _server(self, s3_endpoint: str, s3_bucket: str, s3_admin: S3Client) -> None:
        self.endpoint = s3_endpoint
        self.bucket = s3_bucket
        self.admin = s3_admin

    def make_store(self) -> AttachmentStore:
        return attachment_store(FoldlineConfig(s3=S3Config(self.bucket, prefix=_prefix(), endpoint=self.endpoint)))

    def corrupt(self, store: AttachmentStore, attachment_id: str, data: bytes) -> None:
        """Overwrite the object's bytes directly, keeping its metadata: only the re-hash can notice."""
        assert isinstance(store, S3AttachmentStore)
        key = _key(store, attachment_id)
        head = self.admin.head_object(Bucket=self.bucket, Key=key)
        self.admin.put_object(
            Bucket=self.bucket, Key=key, Body=data, Metadata=head["Metadata"], ContentType=head["ContentType"]
        )


@pytest.fixture
def store(s3_endpoint: str, s3_bucket: str) -> Iterator[S3AttachmentStore]:
    s = attachment_store(FoldlineConfig(s3=S3Config(s3_bucket, prefix=_prefix(), endpoint=s3_endpoint)))
    yield s
    s.close()


def test_layout_metadata_and_checksum(store: S3AttachmentStore, s3_admin: S3Client) -> None:
    data = png(6, 2)
    meta = store.put(data, "image/png")
    hexd = meta.attachment_id.removeprefix("sha256:")
    head = s3_admin.head_object(Bucket=store.bucket, Key=f"{store.prefix}{hexd[:2]}/{hexd}", ChecksumMode="ENABLED")
    assert head["Metadata"] == {
        "attachment-id": meta.attachment_id,
        "media-type": "image/png",
        "bytes": str(len(data)),
        "width": "6",
        "height": "2",
    }
    assert head["ContentType"] == "image/png"
    assert head["ChecksumSHA256"] == base64.b64encode(hashlib.sha256(data).digest()).decode()


def test_racing_stores_never_clobber(s3_endpoint: str, s3_bucket: str) -> None:
    """Two stores (separate clients) race the same bytes under two media types: exactly one type wins,
    every put of that type returns the stored metadata, every put of the other is refused (412 path)."""
    prefix = _prefix()
    a = attachment_store(FoldlineConfig(s3=S3Config(s3_bucket, prefix=prefix, endpoint=s3_endpoint)))
    b = attachment_store(FoldlineConfig(s3=S3Config(s3_bucket, prefix=prefix, endpoint=s3_endpoint)))
    data = b"raced bytes " * 1000
    start = threading.Barrier(16)
    outcomes: list[tuple[str, AttachmentMeta | AttachmentError]] = []
    lock = threading.Lock()

    def put(s: S3AttachmentStore, media_type: str) -> None:
        start.wait()
        try:
            result: AttachmentMeta | AttachmentError = s.put(data, media_type)
        except AttachmentError as exc:
            result = exc
        with lock:
            outcomes.append((media_type, result))

    threads = [
        threading.Thread(target=put, args=(a if i % 2 else b, "text/plain" if i % 4 < 2 else "application/x-raw"))
        for i in range(16)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stored = a.meta(digest_bytes(data))
    assert b.get(stored.attachment_id) == data
    for media_type, result in outcomes:
        if media_type == stored.media_type:
            assert result == stored
        else:
            assert isinstance(result, AttachmentError)
            assert f"already stored as {stored.media_type}" in str(result)
    assert len(outcomes) == 16
    a.close()
    b.close()


def test_second_put_is_412_and_keeps_the_object(store: S3AttachmentStore, s3_admin: S3Client) -> None:
    data = b"written once"
    meta = store.put(data, "text/plain")
    key = _key(store, meta.attachment_id)
    before = s3_admin.head_object(Bucket=store.bucket, Key=key)["LastModified"]
    time.sleep(1.1)  # Last-Modified has one-second resolution
    assert store.put(data, "text/plain") == meta
    assert s3_admin.head_object(Bucket=store.bucket, Key=key)["LastModified"] == before


def test_tampered_metadata_is_corrupt(store: S3AttachmentStore, s3_admin: S3Client) -> None:
    data = png(4, 3)
    meta = store.put(data, "image/png")
    key = _key(store, meta.attachment_id)
    tampered = {"attachment-id": meta.attachment_id, "media-type": "image/png", "bytes": str(len(data))}
    tampered |= {"width": "3", "height": "4"}
    s3_admin.put_object(Bucket=store.bucket, Key=key, Body=data, Metadata=tampered, ChecksumSHA256=_b64(data))
    with pytest.raises(AttachmentCorrupt, match=r"reference records image/png, \d+ bytes, 4x3"):
        store.get(meta.attachment_id, meta.image_ref())
    with pytest.raises(AttachmentCorrupt, match="metadata mismatch"):
        store.get_to(meta.attachment_id, io.BytesIO(), meta)

    s3_admin.put_object(Bucket=store.bucket, Key=key, Body=data, ChecksumSHA256=_b64(data))  # no metadata at all
    with pytest.raises(AttachmentCorrupt, match="metadata is missing"):
        store.get(meta.attachment_id)
    with pytest.raises(AttachmentCorrupt, match="metadata is missing"):
        store.meta(meta.attachment_id)


def test_corrupt_bytes_with_a_valid_server_checksum(store: S3AttachmentStore, s3_admin: S3Client) -> None:
    """The server's checksum is consistent with the (wrong) bytes; only our re-hash against the key catches it."""
    meta = store.put(b"original content", "text/plain")
    bad = b"tampered content"
    s3_admin.put_object(
        Bucket=store.bucket,
        Key=_key(store, meta.attachment_id),
        Body=bad,
        Metadata={"attachment-id": meta.attachment_id, "media-type": "text/plain", "bytes": str(len(bad))},
        ChecksumSHA256=_b64(bad),
    )
    with pytest.raises(AttachmentCorrupt, match="checksum is not its digest"):
        store.get(meta.attachment_id)


class _Source:
    """A non-seekable stream of ``size`` pseudo-random bytes made 1 MiB at a time (never held whole);
    the content depends only on ``seed`` and the position, not on how it is read."""

    def __init__(self, size: int, seed: bytes = b"") -> None:
        self.size = size
        self.pos = 0
        self.seed = seed
        self.block_no = -1
        self.block = b""

    def read(self, size: int = -1, /) -> bytes:
        """Exactly ``size`` bytes (all the rest for ``-1``), fewer only at the end."""
        want = self.size - self.pos if size < 0 else min(size, self.size - self.pos)
        parts = []
        while want > 0:
            block_no, at = divmod(self.pos, MIB)
            if self.block_no != block_no:
                self.block_no = block_no
                self.block = (hashlib.sha512(self.seed + block_no.to_bytes(8, "big")).digest() * (MIB // 64))[:MIB]
            n = min(want, MIB - at)
            parts.append(self.block[at : at + n])
            self.pos += n
            want -= n
        return b"".join(parts)


class _HashSink:
    def __init__(self) -> None:
        self.hasher = hashlib.sha256()
        self.count = 0

    def write(self, data: bytes, /) -> int:
        self.hasher.update(data)
        self.count += len(data)
        return len(data)


def _digest_of(source: _Source) -> str:
    h = hashlib.sha256()
    while chunk := source.read(MIB):
        h.update(chunk)
    return "sha256:" + h.hexdigest()


def test_large_object_streams_within_the_threshold(s3_endpoint: str, s3_bucket: str, s3_admin: S3Client) -> None:
    size, threshold = 64 * MIB, 8 * MIB
    expected_id = _digest_of(_Source(size, b"big"))
    store = attachment_store(
        FoldlineConfig(s3=S3Config(s3_bucket, prefix=_prefix(), endpoint=s3_endpoint)), multipart_threshold=threshold
    )
    gc.collect()
    tracemalloc.start()
    try:
        meta = store.put_stream(_Source(size, b"big"), "application/octet-stream")
        _, put_peak = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        sink = _HashSink()
        n = store.get_to(meta.attachment_id, sink)
        _, get_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    print(
        f"64 MiB object, 8 MiB threshold: put_stream peak {put_peak / MIB:.1f} MiB, "
        f"get_to peak {get_peak / MIB:.1f} MiB"
    )
    assert meta == AttachmentMeta(expected_id, "application/octet-stream", size)
    assert n == size
    assert "sha256:" + sink.hasher.hexdigest() == expected_id
    head = s3_admin.head_object(Bucket=s3_bucket, Key=_key(store, meta.attachment_id), ChecksumMode="ENABLED")
    assert head["ChecksumSHA256"].endswith("-8")  # a multipart object of 8 parts
    assert put_peak < 1.75 * threshold  # one part in memory (+ botocore's request buffers), never the object
    assert get_peak < 0.5 * threshold  # get_to streams 1 MiB chunks through a temporary file
    # Putting it again finds it and uploads nothing (no new multipart upload is left behind either).
    assert store.put_stream(_Source(size, b"big"), "application/octet-stream") == meta
    assert s3_admin.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", []) == []
    store.close()


def test_large_corrupt_object_never_reaches_the_output(s3_endpoint: str, s3_bucket: str, s3_admin: S3Client) -> None:
    store = attachment_store(
        FoldlineConfig(s3=S3Config(s3_bucket, prefix=_prefix(), endpoint=s3_endpoint)), multipart_threshold=5 * MIB
    )
    data = _Source(11 * MIB, b"c").read(11 * MIB)
    meta = store.put_stream(io.BytesIO(data), "application/octet-stream")
    key = _key(store, meta.attachment_id)
    head = s3_admin.head_object(Bucket=s3_bucket, Key=key)
    bad = data[:-1] + bytes([data[-1] ^ 1])
    s3_admin.put_object(Bucket=s3_bucket, Key=key, Body=bad, Metadata=head["Metadata"])
    out = io.BytesIO()
    with pytest.raises(AttachmentCorrupt, match="hash to"):
        store.get_to(meta.attachment_id, out)
    assert out.getvalue() == b""
    store.close()


def test_credentials_never_appear_in_errors(s3_endpoint: str, s3_bucket: str) -> None:
    secret = f"wrong-secret-{uuid.uuid4().hex}"
    access_key = f"AKIAWRONG{uuid.uuid4().hex[:10].upper()}"
    client = boto3.session.Session(aws_access_key_id=access_key, aws_secret_access_key=secret).client(
        "s3", endpoint_url=s3_endpoint, config=Config(retries={"max_attempts": 2, "mode": "standard"})
    )
    store = S3AttachmentStore(s3_bucket, prefix=_prefix(), client=client, max_attempts=2)
    some_id = digest_bytes(b"x")
    attempts: list[Callable[[], object]] = [
        lambda: store.put(b"x", "text/plain"),
        lambda: store.get(some_id),
        lambda: store.meta(some_id),
        lambda: store.exists(some_id),
        lambda: store.put_stream(_Source(6 * MIB), "application/octet-stream"),
    ]
    for attempt in attempts:
        with pytest.raises(AttachmentReadFailed) as info:
            attempt()
        assert "access denied" in str(info.value)
        chain: list[BaseException] = []
        exc: BaseException | None = info.value
        while exc is not None and len(chain) < 10:
            chain.append(exc)
            exc = exc.__cause__ or exc.__context__
        assert len(chain) >= 2  # the botocore error is kept as the cause
        for e in chain:
            text = f"{e} {e!r} {e.args!r}"
            assert secret not in text
            assert access_key not in text
    store.close()


def test_no_credentials_is_a_config_error(
    s3_endpoint: str, s3_bucket: str, monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/credentials")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/config")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    config = FoldlineConfig.from_env(
        {"FOLDLINE_S3_BUCKET": s3_bucket, "FOLDLINE_S3_ENDPOINT": s3_endpoint, "FOLDLINE_S3_MAX_ATTEMPTS": "1"}
    )
    store = attachment_store(config)
    with pytest.raises(ConfigError, match="no usable AWS credentials"):
        store.get(digest_bytes(b"anything"))
    store.close()


def test_from_env_round_trip(s3_endpoint: str, s3_bucket: str) -> None:
    prefix = _prefix()
    store = attachment_store(
        FoldlineConfig.from_env(
            {"FOLDLINE_S3_BUCKET": s3_bucket, "AWS_ENDPOINT_URL_S3": s3_endpoint, "FOLDLINE_S3_PREFIX": prefix}
        )
    )
    assert store.prefix == prefix
    meta = store.put(b"from env", "text/plain")
    assert store.get(meta.attachment_id, meta) == b"from env"
    store.close()
    with pytest.raises(ConfigError, match="FOLDLINE_S3_BUCKET"):
        FoldlineConfig.from_env().overridden(s3__bucket="")


def test_missing_bucket_is_a_typed_read_failure(s3_endpoint: str) -> None:
    """GetObject names the missing bucket. (SeaweedFS creates a missing bucket on PutObject for an admin
    identity, and HEAD has no body to say which is missing, so only the read is checked here.)"""
    store = attachment_store(
        FoldlineConfig(s3=S3Config(f"foldline-absent-{uuid.uuid4().hex[:8]}", endpoint=s3_endpoint))
    )
    with pytest.raises(AttachmentReadFailed, match="bucket does not exist"):
        store.get(digest_bytes(b"x"))
    store.close()


def test_endpoint_down_is_store_unavailable_quickly() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # nothing listens on the port now: every connection is refused
    store = attachment_store(
        FoldlineConfig(s3=S3Config("any-bucket", endpoint=f"http://127.0.0.1:{port}", max_attempts=3))
    )
    for op in (lambda: store.get(digest_bytes(b"x")), lambda: store.put(b"x", "text/plain")):
        t0 = time.monotonic()
        with pytest.raises(StoreUnavailable, match=f"127.0.0.1:{port} did not answer") as info:
            op()
        assert time.monotonic() - t0 < 5.0
        assert isinstance(info.value, FoldlineError)
    store.close()


def test_invalid_configuration_is_rejected() -> None:
    with pytest.raises(ConfigError):
        attachment_store(FoldlineConfig(s3=S3Config("b", endpoint="http://127.0.0.1:1")), multipart_threshold=MIB)
    with pytest.raises(ConfigError):
        attachment_store(FoldlineConfig(s3=S3Config("", endpoint="http://127.0.0.1:1")))


def test_invalid_id_is_not_found(store: S3AttachmentStore) -> None:
    with pytest.raises(AttachmentNotFound):
        store.meta("sha256:XYZ")
    assert not store.exists("md5:abc")


def _b64(data: bytes) -> str:
    return base64.b64encode(hashlib.sha256(data).digest()).decode()


def test_ensure_bucket_creates_a_missing_bucket_once(s3_endpoint: str, s3_admin: S3Client) -> None:
    bucket = f"foldline-ensure-{uuid.uuid4().hex[:8]}"
    store = attachment_store(FoldlineConfig(s3=S3Config(bucket, endpoint=s3_endpoint)))
    try:
        assert store.ensure_bucket() is True
        assert store.ensure_bucket() is False  # already there
        meta = store.put(b"in a new bucket", "text/plain")
        assert store.get(meta.attachment_id, meta) == b"in a new bucket"
    finally:
        store.close()
        for page in s3_admin.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            for obj in page.get("Contents", []):
                s3_admin.delete_object(Bucket=bucket, Key=obj["Key"])
        s3_admin.delete_bucket(Bucket=bucket)


def test_ensure_bucket_on_a_dead_endpoint_is_store_unavailable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = attachment_store(
        FoldlineConfig(s3=S3Config("any-bucket", endpoint=f"http://127.0.0.1:{port}", max_attempts=2))
    )
    with pytest.raises(StoreUnavailable, match=f"HeadBucket s3://any-bucket: S3 endpoint http://127.0.0.1:{port}"):
        store.ensure_bucket()
    store.close()
