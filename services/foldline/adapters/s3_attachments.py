"""S3 attachment store: objects under ``<prefix><2 hex>/<64 hex>`` with their metadata as ``x-amz-meta-*``.

Writes are create-only: ``PutObject`` / ``CompleteMultipartUpload`` carry ``If-None-Match: *``, so the first
writer of a digest wins and everyone else gets 412, which means "already stored" (its metadata is then
checked like the filesystem store does). 409 ``ConditionalRequestConflict`` (a concurrent conditional
write in flight) is retried with backoff. Every write carries ``x-amz-checksum-sha256`` (whole object, or
per part for multipart uploads), so the server rejects bytes damaged in transit; every read asks for the
checksum (``ChecksumMode=ENABLED``, validated by botocore for whole-object checksums), compares it with
the digest, and re-hashes the bytes itself. Metadata is read in the same response as the bytes.

Large objects (``put_stream`` / ``get_to`` above ``multipart_threshold``) never sit in memory whole:

* ``put_stream`` spools the stream to an anonymous temporary file while hashing it (the digest is the
  key and is only known at the end), then uploads the file in parts of ``multipart_threshold`` bytes
  and completes the upload conditionally. An object that is already stored is not uploaded again.
* ``get_to`` streams the body into an anonymous temporary file while hashing it and copies it to
  ``out`` only after every check passed: the caller never receives unverified bytes.

botocore/S3 errors are translated here and nowhere else (see ``_translate``, over the classifier shared
with the archive store, :mod:`.s3_errors`). Messages name the
operation, bucket, key, HTTP status and S3 error code, never the server's free-text message, the
endpoint's user info or any credential. Throttling (503 SlowDown, 429) and 5xx/connection errors are
retried by botocore's ``standard`` retry mode (``max_attempts`` in total, exponential backoff with
jitter). See docs/S3.md.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import IO, TYPE_CHECKING, Any, NoReturn, TypeVar

import boto3
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
)

from ..core import codec
from ..core.content import ATTACHMENT_ID_RE, ImageRef
from ..errors import (
    AttachmentCorrupt,
    AttachmentError,
    AttachmentNotFound,
    AttachmentReadFailed,
    ConfigError,
    FoldlineError,
    StoreUnavailable,
)
from ..ports.attachments import AttachmentMeta, AttachmentStore, ByteSink, ByteSource, describe, verify
from .s3_errors import CONFLICT_BACKOFF, classify, describe_endpoint, status_code

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.type_defs import CompletedPartTypeDef

__all__ = ["MIB", "BucketProbe", "S3AttachmentStore", "meta_from_s3", "meta_to_s3", "s3_client"]

MIB = 1024 * 1024
MIN_PART_SIZE = 5 * MIB  # S3's minimum size of every part but the last
CHUNK = 1 * MIB  # read/write granularity of the streaming paths

_META_ID = "attachment-id"
_META_TYPE = "media-type"
_META_BYTES = "bytes"
_META_WIDTH = "width"
_META_HEIGHT = "height"

_T = TypeVar("_T")


def meta_to_s3(m: AttachmentMeta) -> dict[str, str]:
    """Object metadata (sent as ``x-amz-meta-<name>``) recording an attachment's metadata."""
    out = {_META_ID: m.attachment_id, _META_TYPE: m.media_type, _META_BYTES: str(m.bytes)}
    if m.width is not None and m.height is not None:
        out[_META_WIDTH] = str(m.width)
        out[_META_HEIGHT] = str(m.height)
    return out


