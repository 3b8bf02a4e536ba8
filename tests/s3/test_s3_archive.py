"""The S3 archive store runs the archive store contract against the real local SeaweedFS server."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, ClassVar

import pytest

from foldline.adapters.s3_archive import S3ArchiveStore
from foldline.adapters.s3_attachments import s3_client
from foldline.errors import ConfigError, StoreUnavailable
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


def test_fetch_from_a_missing_bucket_names_the_bucket_setting(s3_endpoint: str) -> None:
    store = S3ArchiveStore(f"foldline-absent-{uuid.uuid4().hex[:10]}", client=_client(s3_endpoint))
    try:
        with pytest.raises(ConfigError, match="FOLDLINE_ARCHIVE_BUCKET"):
            store.fetch("sessions/x/segment")
    finally:
        store.close()


class _Busy(BaseHTTPRequestHandler):
    """An S3 endpoint that answers the first ``busy`` GETs 503 SlowDown (XML, as S3 does), then the object."""

    busy: ClassVar[int] = 0
    seen: ClassVar[list[str]] = []
    url: ClassVar[str] = ""

    def do_GET(self) -> None:
        type(self).seen.append(self.path)
        if len(type(self).seen) <= type(self).busy:
            body = b"<Error><Code>SlowDown</Code><RequestId>busy-1</RequestId><Message>x</Message></Error>"
            self.send_response(503)
        else:
            body = b"segment bytes"
            self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def busy_endpoint() -> Iterator[type[_Busy]]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Busy)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Busy.seen = []
    _Busy.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield _Busy
    finally:
        server.shutdown()
        server.server_close()


def test_fetch_retries_a_busy_store_then_names_its_answer(busy_endpoint: type[_Busy]) -> None:
    """A 503 is tried again (botocore's backoff) up to max_attempts; past that the error names the answer."""
    url = busy_endpoint.url
    busy_endpoint.busy = 2
    store = S3ArchiveStore("bucket", client=_client(url), prefix="p/", max_attempts=3)
    try:
        assert store.fetch("sessions/a/s1") == b"segment bytes"
        assert len(busy_endpoint.seen) == 3
        assert all(path.startswith("/bucket/p/sessions/a/s1?") for path in busy_endpoint.seen)  # presigned
        busy_endpoint.seen, busy_endpoint.busy = [], 5
        began = time.monotonic()
        with pytest.raises(StoreUnavailable, match=r"GetObject s3://bucket/p/sessions/a/s2: HTTP 503 SlowDown"):
            store.fetch("sessions/a/s2")
        assert len(busy_endpoint.seen) == 3
        assert time.monotonic() - began < 10
    finally:
        store.close()


def test_fetch_from_an_endpoint_that_does_not_answer_is_store_unavailable() -> None:
    store = S3ArchiveStore("bucket", client=_client("http://127.0.0.1:9"), max_attempts=2)
    try:
        with pytest.raises(StoreUnavailable, match="did not answer"):
            store.fetch("sessions/a/s1")
    finally:
        store.close()


def test_the_archive_store_answers_a_readiness_probe_or_says_why_not(s3_endpoint: str, s3_bucket: str) -> None:
    """`ping` is what the archiver's /readyz asks: one HeadBucket without retries, a typed reason when S3 does
    not answer or the bucket is not there."""
    import socket

    store = S3ArchiveStore(s3_bucket, client=_client(s3_endpoint))
    store.ping()
    store.close()
    missing = S3ArchiveStore(s3_bucket + "-absent", client=_client(s3_endpoint))
    with pytest.raises(StoreUnavailable, match="HTTP 404"):
        missing.ping()
    missing.close()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    gone = S3ArchiveStore(s3_bucket, client=_client(f"http://127.0.0.1:{closed}"))
    with pytest.raises(StoreUnavailable, match="did not answer"):
        gone.ping()
    gone.close()
