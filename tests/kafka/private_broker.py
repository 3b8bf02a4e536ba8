"""A private single-node Apache Kafka (KRaft) that a test may stop and restart.

It runs from the jars ``deploy/local/kafka.sh install`` put under ``.local/kafka/libs`` (the same
Kafka as the shared broker), on free ports, with its data in a directory of the caller's choosing —
never touching the shared broker the other tests use.
"""

from __future__ import annotations

import base64
import os
import shutil
import socket
import subprocess
import time
import uuid
from pathlib import Path
from types import TracebackType

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

__all__ = ["PrivateBroker", "kafka_libs"]

_REPO = Path(__file__).resolve().parents[2]


def kafka_libs() -> Path | None:
    """The broker's jars, or None when ``deploy/local/kafka.sh install`` has not run."""
    libs = Path(os.environ.get("FOLDLINE_LOCAL_DIR", _REPO / ".local")) / "kafka" / "libs"
    return libs if any(libs.glob("kafka_2.13-*.jar")) else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivateBroker:
    """``start()`` / ``stop()`` a broker whose data survives restarts (in ``directory``)."""

    def __init__(self, directory: Path, libs: Path) -> None:
        self.directory = directory
        self.libs = libs
        self.port = _free_port()
        self.controller_port = _free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self._proc: subprocess.Popen[bytes] | None = None
        self._log = directory / "broker.log"
        self._config = directory / "server.properties"
        directory.mkdir(parents=True, exist_ok=True)
        self._config.write_text(
            "\n".join(
                [
                    "process.roles=broker,controller",
                    "node.id=1",
                    f"controller.quorum.voters=1@127.0.0.1:{self.controller_port}",
                    f"listeners=PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
                    f"advertised.listeners=PLAINTEXT://127.0.0.1:{self.port}",
                    "inter.broker.listener.name=PLAINTEXT",
                    "controller.listener.names=CONTROLLER",
                    "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
                    f"log.dirs={directory / 'data'}",
                    "auto.create.topics.enable=false",
                    "offsets.topic.replication.factor=1",
                    "offsets.topic.num.partitions=4",
                    "transaction.state.log.replication.factor=1",
                    "transaction.state.log.min.isr=1",
                    "transaction.state.log.num.partitions=4",
                    "group.initial.rebalance.delay.ms=0",
                    "num.network.threads=2",
                    "num.io.threads=2",
                    "",
                ]
            )
        )
        (directory / "log4j.properties").write_text(
            "log4j.rootLogger=WARN, stdout\n"
            "log4j.appender.stdout=org.apache.log4j.ConsoleAppender\n"
            "log4j.appender.stdout.layout=org.apache.log4j.PatternLayout\n"
            "log4j.appender.stdout.layout.ConversionPattern=[%d] %p %m (%c)%n\n"
        )

    def _java(self, *args: str) -> list[str]:
        java = shutil.which("java")
        if java is None:
            raise RuntimeError("java is not installed (deploy/local/kafka.sh install installs it)")
        return [
            java,
            "-Xmx256m",
            "-Xms256m",
            "-XX:+UseSerialGC",
            "-Djava.awt.headless=true",
            f"-Dlog4j.configuration=file:{self.directory / 'log4j.properties'}",
            "-cp",
            f"{self.libs}/*",
            *args,
        ]

    def start(self, timeout_s: float = 60.0) -> float:
        """Start (formatting the storage the first time); returns the seconds until metadata answered."""
        started = time.monotonic()
        if not (self.directory / "data" / "meta.properties").exists():
            formatted = subprocess.run(
                self._java("kafka.tools.StorageTool", "format", "-t", _cluster_id(), "-c", str(self._config)),
                check=False,
                capture_output=True,
                text=True,
            )
            if formatted.returncode != 0:
                raise RuntimeError(
                    f"formatting the private broker's storage failed (exit {formatted.returncode}): "
                    f"{(formatted.stdout + formatted.stderr).strip()[-2000:]}"
                )
        with self._log.open("ab") as log:
            self._proc = subprocess.Popen(
                self._java("kafka.Kafka", str(self._config)), stdout=log, stderr=subprocess.STDOUT
            )
        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})
        while time.monotonic() - started < timeout_s:
            if self._proc.poll() is not None:
                raise RuntimeError(f"the private broker exited; see {self._log}")
            try:
                if admin.list_topics(timeout=1).brokers:
                    return time.monotonic() - started
            except KafkaException:  # not up yet
                time.sleep(0.2)
        raise RuntimeError(f"the private broker did not answer within {timeout_s:g}s; see {self._log}")

    def stop(self) -> None:
        """Kill the broker (SIGKILL: an abrupt loss, as a crash or a network cut looks to clients)."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(30)
        self._proc = None

    def __enter__(self) -> PrivateBroker:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _cluster_id() -> str:
    """A random KRaft cluster id (a uuid, URL-safe base64) that does not start with "-": the storage tool
    would read that as an option, as Kafka's own ``Uuid.randomUuid`` knows (it never returns one)."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id