def meta_from_s3(attachment_id: str, metadata: Mapping[str, str], content_length: int) -> AttachmentMeta:
    """Parse stored object metadata; AttachmentCorrupt when it is missing, malformed or inconsistent."""
    try:
        width = metadata.get(_META_WIDTH)
        height = metadata.get(_META_HEIGHT)
        meta = AttachmentMeta(
            metadata[_META_ID],
            metadata[_META_TYPE],
            int(metadata[_META_BYTES]),
            None if width is None else int(width),
            None if height is None else int(height),
        )
    except (KeyError, ValueError) as exc:
        raise AttachmentCorrupt(
            attachment_id, f"stored object metadata is missing or unreadable ({type(exc).__name__}: {exc})"
        ) from exc
    if meta.attachment_id != attachment_id:
        raise AttachmentCorrupt(attachment_id, f"stored metadata names {meta.attachment_id}")
    if meta.bytes != content_length:
        raise AttachmentCorrupt(
            attachment_id, f"stored metadata says {meta.bytes} bytes, the object has {content_length}"
        )
    return meta


def _b64_sha256(digest: bytes) -> str:
    return base64.b64encode(digest).decode("ascii")


def _id_to_b64(attachment_id: str) -> str:
    return _b64_sha256(bytes.fromhex(attachment_id.removeprefix(codec.DIGEST_PREFIX)))


def s3_client(
    *,
    endpoint_url: str | None,
    region: str | None,
    max_attempts: int,
    connect_timeout_s: float,
    read_timeout_s: float,
    max_connections: int,
) -> S3Client:
    """A boto3 S3 client: ``endpoint_url`` ``None`` = AWS (or ``AWS_ENDPOINT_URL_S3``), ``region`` ``None`` =
    boto3's chain; botocore's ``standard`` retry mode with ``max_attempts`` tries in total; the connect and
    read timeouts; an HTTP pool of ``max_connections``. Credentials come only from boto3's standard chain
    (environment, shared config/credentials files, container/instance roles), never from here."""
    if max_attempts < 1:
        raise ConfigError("max_attempts must be at least 1")
    config = Config(
        retries={"max_attempts": max_attempts, "mode": "standard"},
        connect_timeout=connect_timeout_s,
        read_timeout=read_timeout_s,
        max_pool_connections=max_connections,
    )
    try:
        return boto3.session.Session().client("s3", endpoint_url=endpoint_url, region_name=region, config=config)
    except (BotoCoreError, ValueError) as exc:
        raise ConfigError(
            f"cannot configure an S3 client for endpoint {endpoint_url or 'AWS'} ({type(exc).__name__}); "
            "check FOLDLINE_S3_ENDPOINT and FOLDLINE_S3_REGION"
        ) from exc


#: How long a readiness probe waits for S3 (to connect, then for the answer); it makes one attempt.
PROBE_TIMEOUT_S = 2.0


class BucketProbe:
    """``HeadBucket`` of one bucket for readiness probes: through a client of its own with the store client's
    endpoint and region but one attempt and :data:`PROBE_TIMEOUT_S` (a probe answers quickly; it does not wait
    out an outage as the store's requests do). Made on the first probe, then kept."""

    def __init__(self, client: S3Client, bucket: str) -> None:
        self._of = client
        self.bucket = bucket
        self._lock = threading.Lock()
        self._client: S3Client | None = None

    def __call__(self) -> None:
        """Return if S3 answered that the bucket is there; else StoreUnavailable (ConfigError for missing
        credentials or denied access)."""
        meta = self._of.meta
        with self._lock:
            if self._client is None:
                self._client = s3_client(
                    endpoint_url=meta.endpoint_url,
                    region=meta.region_name,
                    max_attempts=1,
                    connect_timeout_s=PROBE_TIMEOUT_S,
                    read_timeout_s=PROBE_TIMEOUT_S,
                    max_connections=2,
                )
            client = self._client
        try:
            client.head_bucket(Bucket=self.bucket)
        except (ClientError, BotoCoreError) as exc:
            where = describe_endpoint(meta.endpoint_url)
            raise _translate_bucket(exc, "HeadBucket", f"s3://{self.bucket}", where) from exc

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None


