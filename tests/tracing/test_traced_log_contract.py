"""The traced log (foldline.tracing.TracedEventLog) is an event log like any other: it passes the same contract, with
a tracer that builds spans from every append and every session it hands over as read."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from foldline import tracing
from foldline.adapters.memory_log import MemoryEventLog
from foldline.ports.event_log import EventLog
from tests.contracts.event_log import EventLogContract


class TestTracedEventLog(EventLogContract):
    @pytest.fixture(autouse=True)
    def _tracing(self) -> Iterator[None]:
        made = tracing.configure(
            "foldline-test",
            {"OTEL_TRACES_EXPORTER": "console"},
            processors=[SimpleSpanProcessor(InMemorySpanExporter())],
        )
        assert made is not None
        yield
        made.loop.flush()
        assert made.loop.failures == 0  # every append became spans (or nothing) without an error
        tracing.shutdown()

    def make_log(self) -> EventLog:
        log = tracing.traced_log(MemoryEventLog())
        assert isinstance(log, tracing.TracedEventLog)
        return log
