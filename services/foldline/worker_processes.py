"""The worker processes around the loops of ``foldline demo --backend distributed``.

:func:`worker_processes` starts them and stops them on exit:

* the S3 attachment bucket is created if it does not exist yet (a fresh local server has none);
* ``projectors`` ``foldline projector`` processes join one consumer group on the session-event topic and
  fold it into Redis; it waits until each prints ``projector ready``;
* ``dispatchers == 0``: loops get one in-process :class:`~foldline.dispatcher.Dispatcher` (shared by every
  session, answering through the provider emulator); ``dispatchers > 0``: that many ``foldline dispatcher``
  processes serve a Redis stream unique to this run and loops get a
  :class:`~foldline.dispatcher.RedisStepClient`; the dispatchers share one ``foldline emulator`` process
  (one prompt cache, like one provider account), so a step's cache reads do not depend on which
  dispatcher served it.

Child processes get this process's configuration as their environment (:meth:`Config.to_env`, so an option
given to the demo reaches them too), without the metrics endpoint and the provider URLs (the demo answers
through the emulator), plus the stream of this run; their output goes to ``<data_dir>/logs/``. On exit
they get SIGTERM, then SIGKILL after a grace period.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from .config import Config, Stores
from .config.factories import emulated_providers
from .dispatcher.factory import open_dispatcher, step_client
from .errors import ConfigError, StoreUnavailable
from .ports.step_dispatch import StepDispatcher

__all__ = ["WorkerProcesses", "worker_processes"]

_CLI = "from foldline.cli.main import main; main()"
# settings of this process that its workers must not inherit
_NOT_INHERITED = ("FOLDLINE_METRICS_PORT", "FOLDLINE_METRICS_HOST", "FOLDLINE_ANTHROPIC_URL", "FOLDLINE_OPENAI_URL")


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
class WorkerProcesses:
    """The running workers; :meth:`dispatcher` gives loops their step dispatcher (the caller closes it)."""

    config: Config
    stores: Stores
    stream: str | None = None  # the Redis stream of remote dispatchers, when there are any
    children: list[_Child] = field(default_factory=list)

    def dispatcher(self) -> StepDispatcher:
        """The dispatcher the loops hand their steps to (the caller closes it)."""
        from .tracing import traced_dispatcher

        if self.stream is not None:  # dispatcher processes: their spans join the hand-over's trace there
            return traced_dispatcher(step_client(self.config, stream=self.stream), loop=True, serve=False)
        if self.stores.folds is None:
            raise ConfigError("the demo's workers need a fold store (backend distributed)")
        dispatcher = open_dispatcher(
            self.config, self.stores.folds, self.stores.attachments, providers_by_name=emulated_providers()
        )
        return traced_dispatcher(dispatcher, loop=True, serve=True)

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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _spawn(name: str, args: list[str], env: dict[str, str], logs: Path) -> _Child:
    logs.mkdir(parents=True, exist_ok=True)
    path = logs / f"{name}.log"
    out = path.open("wb")
    process = subprocess.Popen(
        [sys.executable, "-c", _CLI, *args], env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
    )
    return _Child(name, process, path, out)


@contextmanager
def worker_processes(
    config: Config,
    stores: Stores,
    *,
    projectors: int = 1,
    dispatchers: int = 0,
    ready_timeout_s: float = 90.0,
) -> Iterator[WorkerProcesses]:
    """Start projector (and dispatcher) processes for ``config``; stop them on exit."""
    from .adapters.s3_attachments import S3AttachmentStore

    if projectors < 1:
        raise ConfigError("the demo's workers need at least one projector process")
    if dispatchers < 0:
        raise ConfigError("dispatchers must be >= 0 (0 = one in-process dispatcher)")
    if isinstance(stores.attachments, S3AttachmentStore):
        stores.attachments.ensure_bucket()
    stores.log.sessions()  # the Kafka log creates its topics on first use; projectors subscribe to them
    run = uuid.uuid4().hex[:8]
    env = {k: v for k, v in {**os.environ, **config.to_env()}.items() if k not in _NOT_INHERITED}
    env["FOLDLINE_BACKEND"] = "distributed"
    workers = WorkerProcesses(config, stores)
    logs = config.data_dir / "logs"
    try:
        for i in range(projectors):
            workers.children.append(_spawn(f"projector-{i}", ["projector"], env, logs))
        deadline = time.monotonic() + ready_timeout_s
        for child in workers.children:
            while "projector ready" not in child.output():
                workers.check_children()
                if time.monotonic() > deadline:
                    raise StoreUnavailable(
                        f"{child.name} was not ready within {ready_timeout_s:g}s; its output:\n{child.output()[-2000:]}"
                    )
                time.sleep(0.05)
        if dispatchers:
            workers.stream = f"foldline:dispatch:{config.kafka.topic}:{run}"
            port = _free_port()
            emulator = _spawn("emulator", ["emulator", "--port", str(port)], env, logs)
            workers.children.append(emulator)
            while "emulator listening" not in emulator.output():
                workers.check_children()
                if time.monotonic() > deadline:
                    raise StoreUnavailable(f"the emulator did not start within {ready_timeout_s:g}s")
                time.sleep(0.05)
            shared = {
                **env,
                "FOLDLINE_ANTHROPIC_URL": f"http://127.0.0.1:{port}",
                "FOLDLINE_OPENAI_URL": f"http://127.0.0.1:{port}",
            }
            for i in range(dispatchers):
                args = ["dispatcher", "--stream", workers.stream, "--consumer", f"dispatcher-{i}"]
                workers.children.append(_spawn(f"dispatcher-{i}", args, shared, logs))
        yield workers
        workers.check_children()
    finally:
        workers.close()
