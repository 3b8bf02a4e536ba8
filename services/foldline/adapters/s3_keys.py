"""The distributed key store: one small S3 object per session key, in a bucket of its own.

Why S3 (docs/ERASURE.md, "Where keys live"): keys are the one thing erasure must be able to destroy and nothing
may lose — a lost key is lost content. S3 is the store the distributed backend already trusts to keep (the
session archive, attachments); Redis is a cache there (flushed, it is rebuilt from Kafka), which a key store must
not be. S3 gives a create-only write (``If-None-Match: *``, so concurrent first appends of a session agree on one
key), strong read-after-write (an erasure is seen by the next read), and a delete that leaves nothing when the
bucket keeps no versions — which is checked when the store is first used (a versioned bucket is refused: a
destroyed key would live on as a noncurrent version).

Objects, under ``prefix`` (default ``keys/``) in ``bucket``::

    sessions/<sha256 hex of the session id>.json    the key record (canonical JSON, below)
    subjects/<subject digest hex>/<session hex>     the sessions of a subject (body: the session id)
    erasures/<erasure id>.json                      erasure records (no content)
    exports/<session hex>/<sha256 hex of host NUL path>.json   export files foldline wrote

A key record is ``{"session", "kid", "createdMs", "material"|"wrapped", "subject"?}`` while the key lives and
``{"session", "kid", "createdMs", "subject"?, "erasure", "erasedMs"}`` once it was destroyed (the object is
overwritten in place). With a key-encryption key (``FOLDLINE_KEY_ENCRYPTION_KEY``) the key is ``wrapped``, so the
bucket alone does not give the keys away. botocore errors are translated here (over :mod:`.s3_errors`).
"""

from __future__ import annotations

import functools
import hashlib
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from botocore.exceptions import BotoCoreError, ClientError

from ..core import codec
from ..errors import ConfigError, FoldlineError, StoreUnavailable
from ..ports.key_store import ErasureRecord, KeyStore, SessionKey, TrackedExport
from .s3_errors import classify, describe_endpoint, status_code
from .sealing import b64url, unb64url, unwrap_key, wrap_key

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

__all__ = ["S3KeyStore"]

_T = TypeVar("_T")