class S3AttachmentStore(AttachmentStore):
    """Content-addressed attachments in one S3 bucket (any S3-compatible server), through ``client``
    (:func:`s3_client`; its retry, timeout and endpoint settings are the bounds of every request).

    ``max_attempts`` also bounds the retries of a conditional write that meets a concurrent one (409).
    Processes build the store from their configuration (:func:`foldline.config.factories.attachment_store`).
    """

    def __init__(
        self,
        bucket: str,
        *,
        prefix: str,
        client: S3Client,
        max_attempts: int,
        multipart_threshold: int = 8 * MIB,
        spool_dir: str | None = None,
    ) -> None:
        if not bucket:
            raise ConfigError("S3 attachment store needs a bucket name (FOLDLINE_S3_BUCKET)")
        if multipart_threshold < MIN_PART_SIZE:
            raise ConfigError(f"multipart_threshold must be at least {MIN_PART_SIZE} bytes (S3's minimum part)")
        if max_attempts < 1:
            raise ConfigError("max_attempts must be at least 1")
        self.bucket = bucket
        self.prefix = prefix
        self.multipart_threshold = multipart_threshold
        self.max_attempts = max_attempts
        self.spool_dir = spool_dir
        self.client: S3Client = client
        self._where = describe_endpoint(self.client.meta.endpoint_url)
        self._probe = BucketProbe(client, bucket)

    def ensure_bucket(self) -> bool:
        """Create the bucket when it does not exist (nothing else creates buckets); True if it was created.

        For a fresh local or test server; a production bucket is provisioned with its policies beforehand,
        and the credentials then need no CreateBucket permission as long as the bucket exists.
        """
        where = f"s3://{self.bucket}"
        try:
            self.client.head_bucket(Bucket=self.bucket)
            return False
        except ClientError as exc:
            if status_code(exc)[0] != 404:
                raise _translate_bucket(exc, "HeadBucket", where, self._where) from exc
        except BotoCoreError as exc:
            raise _translate_bucket(exc, "HeadBucket", where, self._where) from exc
        try:
            self.client.create_bucket(Bucket=self.bucket)
        except ClientError as exc:
            if status_code(exc)[1] in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                return False  # another process created it meanwhile
            raise _translate_bucket(exc, "CreateBucket", where, self._where) from exc
        except BotoCoreError as exc:
            raise _translate_bucket(exc, "CreateBucket", where, self._where) from exc
        return True

    def ping(self) -> None:
        self._probe()

    def close(self) -> None:
        self._probe.close()
        self.client.close()

    # -- keys ---------------------------------------------------------------------------------------------

    def key_of(self, attachment_id: str) -> str:
        """The object key of an attachment id; AttachmentNotFound for a malformed id (as the FS store)."""
        if not ATTACHMENT_ID_RE.match(attachment_id):
            raise AttachmentNotFound(attachment_id, "not a valid attachment id ('sha256:' + 64 lowercase hex)")
        hexd = attachment_id.removeprefix(codec.DIGEST_PREFIX)
        return f"{self.prefix}{hexd[:2]}/{hexd}"

    # -- writes -------------------------------------------------------------------------------------------

    def put(
        self, data: bytes, media_type: str, *, width: int | None = None, height: int | None = None
    ) -> AttachmentMeta:
        meta = describe(data, media_type, width, height)
        _check_header_safe(media_type)
        key = self.key_of(meta.attachment_id)
        if len(data) > self.multipart_threshold:
            if self._existing(meta) is not None:
                return self._same_content(meta)
            return self._multipart(meta, key, _parts_of_bytes(data, self.multipart_threshold))
        sha = _id_to_b64(meta.attachment_id)

        def put_once() -> Mapping[str, Any]:
            return self.client.put_object(
                Bucket=self.bucket,
                Key=key,
                Body=data,
                ContentType=media_type,
                Metadata=meta_to_s3(meta),
                ChecksumSHA256=sha,
                IfNoneMatch="*",
            )

        created = self._conditional(meta, "PutObject", key, put_once)
        if created is None:
            return self._same_content(meta)
        self._confirm_write(meta, key, created)
        return meta

    def put_stream(self, stream: ByteSource, media_type: str) -> AttachmentMeta:
        """Store a stream. It is spooled to an anonymous temporary file while hashed (the digest, which is
        the key, is known only at the end); up to the threshold it is then stored with one PUT, above it
        uploaded in parts of ``multipart_threshold`` bytes. At most one part is held in memory; image
        dimensions are read from the first ``CHUNK`` bytes."""
        _check_header_safe(media_type)
        hasher = hashlib.sha256()
        size = 0
        head = b""
        with tempfile.TemporaryFile(dir=self.spool_dir) as spool:
            while chunk := stream.read(CHUNK):
                if len(head) < CHUNK:
                    head += chunk[: CHUNK - len(head)]
                hasher.update(chunk)
                spool.write(chunk)
                size += len(chunk)
            spool.seek(0)
            if size <= self.multipart_threshold:
                return self.put(spool.read(), media_type)
            meta = describe(head, media_type, None, None)
            meta = AttachmentMeta(codec.DIGEST_PREFIX + hasher.hexdigest(), media_type, size, meta.width, meta.height)
            if self._existing(meta) is not None:
                return self._same_content(meta)
            return self._multipart(
                meta, self.key_of(meta.attachment_id), _parts_of_file(spool, self.multipart_threshold)
            )

    def _multipart(self, meta: AttachmentMeta, key: str, parts: Iterator[bytes]) -> AttachmentMeta:
        """Upload ``parts`` as one multipart object, completed with If-None-Match; re-hashes as it sends."""
        aid = meta.attachment_id
        created = self._call(
            aid,
            "CreateMultipartUpload",
            key,
            lambda: self.client.create_multipart_upload(
                Bucket=self.bucket,
                Key=key,
                ContentType=meta.media_type,
                Metadata=meta_to_s3(meta),
                ChecksumAlgorithm="SHA256",
            ),
        )
        upload_id = created["UploadId"]
        completed = False
        result: Mapping[str, Any] | None = None
        try:
            done: list[CompletedPartTypeDef] = []
            hasher = hashlib.sha256()
            composite = hashlib.sha256()  # S3's composite checksum: sha256 of the parts' digests
            number = 0
            for part in parts:  # (not enumerate(): its cached result tuple would keep the previous part alive)
                number += 1  # noqa: SIM113
                hasher.update(part)
                part_digest = hashlib.sha256(part).digest()
                composite.update(part_digest)
                part_sha = _b64_sha256(part_digest)
                upload = functools.partial(
                    self.client.upload_part,
                    Bucket=self.bucket,
                    Key=key,
                    UploadId=upload_id,
                    PartNumber=number,
                    Body=part,
                    ChecksumSHA256=part_sha,
                )
                r = self._call(aid, "UploadPart", key, upload)
                if r.get("ChecksumSHA256", part_sha) != part_sha:
                    raise AttachmentReadFailed(aid, f"UploadPart {number}: the server recorded another checksum")
                done.append({"PartNumber": number, "ETag": r["ETag"], "ChecksumSHA256": part_sha})
                del part, upload  # drop this part before the next one is read: one part in memory at a time
            if codec.DIGEST_PREFIX + hasher.hexdigest() != aid:
                raise AttachmentError(aid, "the spooled bytes changed while uploading; nothing was stored")
            result = self._conditional(
                meta,
                "CompleteMultipartUpload",
                key,
                lambda: self.client.complete_multipart_upload(
                    Bucket=self.bucket,
                    Key=key,
                    UploadId=upload_id,
                    MultipartUpload={"Parts": done},
                    IfNoneMatch="*",
                ),
            )
            completed = result is not None
        finally:
            if not completed:
                with contextlib.suppress(ClientError, BotoCoreError):
                    self.client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)
        if result is None:
            return self._same_content(meta)
        want = f"{_b64_sha256(composite.digest())}-{len(done)}"
        if result.get("ChecksumSHA256", want) != want:
            raise AttachmentCorrupt(aid, "the completed upload's composite SHA-256 is not the one of the parts sent")
        self._confirm_write(meta, key, {})
        return meta

    def _conditional(
        self, meta: AttachmentMeta, op: str, key: str, write: Callable[[], Mapping[str, Any]]
    ) -> Mapping[str, Any] | None:
        """Run a create-only write: its response, or ``None`` when the object already exists (412).
        409 ConditionalRequestConflict is retried with jittered exponential backoff."""
        for attempt in range(1, self.max_attempts + 1):
            try:
                return write()
            except ClientError as exc:
                status, code = status_code(exc)
                if status == 412 or code == "PreconditionFailed":
                    return None
                if (status == 409 or code == "ConditionalRequestConflict") and attempt < self.max_attempts:
                    time.sleep(CONFLICT_BACKOFF.pause(attempt))
                    continue
                self._raise(exc, meta.attachment_id, op, key)
            except BotoCoreError as exc:
                self._raise(exc, meta.attachment_id, op, key)
        raise AssertionError("unreachable")  # pragma: no cover

    def _confirm_write(self, meta: AttachmentMeta, key: str, response: Mapping[str, Any]) -> None:
        """Make sure the stored object is ours. A single PUT whose response echoes our SHA-256 was checked
        by the server; otherwise (multipart, or a server that ignores checksums) read the metadata back."""
        if response.get("ChecksumSHA256") == _id_to_b64(meta.attachment_id):
            return
        stored = self.meta(meta.attachment_id)
        if stored != meta:
            raise AttachmentCorrupt(
                meta.attachment_id, f"after writing, the store holds {_fmt(stored)} instead of {_fmt(meta)}"
            )

    def _existing(self, meta: AttachmentMeta) -> AttachmentMeta | None:
        try:
            return self.meta(meta.attachment_id)
        except AttachmentNotFound:
            return None

    def _same_content(self, meta: AttachmentMeta) -> AttachmentMeta:
        """The object exists already (412 or found before upload): accept it if it is the same content."""
        existing = self.meta(meta.attachment_id)
        if existing.media_type != meta.media_type:
            raise AttachmentError(
                meta.attachment_id,
                f"already stored as {existing.media_type}; the same bytes cannot also be {meta.media_type}",
            )
        if existing != meta:
            raise AttachmentCorrupt(
                meta.attachment_id, f"already stored with metadata {_fmt(existing)}, these bytes are {_fmt(meta)}"
            )
        return existing

    def delete(self, attachment_id: str) -> bool:
        """DeleteObject; in a bucket that keeps versions, every version of the key (a delete marker alone would
        leave the bytes in a noncurrent version)."""
        key = self.key_of(attachment_id)
        existed = self.exists(attachment_id)
        try:
            status = self.client.get_bucket_versioning(Bucket=self.bucket).get("Status")
        except ClientError as exc:
            if status_code(exc)[0] not in (404, 501):  # a server without versioning keeps no versions
                self._raise(exc, attachment_id, "GetBucketVersioning", key)
            status = None
        except BotoCoreError as exc:
            self._raise(exc, attachment_id, "GetBucketVersioning", key)
        if status in ("Enabled", "Suspended"):
            listed = self._call(
                attachment_id,
                "ListObjectVersions",
                key,
                lambda: self.client.list_object_versions(Bucket=self.bucket, Prefix=key),
            )
            for v in [*listed.get("Versions", ()), *listed.get("DeleteMarkers", ())]:
                if v.get("Key") == key:
                    version = v["VersionId"]
                    self._call(
                        attachment_id,
                        "DeleteObject",
                        key,
                        functools.partial(self.client.delete_object, Bucket=self.bucket, Key=key, VersionId=version),
                    )
            return existed
        self._call(attachment_id, "DeleteObject", key, lambda: self.client.delete_object(Bucket=self.bucket, Key=key))
        return existed

    # -- reads --------------------------------------------------------------------------------------------

    def meta(self, attachment_id: str) -> AttachmentMeta:
        key = self.key_of(attachment_id)
        head = self._call(
            attachment_id,
            "HeadObject",
            key,
            lambda: self.client.head_object(Bucket=self.bucket, Key=key, ChecksumMode="ENABLED"),
        )
        _check_stored_checksum(attachment_id, head)
        return meta_from_s3(attachment_id, head["Metadata"], head["ContentLength"])

    def exists(self, attachment_id: str) -> bool:
        try:
            key = self.key_of(attachment_id)
        except AttachmentNotFound:
            return False
        try:
            self.client.head_object(Bucket=self.bucket, Key=key)
        except ClientError as exc:
            if status_code(exc)[0] == 404:
                return False
            self._raise(exc, attachment_id, "HeadObject", key)
        except BotoCoreError as exc:
            self._raise(exc, attachment_id, "HeadObject", key)
        return True

    def get(self, attachment_id: str, expected: AttachmentMeta | ImageRef | None = None) -> bytes:
        key = self.key_of(attachment_id)
        with self._open(attachment_id, key) as (stored, body):
            data = self._call(attachment_id, "GetObject", key, body.read)
        return verify(attachment_id, data, stored, expected)

    def get_to(self, attachment_id: str, out: ByteSink, expected: AttachmentMeta | ImageRef | None = None) -> int:
        """Stream a verified object to ``out``. The body goes to a temporary file first and reaches ``out``
        only after the digest, length and metadata checks passed."""
        key = self.key_of(attachment_id)
        with self._open(attachment_id, key) as (stored, body):
            if stored.bytes <= self.multipart_threshold:
                data = verify(attachment_id, self._call(attachment_id, "GetObject", key, body.read), stored, expected)
                out.write(data)
                return len(data)
            _check_expected(attachment_id, stored, expected)
            with tempfile.TemporaryFile(dir=self.spool_dir) as spool:
                hasher = hashlib.sha256()
                size = 0
                try:
                    for chunk in body.iter_chunks(CHUNK):
                        hasher.update(chunk)
                        spool.write(chunk)
                        size += len(chunk)
                except (ClientError, BotoCoreError) as exc:
                    self._raise(exc, attachment_id, "GetObject", key)
                actual = codec.DIGEST_PREFIX + hasher.hexdigest()
                if actual != attachment_id:
                    raise AttachmentCorrupt(attachment_id, f"stored bytes hash to {actual}; the object is corrupt")
                if size != stored.bytes:
                    raise AttachmentCorrupt(
                        attachment_id, f"stored metadata says {stored.bytes} bytes, object has {size}"
                    )
                spool.seek(0)
                while chunk := spool.read(CHUNK):
                    out.write(chunk)
                return size

    @contextlib.contextmanager
    def _open(self, attachment_id: str, key: str) -> Iterator[tuple[AttachmentMeta, Any]]:
        """GetObject with checksum mode on: the stored metadata (checked) and the open body."""
        resp = self._call(
            attachment_id,
            "GetObject",
            key,
            lambda: self.client.get_object(Bucket=self.bucket, Key=key, ChecksumMode="ENABLED"),
        )
        body = resp["Body"]
        try:
            _check_stored_checksum(attachment_id, resp)
            yield meta_from_s3(attachment_id, resp["Metadata"], resp["ContentLength"]), body
        finally:
            body.close()

    # -- error translation (the one place botocore exceptions become foldline errors) ----------------------

    def _call(self, attachment_id: str, op: str, key: str, fn: Callable[[], _T]) -> _T:
        try:
            return fn()
        except (ClientError, BotoCoreError) as exc:
            self._raise(exc, attachment_id, op, key)

    def _raise(self, exc: ClientError | BotoCoreError, attachment_id: str, op: str, key: str) -> NoReturn:
        raise _translate(exc, attachment_id, op, f"s3://{self.bucket}/{key}", self._where) from exc


