"""The projector as a faust-streaming app: one consumer group, one agent, manual acks after the apply.

``foldline projector --runtime faust`` runs :class:`FaustProjector`; the default runtime is the
confluent-kafka worker (:mod:`.confluent_runtime`). Both derive from :class:`~.runtime.ProjectorRuntime`
(the apply-retry loop, readiness, lag, the one dead-letter path), fold through the same
:class:`~.fold_apply.BatchProjector` and check records with the same
:class:`~foldline.adapters.kafka.RecordChecker`, so a topic folded by either runtime gives the same folds
and the same dead-letter records.

How this runtime avoids faust's known defects (docs/PROJECTOR.md, "The runtimes"):

* **read_committed outside exactly-once mode.** faust creates its aiokafka consumer with
  ``isolation_level="read_committed"`` only when the app runs with ``processing_guarantee="exactly_once"``.
  The app here uses a transport whose consumer thread builds faust's own worker consumer and then sets
  its isolation level to ``read_committed`` before it starts (aiokafka hands it to its fetcher on
  ``start()``), so records of aborted or fenced transactions never reach the agent.
* **offsets acked past unfinished messages (concurrency > 1, faust issue #606).** One agent with
  ``concurrency=1``; a partition is owned by one group member and its events reach the agent in order,
  and every event is acked in order, after its batch applied. faust commits the highest contiguous
  acked offset, so nothing unapplied can be committed.
* **take()/take_events() ack a batch in a finally block, even when processing raised.** The agent reads
  batches with ``Stream.noack_take`` (it yields the events and never acks them) and acks each event with
  ``Stream.ack`` only after :meth:`BatchProjector.project` returned. When the apply raises anything but
  :class:`~foldline.errors.StoreUnavailable`, nothing of the batch is acked, the agent stops taking
  events (a restarted agent would ack events past the failed batch) and the worker shuts down with the
  error: the process exits non-zero and the group redelivers from the last commit. A fold-store outage
  (``StoreUnavailable``) keeps the batch and retries it with backoff, not ready meanwhile (the base's
  loop, as for the confluent worker). ``stream_wait_empty`` is off, so neither a rebalance nor the shutdown waits
  for the acks of a batch that will never be acked.
* **commits crawl on a transactional topic.** faust marks the offsets a read_committed consumer never
  delivers (transaction markers, aborted records) as committable, but through the offset of the next
  delivered record; its commit then stalls at that duplicate and advances one transaction per commit
  interval. :class:`ReadCommittedConsumer` ends each hole before the delivered record.

Delivery is at least once and the apply is idempotent (fenced by seq and epoch in the store), so events
redelivered after a crash or a rebalance are skipped as duplicates.

The app runs under faust's worker on the process's main thread (it installs the SIGTERM/SIGINT
handlers): this runtime is a process, not a thread (:func:`~.confluent_runtime.start_worker` is the
in-process one).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import tempfile
from collections.abc import Iterable, Sequence
from typing import Any, Unpack

import faust
from faust.transport.drivers import aiokafka as faust_aiokafka

from ..adapters.kafka import RecordChecker, consumed_record
from ..adapters.kafka.records import MAX_MESSAGE_BYTES
from ..config.factories import aiokafka_credentials
from ..errors import ConfigError, FoldlineError, StoreUnavailable
from .fold_apply import BatchReport
from .runtime import ProjectorRuntime, RuntimeOptions, WorkerSettings

__all__ = ["READ_COMMITTED", "FaustProjector", "projector_app"]

_LOG = logging.getLogger("foldline.projector")
READ_COMMITTED = "read_committed"
AGENT_NAME = "foldline-projector-fold"
BATCH_WITHIN_S = 0.05  # a partial batch is applied after this long without filling up


# ------------------------------------------------------------------ faust app with a read_committed consumer


class ReadCommittedConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    """faust's aiokafka consumer thread, but the group consumer reads committed records only."""

    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        current = getattr(consumer, "_isolation_level", None)
        if current not in ("read_uncommitted", READ_COMMITTED):
            raise ConfigError(
                f"aiokafka's consumer no longer keeps its isolation level where faust's projector sets it "
                f"(found {current!r}); pin aiokafka to a version the faust runtime supports or use --runtime confluent"
            )
        # aiokafka passes this to its Fetcher in start(), which has not run yet
        consumer._isolation_level = READ_COMMITTED
        return consumer


class ReadCommittedConsumer(faust_aiokafka.Consumer):
    def _new_consumer_thread(self) -> ReadCommittedConsumerThread:
        return ReadCommittedConsumerThread(self, loop=self.loop, beacon=self.beacon)

    async def _add_gap(self, tp: Any, offset_from: int, offset_to: int) -> None:
        """Record offsets that were never delivered (transaction markers, aborted records) as committable.

        faust's fetch loop calls this with ``offset_to`` = the offset of the record delivered after the
        hole, and stores the range inclusively, so that record's offset also lands in the gap set. Its
        commit then finds that offset twice (acked and gap), stops its contiguous run there, and advances
        by one transaction per commit interval; a restart redelivers nearly everything. The hole ends
        before the delivered record.
        """
        await super()._add_gap(tp, offset_from, offset_to - 1)


