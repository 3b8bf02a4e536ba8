"""The console on the distributed backend: sessions a distributed demo wrote to Kafka, their images in S3 and
their Redis folds, read through the console's app the way ``foldline console --backend distributed`` reads them."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
from starlette.testclient import TestClient
from typer.testing import CliRunner

from foldline.cli.main import app
from foldline.config import Config, open_stores
from foldline.config.prices import load_price_table
from foldline.console.app import create_app
from foldline.console.data import ConsoleData

pytestmark = [pytest.mark.kafka, pytest.mark.redis, pytest.mark.s3]


def test_the_console_reads_kafka_s3_and_the_redis_folds(distributed_env: dict[str, str], tmp_path: Path) -> None:
    runner = CliRunner()
    args = ["--backend", "distributed", "--data-dir", str(tmp_path)]
    res = runner.invoke(app, ["demo", "--sessions", "2", "--steps", "4", "--json", *args])
    assert res.exit_code == 0, res.output
    ids = [s["id"] for s in json.loads(res.stdout)["sessions"]]
    config = dataclasses.replace(Config.from_env(), backend="distributed", data_dir=tmp_path)
    data = ConsoleData(open_stores(config, read_only=True), load_price_table(config.prices), min_refresh_s=0.0)
    try:
        assert set(ids) <= set(data.stores.log.heads())
        with TestClient(create_app(data), base_url="http://127.0.0.1") as c:
            listed = c.get("/sessions").text
            for sid in ids:
                assert f'data-session="{sid}"' in listed
            page = c.get("/session", params={"id": "demo-001"})
            assert page.status_code == 200
            assert 'id="fold"' in page.text  # the Redis fold, reported as a cache
            assert "verify-verified" in c.get("/session/verify", params={"id": "demo-001"}).text
            step = c.get("/session/step", params={"id": "demo-001", "turn": 0, "step": 0}).text
            image = re.search(r'src="(/session/image\?[^"]+)"', step)
            assert image is not None
            served = c.get(image.group(1).replace("&amp;", "&"))  # from the S3 attachment store
            assert served.status_code == 200
            assert served.headers["content-type"].startswith("image/")
            assert c.get("/fleet").status_code == 200
    finally:
        data.close()