def _translate(
    exc: ClientError | BotoCoreError, attachment_id: str, op: str, where: str, endpoint: str
) -> FoldlineError:
    """Map a botocore exception to the foldline error tree. Never quotes the server's message text."""
    fault = classify(exc, op, where)
    said = fault.said
    match fault.kind:
        case "no-bucket" if fault.status == 404:
            return AttachmentReadFailed(
                attachment_id, f"{said}; the bucket does not exist — create it or fix FOLDLINE_S3_BUCKET"
            )
        case "not-found":
            return AttachmentNotFound(attachment_id, f"no object ({said})")
        case "bad-digest":
            return AttachmentCorrupt(attachment_id, f"{said}; the server rejected the bytes' checksum")
        case "denied":
            return AttachmentReadFailed(
                attachment_id,
                f"{said}; access denied — check the credentials and permissions that boto3's configuration "
                "chain supplies (environment, profile, role)",
            )
        case "unavailable":
            return StoreUnavailable(f"attachment {attachment_id}: {said} after the allowed retries ({endpoint})")
        case "checksum":
            return AttachmentCorrupt(attachment_id, f"{said}: the body does not match its stored checksum")
        case "credentials":
            return ConfigError(
                f"attachment {attachment_id}: {said}: no usable AWS credentials ({fault.name}); configure them "
                "through the standard chain (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, a profile or a role)"
            )
        case "unreachable":
            return StoreUnavailable(
                f"attachment {attachment_id}: {said}: S3 endpoint {endpoint} did not answer ({fault.name}) "
                "after the allowed retries; is the server up? (locally: bash deploy/local/up.sh s3)"
            )
        case _:
            return AttachmentReadFailed(
                attachment_id, said if isinstance(exc, ClientError) else f"{said}: {fault.name}"
            )