class ReadCommittedTransport(faust_aiokafka.Transport):
    Consumer = ReadCommittedConsumer


class _ProjectorApp(faust.App):
    def _new_transport(self) -> Any:
        return ReadCommittedTransport(self.conf.broker_consumer, self)


def projector_app(settings: WorkerSettings, datadir: str, *, vanilla: bool = False) -> faust.App:
    """The faust app of a projector: consumer group ``settings.group``, no web server, no tables.

    ``vanilla=True`` builds the same app on faust's stock transport (which reads uncommitted records
    outside exactly-once mode); tests use it to show what the read_committed transport prevents.
    """
    cls = faust.App if vanilla else _ProjectorApp
    return cls(
        settings.group,  # faust's app id is the consumer group id
        broker=[f"kafka://{host.strip()}" for host in settings.bootstrap.split(",") if host.strip()],
        # the security settings of every librdkafka client, as aiokafka's SASL credentials / TLS context
        broker_credentials=aiokafka_credentials(settings.config.kafka),
        autodiscover=False,
        web_enabled=False,
        datadir=datadir,
        key_serializer="raw",
        value_serializer="raw",
        processing_guarantee="at_least_once",
        topic_allow_declare=False,  # the event log creates its topics
        topic_disable_leader=True,  # no <group>-__assignor-__leader topic
        table_standby_replicas=0,
        topic_partitions=settings.partitions,
        consumer_auto_offset_reset="earliest",
        # a whole record of the largest size the topics take, per partition (faust's default: 1 MiB)
        consumer_max_fetch_size=MAX_MESSAGE_BYTES,
        producer_max_request_size=MAX_MESSAGE_BYTES,
        broker_max_poll_records=settings.max_batch,
        stream_buffer_maxsize=max(4096, 2 * settings.max_batch),
        # Do not wait at a rebalance or at shutdown for every delivered event to be acked: events are
        # acked only after their batch applied, and a failed batch is never acked (it is redelivered).
        stream_wait_empty=False,
        broker_session_timeout=6.0,  # as the confluent worker: a killed member leaves the group within 6 s
        broker_heartbeat_interval=1.0,
        # faust commits on a timer: 0 (after every batch) becomes its shortest useful period
        broker_commit_interval=max(0.05, settings.commit_interval_s),
        worker_redirect_stdouts=False,
    )


# ------------------------------------------------------------------ the runtime


