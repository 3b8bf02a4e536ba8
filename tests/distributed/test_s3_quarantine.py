"""Issue 7, end to end: an image object corrupted IN S3 stops the request before anything is sent.

The session runs on the distributed stores (real Kafka log, Redis folds fed by a real projector worker,
SeaweedFS S3) with an in-process dispatcher. After a first turn that shows the model an image, the image's
object is overwritten in S3 through boto3 directly (same length and metadata, different bytes). The next
turn — whose request carries the image in its history — must fail with AttachmentCorrupt before the
provider sees anything, log `attachment/quarantine`, and `foldline verify` must report that step as
unreconstructable with the reason.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from foldline.cli.main import app
from foldline.config import Config, FoldsConfig, RedisConfig, S3Config
from foldline.config.factories import attachment_store, fold_store, kafka_log
from foldline.core import CallConfig
from foldline.core.content import ImageBlock, TextBlock
from foldline.core.events import AttachmentQuarantine, RequestDispatch, StepStart, TurnEnd
from foldline.demo import demo_png
from foldline.dispatcher import Dispatcher
from foldline.errors import AttachmentCorrupt
from foldline.loop import Agent, AgentOptions
from foldline.projector import WorkerSettings, start_worker
from foldline.providers.emulated import emulated_provider
from foldline.providers.emulator import Emulator, ToolLoopScript

pytestmark = [pytest.mark.kafka, pytest.mark.redis, pytest.mark.s3]

CONFIG = CallConfig("anthropic", "claude-emulated", max_tokens=256)
SYSTEM = "You look at images and answer briefly. " * 120


def test_an_image_corrupted_in_s3_is_quarantined_before_sending(
    distributed_env: dict[str, str], tmp_path: Path
) -> None:
    names = distributed_env
    bootstrap, redis_url = names["bootstrap"], names["redis"]
    topic, prefix, bucket = names["FOLDLINE_KAFKA_TOPIC"], names["FOLDLINE_FOLD_PREFIX"], names["FOLDLINE_S3_BUCKET"]
    log = kafka_log(Config.from_env())  # the topic the fixture set in the environment
    folds = fold_store(Config(redis=RedisConfig(redis_url), folds=FoldsConfig(prefix)))
    attachments = attachment_store(Config(s3=S3Config(bucket, endpoint=names["s3"])))
    attachments.client.create_bucket(Bucket=bucket)
    log.sessions()  # creates the topics the projector subscribes to
    projector = start_worker(
        WorkerSettings(
            Config().overridden(
                kafka__bootstrap=bootstrap,
                kafka__topic=topic,
                kafka__projector_group=f"{topic}.p",
                redis__url=redis_url,
                folds__prefix=prefix,
            )
        )
    )
    emulator = Emulator(ToolLoopScript(tool_steps=0))
    try:
        projector.wait_ready(60)

        async def run() -> tuple[int, int]:
            dispatcher = Dispatcher(
                folds,
                {"anthropic": emulated_provider(emulator=emulator)},
                attachments=attachments,
                fold_timeout_s=20,
            )
            try:
                options = AgentOptions(CONFIG, system=SYSTEM, dispatcher=dispatcher)
                agent = Agent("q-1", log, emulated_provider(emulator=emulator), options, attachments=attachments)
                meta = attachments.put(demo_png(32, 24, 7), "image/png")
                await agent.run_turn([TextBlock("What does this chart show?"), ImageBlock(meta.image_ref())])
                sent_before = emulator.requests

                # corrupt the object in S3 behind the store's back: same length, same metadata, other bytes
                s3 = attachments.client
                key = attachments.key_of(meta.attachment_id)
                head = s3.head_object(Bucket=bucket, Key=key)
                original = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
                corrupted = original[:-8] + bytes(b ^ 0xFF for b in original[-8:])
                s3.put_object(
                    Bucket=bucket, Key=key, Body=corrupted, Metadata=head["Metadata"], ContentType=head["ContentType"]
                )

                resumed = Agent("q-1", log, emulated_provider(emulator=emulator), options, attachments=attachments)
                with pytest.raises(AttachmentCorrupt, match=meta.attachment_id):
                    await resumed.run_turn("And what changed since last week?")
                return sent_before, emulator.requests
            finally:
                await dispatcher.aclose()

        sent_before, sent_after = asyncio.run(run())
        assert sent_before >= 1
        assert sent_after == sent_before  # the emulator received nothing for the failed step

        events = log.read("q-1")
        quarantined = [(e.seq, e.data) for e in events if isinstance(e.data, AttachmentQuarantine)]
        assert len(quarantined) == 1
        q_seq, q = quarantined[0]
        assert q.failure.startswith("AttachmentCorrupt")
        assert "re-upload" in q.recovery
        step = next(e.data for e in reversed(events[:q_seq]) if isinstance(e.data, StepStart))
        assert isinstance(step, StepStart)
        assert not any(isinstance(e.data, RequestDispatch) for e in events[q_seq:])
        assert isinstance(events[-1].data, TurnEnd)
        assert events[-1].data.reason == "error"
    finally:
        projector.stop()
        folds.close()
        attachments.close()
        log.close()

    res = CliRunner().invoke(app, ["verify", "q-1", "--json", "--backend", "distributed", "--data-dir", str(tmp_path)])
    assert res.exit_code == 3, res.output  # unreconstructable
    report = json.loads(res.stdout)
    assert report["status"] == "unreconstructable"
    assert report["mismatched"] == []
    flagged = {u["seq"]: u for u in report["unreconstructable"]}
    assert flagged[q_seq]["turn"] == step.turn
    assert flagged[q_seq]["step"] == step.step
    reason = flagged[q_seq]["reason"]
    assert reason.startswith("attachment sha256:")
    assert "AttachmentCorrupt" in reason