def _translate_bucket(exc: ClientError | BotoCoreError, op: str, where: str, endpoint: str) -> FoldlineError:
    """A bucket operation's botocore exception as a foldline error (no attachment involved)."""
    fault = classify(exc, op, where)
    if isinstance(exc, ClientError):
        said = f"{op} {where}: HTTP {fault.status} {fault.code}"
        if fault.kind == "denied":
            return ConfigError(
                f"{said}; access denied — check the credentials and permissions that boto3's configuration chain "
                "supplies, or create the bucket beforehand"
            )
        return StoreUnavailable(f"{said} ({endpoint}); check FOLDLINE_S3_ENDPOINT and FOLDLINE_S3_BUCKET")
    if fault.kind == "credentials":
        return ConfigError(
            f"{op} {where}: no usable AWS credentials ({fault.name}); configure them through the standard chain "
            "(AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, a profile or a role)"
        )
    return StoreUnavailable(
        f"{op} {where}: S3 endpoint {endpoint} did not answer ({fault.name}) after the allowed retries; is the server "
        "up? (locally: bash deploy/local/up.sh s3)"
    )


def _check_header_safe(media_type: str) -> None:
    if not (media_type.isascii() and media_type.isprintable()):
        raise AttachmentError("(new)", f"cannot store: media type {media_type!r} is not printable ASCII")