class FaustProjector(ProjectorRuntime):
    """One projector process on faust; see the module docstring and :class:`~.runtime.ProjectorRuntime` for
    the arguments. :meth:`run` blocks until SIGTERM/SIGINT."""

    runtime_name = "faust"

    def __init__(
        self,
        settings: WorkerSettings,
        *,
        batch_within_s: float = BATCH_WITHIN_S,
        **options: Unpack[RuntimeOptions[FaustProjector]],
    ) -> None:
        super().__init__(settings, **options)
        self._within = batch_within_s
        self._worker: Any = None
        self._stop_requested = False
        self._abandoned = False
        self._in_batch = False
        # per partition: (end offset, fetch position, last applied offset) at the previous lag sample
        self._lag_probe: dict[int, tuple[int, int, int]] = {}
        self._checker = RecordChecker(
            self.dead_letters, topic=settings.topic, registry_url=settings.registry_url, log=self.log
        )

    # ---------------------------------------------------------------- process lifecycle

    def run(self) -> BatchReport:
        """Run faust's worker until SIGTERM/SIGINT; raise the failure that stopped it, if one did."""
        self._wait_for_topic()
        with tempfile.TemporaryDirectory(prefix="foldline-faust-") as datadir:
            app = projector_app(self.settings, datadir)
            self._install(app)
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            self._start_metrics_server()
            worker = faust.Worker(
                app,
                loop=loop,
                quiet=True,
                redirect_stdouts=False,
                override_logging=False,  # keep the process's logging setup
                workdir=datadir,
            )
            worker.spinner = None  # its terminal codes would land on stdout, before the "projector ready" line
            self._worker = worker
            status: object = 0
            try:
                worker.execute_from_commandline()
            except SystemExit as exc:  # faust's worker always leaves through sys.exit
                status = exc.code
            finally:
                self._checker.close()
                self._shutdown()
        if self.failure is not None:
            raise self.failure
        if status not in (0, None):
            raise StoreUnavailable(
                f"the faust projector worker exited with status {status}; see the log above for the cause"
            )
        return self.totals

    def _install(self, app: faust.App) -> None:
        s = self.settings
        topic = app.topic(s.topic, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw")

        async def fold(stream: Any) -> None:
            async for events in stream.noack_take(s.max_batch, within=self._within):
                await self._apply_batch(stream, events)

        app.agent(topic, name=AGENT_NAME, concurrency=1)(fold)
        app.on_partitions_assigned.connect(self._on_assigned)
        app.on_partitions_revoked.connect(self._on_revoked)
        app.timer(1.0, name="foldline-projector-lag")(self._update_lag)
        app.timer(1.0, name="foldline-projector-marks")(self._check_marks_async)

    async def _on_assigned(self, _sender: Any, /, *args: Any, signal: Any, **_kwargs: Any) -> None:
        assigned: Iterable[Any] = args[0] if args else ()
        parts = {tp.partition for tp in assigned if tp.topic == self.settings.topic}
        ok = await asyncio.to_thread(self._store_answers)
        self._partitions_assigned(parts, store_ok=ok)
        # before the agent applies anything of them: judged by what the group committed before
        await asyncio.to_thread(self._check_marks)

    async def _on_revoked(self, _sender: Any, /, *args: Any, signal: Any, **_kwargs: Any) -> None:
        revoked: Iterable[Any] = args[0] if args else ()
        gone = {tp.partition for tp in revoked if tp.topic == self.settings.topic}
        for part in gone:
            self._lag_probe.pop(part, None)
        self._forget_partitions(gone)

    def _store_answers(self) -> bool:
        ping = getattr(self.store, "ping", None)
        if ping is None:
            return True
        try:
            return bool(ping())
        except FoldlineError:
            return False

    # ---------------------------------------------------------------- one batch

    async def _apply_batch(self, stream: Any, events: Sequence[Any]) -> None:
        if self.failure is not None or self._abandoned:
            # A batch before this one was not applied (the agent was restarted after a failure or a
            # cancellation): acking this one would let faust commit past the unapplied events.
            await self._fail(
                self.failure or StoreUnavailable("a batch was abandoned unapplied; restart from the committed offsets"),
                len(events),
            )
        records = [consumed_record(ev.message) for ev in events]
        self._in_batch = True
        try:
            items = await asyncio.to_thread(self._checker.check, records)
            report = await self._apply_until_done_async(items)
        except asyncio.CancelledError:
            self._abandoned = True  # shutdown (or a restart): nothing of this batch is acked
            raise
        except BaseException as exc:
            await self._fail(exc, len(events))
            return
        # Only now: every event of the batch is in the store (or dead-lettered). In order, so faust's
        # commit (the highest contiguous acked offset per partition) never passes an unapplied event.
        for ev in events:
            await stream.ack(ev)
        self._in_batch = False  # (a failed batch leaves it set: the worker is stopping)
        self._observe(items, report)

    async def _fail(self, exc: BaseException, size: int) -> None:
        """Stop the worker with ``exc``; this agent takes (and acks) nothing more."""
        if self.failure is None:
            self.failure = exc
        _LOG.error(
            "applying a batch of %d records failed (%s: %s); none of it is acknowledged, stopping the projector",
            size,
            type(exc).__name__,
            exc,
        )
        if not self._stop_requested:
            self._stop_requested = True
            # faust's worker stops on SIGTERM (its own handler): the same clean shutdown as `kill -TERM`
            signal.raise_signal(signal.SIGTERM)
        # Park instead of raising: faust's supervisor would restart a crashed agent, which would then
        # ack events past the failed batch. The worker's stop cancels this wait.
        await asyncio.Event().wait()

    async def _check_marks_async(self, app: Any = None) -> None:
        """The base's partition-mark check (a lost fold store re-reads its partitions), off the event loop."""
        await asyncio.to_thread(self._check_marks)

    async def _update_lag(self, app: Any = None) -> None:
        if self.metrics is None or self._worker is None:
            return
        consumer = self._worker.app.consumer
        for part in self.assigned_partitions():
            tp = faust.types.TP(self.settings.topic, part)
            try:
                high = consumer.highwater(tp)
            except Exception as exc:  # not fetched yet, or the partition just moved
                _LOG.debug("lag of partition %d unknown: %s", part, exc)
                continue
            if high is None:
                continue
            done = self._last_offsets.get(part)
            position: int | None = None
            if done is not None and int(high) > done + 1:
                # On this transactional topic the offsets past the last applied event of a caught-up
                # partition are commit markers (one per writer whose transaction ended last, so several when
                # writers interleave) and aborted records; the fetch position has passed them. Further behind,
                # faust's fetch position runs ahead of what was applied (records wait in its buffers), so the
                # position counts only when the agent holds no batch and nothing moved for a whole sample:
                # a buffered record would have been taken within the batch window (BATCH_WITHIN_S) by then.
                fetched = await consumer.position(tp)
                probe = (int(high), int(fetched), done) if fetched is not None else None
                if probe is not None and probe[1] >= probe[0]:
                    settled = not self._in_batch and self._lag_probe.get(part) == probe
                    if settled or probe[0] - (done + 1) == 1:
                        position = probe[1]
                    self._lag_probe[part] = probe
                else:
                    self._lag_probe.pop(part, None)
            self._publish_lag(part, int(high), position)
