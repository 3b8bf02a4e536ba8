"""The S3 tests run against the real local SeaweedFS server (deploy/local/s3.sh), never a mock.

``make test`` starts it and sources ``.local/env.sh``; running these tests without it is a failure, not
a skip, so a broken server setup cannot pass silently.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING

import boto3
import pytest
from botocore.config import Config

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client


@pytest.fixture(scope="session")
def s3_endpoint() -> str:
    endpoint = os.environ.get("FOLDLINE_S3_ENDPOINT")
    if not endpoint:
        pytest.fail(
            "FOLDLINE_S3_ENDPOINT is unset: start the local S3 server with `bash deploy/local/up.sh s3` and "
            "`source .local/env.sh` (make test does both), then rerun"
        )
    return endpoint


@pytest.fixture(scope="session")
def s3_admin(s3_endpoint: str) -> Iterator[S3Client]:
    """A plain boto3 client (bypasses the adapter) for setup, inspection and tampering."""
    client = boto3.session.Session().client(
        "s3", endpoint_url=s3_endpoint, config=Config(retries={"max_attempts": 3, "mode": "standard"})
    )
    yield client
    client.close()


@pytest.fixture(scope="session")
def s3_bucket(s3_admin: S3Client) -> Iterator[str]:
    """A bucket unique to this test session, emptied and deleted afterwards."""
    bucket = f"foldline-test-{uuid.uuid4().hex[:12]}"
    s3_admin.create_bucket(Bucket=bucket)
    yield bucket
    for page in s3_admin.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for obj in page.get("Contents", []):
            s3_admin.delete_object(Bucket=bucket, Key=obj["Key"])
    for up in s3_admin.list_multipart_uploads(Bucket=bucket).get("Uploads", []):
        s3_admin.abort_multipart_upload(Bucket=bucket, Key=up["Key"], UploadId=up["UploadId"])
    s3_admin.delete_bucket(Bucket=bucket)