def _check_stored_checksum(attachment_id: str, response: Mapping[str, Any]) -> None:
    """A whole-object SHA-256 the server recorded must be the digest (multipart ones are composite:
    ``<b64>-<parts>``; those objects are covered by our own re-hash)."""
    stored = response.get("ChecksumSHA256")
    if stored and "-" not in stored and stored != _id_to_b64(attachment_id):
        raise AttachmentCorrupt(attachment_id, "the object's stored SHA-256 checksum is not its digest")


def _check_expected(attachment_id: str, stored: AttachmentMeta, expected: AttachmentMeta | ImageRef | None) -> None:
    if expected is None:
        return
    want = AttachmentMeta.of(expected) if isinstance(expected, ImageRef) else expected
    if want != stored:
        raise AttachmentCorrupt(
            attachment_id, f"metadata mismatch: the reference records {_fmt(want)}, the store has {_fmt(stored)}"
        )


def _fmt(m: AttachmentMeta) -> str:
    size = f", {m.width}x{m.height}" if m.width is not None else ""
    return f"{m.media_type}, {m.bytes} bytes{size}"


def _parts_of_bytes(data: bytes, size: int) -> Iterator[bytes]:
    for at in range(0, len(data), size):
        yield data[at : at + size]


def _parts_of_file(f: IO[bytes], size: int) -> Iterator[bytes]:
    while True:
        part = f.read(size)
        if not part:
            return
        yield part
        del part  # before reading the next part, so only one is alive
