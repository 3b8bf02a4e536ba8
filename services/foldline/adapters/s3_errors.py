"""What a botocore exception says about an S3 request: one classifier for every S3 adapter.

:func:`classify` sorts a ``ClientError`` or ``BotoCoreError`` into a :class:`S3Fault` — the bucket is
missing, the object is, the server refused the bytes' checksum, access was denied, the service is
unavailable or throttling, the body failed its stored checksum, there are no credentials, the endpoint
did not answer — with the words every message starts from: the operation, ``s3://bucket/key``, the HTTP
status, the S3 error code and the request id, never a credential or the server's own text. Each store
(:mod:`.s3_attachments`, :mod:`.s3_archive`) turns a fault into its own error of the foldline tree, so
the translation stays where the vendor is called.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    FlexibleChecksumError,
    NoCredentialsError,
    PartialCredentialsError,
    ReadTimeoutError,
)
from botocore.exceptions import (
    ConnectionError as BotoConnectionError,
)

from ..backoff import Backoff
from ..ports.archive import MAX_BACKOFF_S

__all__ = [
    "CONFLICT_BACKOFF",
    "DIGEST_CODES",
    "UNAVAILABLE_BACKOFF",
    "FaultKind",
    "S3Fault",
    "classify",
    "describe_endpoint",
    "status_code",
]

#: A conditional write answered 409 ConditionalRequestConflict (another write of the key in flight): tried
#: again after a random pause of up to 100 ms, doubling to 2 s.
CONFLICT_BACKOFF = Backoff(initial_s=0.1, cap_s=2.0, jitter=1.0)
#: botocore's standard retry delay, for requests sent without botocore's retries: a random pause of up to
#: 2**attempt s, at most 20 s (the bound an archive's grace period is checked against, ``MAX_BACKOFF_S``).
UNAVAILABLE_BACKOFF = Backoff(initial_s=2.0, cap_s=MAX_BACKOFF_S, jitter=1.0)

FaultKind = Literal[
    "no-bucket",  # NoSuchBucket
    "not-found",  # 404 / NoSuchKey / NotFound
    "bad-digest",  # the server rejected the checksum the request carried
    "denied",  # 401 / 403
    "unavailable",  # 5xx or 429, after botocore's retries
    "checksum",  # the body received does not match the checksum the server keeps
    "credentials",  # no usable credentials in boto3's chain
    "unreachable",  # the endpoint did not answer (connection refused, read timeout)
    "other",
]
DIGEST_CODES = frozenset({"BadDigest", "InvalidDigest", "XAmzContentSHA256Mismatch"})


@dataclass(frozen=True, slots=True)
class S3Fault:
    """A classified botocore exception. ``said``: ``"<op> <where>: HTTP <status> <code> (request id <id>)"``
    for an answer from the server, ``"<op> <where>"`` otherwise; ``name``: the exception's type name."""

    kind: FaultKind
    status: int
    code: str
    said: str
    name: str


def status_code(exc: ClientError) -> tuple[int, str]:
    """The HTTP status and the S3 error code of an answer (``0`` and ``"?"`` where they are missing)."""
    status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))
    code = str(exc.response.get("Error", {}).get("Code", "?"))
    return status, code


def describe_endpoint(url: str) -> str:
    """scheme://host[:port] of an endpoint — never its user info or query."""
    parts = urlsplit(url)
    host = parts.hostname or "?"
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}"


def classify(exc: ClientError | BotoCoreError, op: str, where: str) -> S3Fault:
    """What ``exc``, raised by operation ``op`` on ``where`` (``s3://bucket/key``), says."""
    name = type(exc).__name__
    if isinstance(exc, ClientError):
        status, code = status_code(exc)
        request_id = exc.response.get("ResponseMetadata", {}).get("RequestId") or "-"
        said = f"{op} {where}: HTTP {status} {code} (request id {request_id})"
        kind: FaultKind
        if code == "NoSuchBucket":
            kind = "no-bucket"
        elif status == 404 or code in ("NoSuchKey", "NotFound"):
            kind = "not-found"
        elif code in DIGEST_CODES:
            kind = "bad-digest"
        elif status in (401, 403):
            kind = "denied"
        elif status >= 500 or status == 429:
            kind = "unavailable"
        else:
            kind = "other"
        return S3Fault(kind, status, code, said, name)
    if isinstance(exc, FlexibleChecksumError):
        kind = "checksum"
    elif isinstance(exc, (NoCredentialsError, PartialCredentialsError)):
        kind = "credentials"
    elif isinstance(exc, (BotoConnectionError, ReadTimeoutError)):
        kind = "unreachable"
    else:
        kind = "other"
    return S3Fault(kind, 0, "", f"{op} {where}", name)
