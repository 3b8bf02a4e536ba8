"""The distributed pipeline around a set of loops: projector processes, and an in-process or remote dispatcher.

``foldline demo --backend distributed`` runs inside :func:`distributed_pipeline`:

* the S3 bucket of the attachments is created if it does not exist yet (a fresh local server has none);
* ``projectors`` ``foldline projector`` processes join one consumer group on the session-event topic and
  fold it into Redis; the pipeline waits until each prints ``projector ready``;
* ``dispatchers == 0``: loops get one in-process :class:`~foldline.dispatcher.Dispatcher` (shared by every
  session, answering through the provider emulator); ``dispatchers > 0``: that many ``foldline dispatcher``
  processes serve a Redis stream unique to this run and loops get a
  :class:`~foldline.dispatcher.RedisStepClient`.

Child processes inherit the environment (Kafka, Redis, S3 settings) plus the topic, fold prefix, group and
stream of this run; their output goes to ``<data_dir>/logs/``. On exit they get SIGTERM, then SIGKILL
after a grace period.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from ..config import Config, Stores
from ..errors import ConfigError, StoreUnavailable
from ..ports.event_log import EventLog
from ..ports.step_dispatch import StepDispatcher

__all__ = ["Pipeline", "distributed_pipeline", "ensure_bucket"]

_CLI = "from foldline.cli.main import main; main()"


def ensure_bucket(stores: Stores) -> None:
    """Create the S3 attachment bucket when it does not exist (the S3 store itself never creates buckets)."""
    from botocore.exceptions import ClientError

    from ..adapters.s3_attachments import S3AttachmentStore

    store = stores.attachments
    if not isinstance(store, S3AttachmentStore):
        return
    try:
        store.client.head_bucket(Bucket=store.bucket)
    except ClientError as exc:
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if status != 404:
            raise StoreUnavailable(
                f"cannot check S3 bucket {store.bucket!r} (HTTP {status}); "
                "check FOLDLINE_S3_ENDPOINT and the credentials"
            ) from exc
        store.client.create_bucket(Bucket=store.bucket)


@dataclass
class _Child:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    log_file: IO[bytes]

    def output(self) -> str:
        self.log_file.flush()
        return self.log_path.read_text(errors="replace")


@dataclass
class Pipeline:
    """The running pipeline; :meth:`dispatcher_for` gives loops their step dispatcher (the caller closes it)."""

    config: Config
    stores: Stores
    stream: str | None = None  # the Redis stream of remote dispatchers, when there are any
    children: list[_Child] = field(default_factory=list)

    def dispatcher_for(self, log: EventLog) -> StepDispatcher:
        """The dispatcher loops on ``log`` hand their steps to (``log`` may wrap the pipeline's, e.g. metered)."""
        from . import Dispatcher, RedisStepClient

        if self.stream is not None:
            return RedisStepClient(self.config.redis_url, stream=self.stream)
        if self.stores.folds is None:
            raise ConfigError("the distributed pipeline needs a fold store (backend distributed)")
        from ..providers.emulated import emulated_provider
        from ..providers.emulator import Emulator

        emulator = Emulator()
        providers = {
            "anthropic": emulated_provider("anthropic", emulator=emulator),
            "openai": emulated_provider("openai", emulator=emulator),
        }
        return Dispatcher(log, self.stores.folds, providers, attachments=self.stores.attachments)

    def check_children(self) -> None:
        """Raise if a child process has exited (with its output)."""
        for child in self.children:
            if child.process.poll() is not None:
                raise StoreUnavailable(
                    f"{child.name} exited with status {child.process.returncode}; its output:\n{child.output()[-2000:]}"
                )

    def close(self) -> None:
        for child in self.children:
            if child.process.poll() is None:
                child.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 20
        for child in self.children:
            try:
                child.process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.process.kill()
                child.process.wait(5)
            child.log_file.close()
        self.children.clear()


def _spawn(name: str, args: list[str], env: dict[str, str], logs: Path) -> _Child:
    logs.mkdir(parents=True, exist_ok=True)
    path = logs / f"{name}.log"
    out = path.open("wb")
    process = subprocess.Popen(
        [sys.executable, "-c", _CLI, *args], env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
    )
    return _Child(name, process, path, out)


@contextmanager
def distributed_pipeline(
    config: Config,
    stores: Stores,
    *,
    projectors: int = 1,
    dispatchers: int = 0,
    ready_timeout_s: float = 90.0,
) -> Iterator[Pipeline]:
    """Start projector (and dispatcher) processes for ``config``; stop them on exit."""
    if projectors < 1:
        raise ConfigError("the distributed pipeline needs at least one projector process")
    if dispatchers < 0:
        raise ConfigError("dispatchers must be >= 0 (0 = one in-process dispatcher)")
    ensure_bucket(stores)
    stores.log.sessions()  # the Kafka log creates its topics on first use; projectors subscribe to them
    run = uuid.uuid4().hex[:8]
    env = {
        **os.environ,
        "FOLDLINE_BACKEND": "distributed",
        "FOLDLINE_KAFKA_BOOTSTRAP": config.kafka_bootstrap,
        "FOLDLINE_KAFKA_TOPIC": config.kafka_topic,
        "FOLDLINE_REDIS_URL": config.redis_url,
        "FOLDLINE_FOLD_PREFIX": config.fold_prefix,
        "FOLDLINE_S3_BUCKET": config.s3_bucket,
        "FOLDLINE_PROJECTOR_GROUP": os.environ.get("FOLDLINE_PROJECTOR_GROUP", f"{config.kafka_topic}.projectors"),
    }
    pipeline = Pipeline(config, stores)
    logs = config.data_dir / "logs"
    try:
        for i in range(projectors):
            pipeline.children.append(_spawn(f"projector-{i}", ["projector"], env, logs))
        deadline = time.monotonic() + ready_timeout_s
        for child in pipeline.children:
            while "projector ready" not in child.output():
                pipeline.check_children()
                if time.monotonic() > deadline:
                    raise StoreUnavailable(
                        f"{child.name} was not ready within {ready_timeout_s:g}s; its output:\n{child.output()[-2000:]}"
                    )
                time.sleep(0.05)
        if dispatchers:
            pipeline.stream = f"foldline:dispatch:{config.kafka_topic}:{run}"
            for i in range(dispatchers):
                args = ["dispatcher", "--stream", pipeline.stream, "--consumer", f"dispatcher-{i}"]
                pipeline.children.append(_spawn(f"dispatcher-{i}", args, env, logs))
        yield pipeline
        pipeline.check_children()
    finally:
        pipeline.close()