def _hex(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class S3KeyStore(KeyStore):
    """Session keys as S3 objects (see the module docstring), through ``client`` (its retries and timeouts)."""

    def __init__(self, bucket: str, *, client: S3Client, prefix: str = "keys/", kek: bytes | None = None) -> None:
        if not bucket:
            raise ConfigError("the S3 key store needs a bucket (FOLDLINE_KEYS_BUCKET)")
        self.bucket = bucket
        self.prefix = prefix
        self.client = client
        self.where = f"the key store s3://{bucket}/{prefix}"
        self._endpoint = describe_endpoint(client.meta.endpoint_url)
        self._kek = kek
        self._checked = False
        self._lock = threading.Lock()

    # -------------------------------------------------------------- the bucket

    def check_bucket(self) -> None:
        """Create the bucket when it does not exist, and refuse one that keeps object versions."""
        with self._lock:
            if self._checked:
                return
            where = f"s3://{self.bucket}"
            try:
                self.client.head_bucket(Bucket=self.bucket)
            except ClientError as exc:
                if status_code(exc)[0] != 404:
                    raise self._translated(exc, "HeadBucket", where) from exc
                try:
                    self.client.create_bucket(Bucket=self.bucket)
                except ClientError as created:
                    if status_code(created)[1] not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                        raise self._translated(created, "CreateBucket", where) from created
                except BotoCoreError as created:
                    raise self._translated(created, "CreateBucket", where) from created
            except BotoCoreError as exc:
                raise self._translated(exc, "HeadBucket", where) from exc
            try:
                status = self.client.get_bucket_versioning(Bucket=self.bucket).get("Status")
            except ClientError as exc:
                if status_code(exc)[0] not in (404, 501):  # a server without versioning keeps no versions
                    raise self._translated(exc, "GetBucketVersioning", where) from exc
                status = None
            except BotoCoreError as exc:
                raise self._translated(exc, "GetBucketVersioning", where) from exc
            if status in ("Enabled", "Suspended"):
                raise ConfigError(
                    f"the key bucket {where} has object versioning {status.lower()}: a destroyed key would live on "
                    "as a noncurrent version, so erasure could not destroy it; give the keys a bucket that never "
                    "had versioning (FOLDLINE_KEYS_BUCKET)"
                )
            self._checked = True

    def ping(self) -> None:
        self._call("HeadBucket", f"s3://{self.bucket}", lambda: self.client.head_bucket(Bucket=self.bucket))

    def close(self) -> None:
        self.client.close()

    # -------------------------------------------------------------- objects

    def _key_object(self, session_id: str) -> str:
        return f"{self.prefix}sessions/{_hex(session_id)}.json"

    def _get_json(self, key: str) -> dict[str, Any] | None:
        self.check_bucket()
        try:
            body = self.client.get_object(Bucket=self.bucket, Key=key)["Body"]
            try:
                raw = body.read()
            finally:
                body.close()
        except ClientError as exc:
            if status_code(exc)[0] == 404:
                return None
            raise self._translated(exc, "GetObject", f"s3://{self.bucket}/{key}") from exc
        except BotoCoreError as exc:
            raise self._translated(exc, "GetObject", f"s3://{self.bucket}/{key}") from exc
        value = codec.loads(raw)
        if not isinstance(value, dict):
            raise StoreUnavailable(f"{self.where}: {key} is not a key store object; restore it from a copy")
        return value

    def _read_text(self, key: str) -> str:
        where = f"s3://{self.bucket}/{key}"
        try:
            stream = self.client.get_object(Bucket=self.bucket, Key=key)["Body"]
            try:
                return stream.read().decode("utf-8")
            finally:
                stream.close()
        except (ClientError, BotoCoreError) as exc:
            raise self._translated(exc, "GetObject", where) from exc

    def _put(self, key: str, body: bytes, *, create_only: bool = False) -> bool:
        """Write an object; with ``create_only``, False when it already exists (412)."""
        self.check_bucket()
        extra: dict[str, Any] = {"IfNoneMatch": "*"} if create_only else {}
        for attempt in range(5):
            try:
                self.client.put_object(Bucket=self.bucket, Key=key, Body=body, ContentType="application/json", **extra)
                return True
            except ClientError as exc:
                status, code = status_code(exc)
                if create_only and (status == 412 or code == "PreconditionFailed"):
                    return False
                if create_only and (status == 409 or code == "ConditionalRequestConflict") and attempt < 4:
                    continue
                raise self._translated(exc, "PutObject", f"s3://{self.bucket}/{key}") from exc
            except BotoCoreError as exc:
                raise self._translated(exc, "PutObject", f"s3://{self.bucket}/{key}") from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def _delete(self, key: str) -> None:
        self._call(
            "DeleteObject", f"s3://{self.bucket}/{key}", lambda: self.client.delete_object(Bucket=self.bucket, Key=key)
        )

    def _list(self, prefix: str) -> list[str]:
        self.check_bucket()
        keys: list[str] = []
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix}
            if token:
                kwargs["ContinuationToken"] = token
            page = self._call(
                "ListObjectsV2",
                f"s3://{self.bucket}/{prefix}",
                functools.partial(self.client.list_objects_v2, **kwargs),
            )
            keys += [obj["Key"] for obj in page.get("Contents", ())]
            if not page.get("IsTruncated"):
                return keys
            token = page.get("NextContinuationToken")

    def _call(self, op: str, where: str, fn: Callable[[], _T]) -> _T:
        try:
            return fn()
        except (ClientError, BotoCoreError) as exc:
            raise self._translated(exc, op, where) from exc

    def _translated(self, exc: ClientError | BotoCoreError, op: str, where: str) -> FoldlineError:
        fault = classify(exc, op, where)
        if fault.kind in ("denied", "credentials"):
            return ConfigError(
                f"{self.where}: {fault.said}: access denied or no usable credentials — check what boto3's chain "
                "supplies (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, a profile or a role)"
            )
        if fault.kind == "no-bucket":
            return ConfigError(f"{self.where}: {fault.said}; the bucket does not exist (FOLDLINE_KEYS_BUCKET)")
        return StoreUnavailable(
            f"{self.where}: {fault.said} ({fault.name}) at {self._endpoint} after the allowed retries"
        )

    # -------------------------------------------------------------- keys

    def _encode(self, key: SessionKey) -> bytes:
        value: dict[str, Any] = {"session": key.session_id, "kid": key.kid, "createdMs": key.created_ms}
        if key.subject is not None:
            value["subject"] = key.subject
        if key.material is not None:
            if self._kek is not None:
                value["wrapped"] = wrap_key(self._kek, key)
            else:
                value["material"] = b64url(key.material)
        else:
            value["erasure"] = key.erasure
            value["erasedMs"] = key.erased_ms
        return codec.canonical_json(value)

    def _decode(self, value: dict[str, Any], key: str) -> SessionKey:
        try:
            session_id, kid, created = str(value["session"]), str(value["kid"]), int(value["createdMs"])
        except (KeyError, TypeError, ValueError) as exc:
            raise StoreUnavailable(f"{self.where}: {key} is not a key record; restore it from a copy") from exc
        material: bytes | None = None
        if "erasure" not in value:
            if "wrapped" in value:
                if self._kek is None:
                    raise ConfigError(
                        f"{self.where} keeps its data keys wrapped; set FOLDLINE_KEY_ENCRYPTION_KEY to the "
                        "key-encryption key it was written with"
                    )
                material = unwrap_key(self._kek, session_id, kid, str(value["wrapped"]), self.where)
            else:
                material = unb64url(str(value.get("material", "")))
                if material is None or len(material) != 32:
                    raise StoreUnavailable(f"{self.where}: {key} holds a damaged key; restore it from a copy")
        return SessionKey(
            session_id, kid, material, created, value.get("subject"), value.get("erasure"), value.get("erasedMs")
        )

    def create(self, key: SessionKey) -> SessionKey:
        assert key.material is not None
        name = self._key_object(key.session_id)
        if key.subject is not None:  # the index first: a key of a subject is always found by it
            self._put(
                f"{self.prefix}subjects/{key.subject.removeprefix('sha256:')}/{_hex(key.session_id)}",
                key.session_id.encode(),
            )
        if not self._put(name, self._encode(key), create_only=True):
            stored = self.get(key.session_id)
            if stored is None:  # pragma: no cover - deleted between the two requests
                raise StoreUnavailable(f"{self.where}: the key of {key.session_id!r} vanished while it was created")
            return stored
        return key

    def get(self, session_id: str) -> SessionKey | None:
        name = self._key_object(session_id)
        value = self._get_json(name)
        return None if value is None else self._decode(value, name)

    def destroy(self, session_id: str, erasure: str, now_ms: int) -> SessionKey | None:
        key = self.get(session_id)
        if key is None or key.erased:
            return key
        tombstone = key.destroyed(erasure, now_ms)
        self._put(self._key_object(session_id), self._encode(tombstone))  # overwritten in place: no copy is left
        return tombstone

    def sessions_of_subject(self, subject: str) -> list[str]:
        found = []
        for key in self._list(f"{self.prefix}subjects/{subject.removeprefix('sha256:')}/"):
            found.append(self._read_text(key))
        return sorted(found)

    # -------------------------------------------------------------- erasure records, exports

    def put_erasure(self, record: ErasureRecord) -> None:
        self._put(f"{self.prefix}erasures/{record.erasure_id}.json", codec.canonical_json(record.to_json()))

    def erasures(self) -> list[ErasureRecord]:
        records = []
        for key in self._list(f"{self.prefix}erasures/"):
            value = self._get_json(key)
            if value is not None:
                records.append(ErasureRecord.from_json(value))
        return sorted(records, key=lambda r: (r.requested_ms, r.erasure_id))

    def _export_key(self, export: TrackedExport) -> str:
        return f"{self.prefix}exports/{_hex(export.session_id)}/{_hex(export.host + chr(0) + export.path)}.json"

    def track_export(self, export: TrackedExport) -> None:
        self._put(self._export_key(export), codec.canonical_json(export.to_json()))

    def exports(self, session_id: str) -> list[TrackedExport]:
        found = []
        for key in self._list(f"{self.prefix}exports/{_hex(session_id)}/"):
            value = self._get_json(key)
            if value is not None:
                found.append(TrackedExport.from_json(value))
        return sorted(found, key=lambda e: (e.host, e.path))

    def forget_export(self, export: TrackedExport) -> None:
        self._delete(self._export_key(export))
