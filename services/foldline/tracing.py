"""OpenTelemetry traces of foldline's work, following the GenAI semantic conventions of OpenTelemetry semantic
conventions **v1.40.0** (:data:`SEMCONV_VERSION`; the last release that holds the GenAI conventions before they moved
to a repository of their own). README "Tracing" and docs/TRACING.md describe what is traced.

Configured by the standard variables only. Tracing is **on** when ``OTEL_TRACES_EXPORTER`` names an exporter —
``otlp`` (protocol from ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` / ``OTEL_EXPORTER_OTLP_PROTOCOL``: ``http/protobuf``,
the default, or ``grpc``) or ``console``, comma-separated for several — and **off** otherwise or when
``OTEL_SDK_DISABLED`` is ``true`` (then nothing here is imported or called: no log is wrapped, no dispatcher
either). Endpoint, headers, timeouts and TLS come from the ``OTEL_EXPORTER_OTLP_*`` variables (the exporters read
them), the service name from ``OTEL_SERVICE_NAME`` or ``OTEL_RESOURCE_ATTRIBUTES`` (default: ``foldline-<command>``),
sampling from ``OTEL_TRACES_SAMPLER``, the batch processor's limits from ``OTEL_BSP_*`` and the propagator from
``OTEL_PROPAGATORS``. Message content is never put on
a span unless ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` is ``true``; then as the conventions' opt-in
attributes (``gen_ai.input.messages``, ``gen_ai.output.messages``, ``gen_ai.system_instructions``,
``gen_ai.tool.call.arguments`` / ``result``), JSON text in the conventions' message schema.

What becomes a span, each derived from the log — the loop is observed through its appends (an
:class:`~foldline.adapters.metered_log.AppendObserver`), nothing in the loop calls this module:

* ``invoke_agent`` (INTERNAL) — one turn, ``turn/start`` to ``turn/end``;
* ``chat {model}`` (CLIENT) — one step's model call, ``step/start`` to its ``assistant/message``: provider, model,
  conversation id (the session id), response id, finish reasons, usage (input tokens *with* the cache tokens, cache
  reads, cache writes, output), and ``foldline.*`` attributes: the dispatch seq, the request digest and size, the
  header reason, the drop cause and the step's cost (:mod:`foldline.core.cost`);
* ``execute_tool {name}`` (INTERNAL) — one tool call, its ``tool/call`` to its ``tool/result``;
* on the distributed backend, ``foldline.dispatch.prepare`` and ``foldline.dispatch.send`` in the dispatcher, children
  of the loop's ``chat`` span: the loop puts the span's context (W3C ``traceparent``) in the step's hand-over (the
  hand-over comes before the step's events are logged: it opens the turn's and step's spans, which the logged events
  then take as theirs — :meth:`LoopTracer.step_context`);
* ``foldline.projector.apply`` — one batch a projector applied to the fold store.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import orjson

from .adapters.metered_log import MeteredEventLog
from .core.content import (
    ContentBlock,
    EncryptedReasoningBlock,
    ImageBlock,
    ReasoningBlock,
    RedactedReasoningBlock,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
)
from .core.cost import PriceTable, drop_key, price_step
from .core.deltas import AnswerDelta
from .core.drops import DropTracker, StepVerdict
from .core.events import (
    AssistantMessage,
    CompactionEnd,
    CompactionStart,
    Envelope,
    LlmRetry,
    RequestDispatch,
    RequestHeader,
    StepEnd,
    StepStart,
    ToolCall,
    ToolResult,
    TurnEnd,
    TurnStart,
)
from .core.header import EpochHeader
from .core.projection import Message, Session
from .core.usage import normalize_usage
from .errors import ConfigError, MissingExtra
from .ports.event_log import EventLog, WriterLease
from .ports.step_dispatch import PreparedStep, StepAnswer, StepDispatcher, StepHandoff

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

__all__ = [
    "CAPTURE_CONTENT_VARIABLE",
    "SEMCONV_VERSION",
    "LoopTracer",
    "TracedStepDispatcher",
    "TracedEventLog",
    "Tracing",
    "configure",
    "current",
    "enabled",
    "shutdown",
    "traced_dispatcher",
    "traced_log",
]

_LOG = logging.getLogger("foldline.tracing")
SEMCONV_VERSION: Final = "1.40.0"
SCHEMA_URL: Final = f"https://opentelemetry.io/schemas/{SEMCONV_VERSION}"
CAPTURE_CONTENT_VARIABLE: Final = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
#: Seconds the tracer's thread gathers a loop's notes before it builds their spans.
BATCH_S: Final = 0.05
#: foldline's provider names that the conventions name otherwise (any other name is used as it is).
PROVIDER_NAMES: Final = {"gemini": "gcp.gemini"}
#: The answer's stop reason in the words of ``gen_ai.response.finish_reasons`` (OpenAI's, which the conventions use).
FINISH_REASONS: Final = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool_calls",
    "max_tokens": "length",
    "refusal": "content_filter",
}

_lock = threading.Lock()
_current: Tracing | None = None


def enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the environment turns tracing on (``OTEL_TRACES_EXPORTER`` names an exporter, and
    ``OTEL_SDK_DISABLED`` is not ``true``)."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    names = [n.strip() for n in env.get("OTEL_TRACES_EXPORTER", "").split(",") if n.strip()]
    return bool(names) and names != ["none"]


@dataclass
class Tracing:
    """This process's tracer provider and the loop observer that turns appends into spans."""

    provider: TracerProvider
    tracer: Tracer
    capture_content: bool
    prices: PriceTable | None
    loop: LoopTracer = field(init=False)

    def __post_init__(self) -> None:
        self.loop = LoopTracer(self)

    def shutdown(self) -> None:
        """Build the spans of what the loops appended, export what is buffered, and stop."""
        self.loop.stop()
        self.provider.shutdown()


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on", "span_only", "span_and_event")


def _exporters(environ: Mapping[str, str]) -> list[Any]:
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter

    out: list[Any] = []
    for name in (n.strip() for n in environ.get("OTEL_TRACES_EXPORTER", "").split(",")):
        if not name or name == "none":
            continue
        if name == "console":
            out.append(ConsoleSpanExporter(out=sys.stderr))  # stdout stays the command's (--json)
        elif name == "otlp":
            protocol = (
                environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or ""
            ).strip() or "http/protobuf"
            if protocol == "http/protobuf":
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

                out.append(HttpExporter())
            elif protocol == "grpc":
                from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

                out.append(GrpcExporter())
            else:
                raise ConfigError(
                    f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r}: foldline exports OTLP over http/protobuf or grpc"
                )
        else:
            raise ConfigError(
                f"OTEL_TRACES_EXPORTER names {name!r}; foldline exports traces with otlp or console (or none)"
            )
    return out


def configure(
    service: str,
    environ: Mapping[str, str] | None = None,
    *,
    prices: PriceTable | None = None,
    processors: Sequence[Any] = (),
) -> Tracing | None:
    """Set up this process's tracing from the standard variables (None, and nothing done, when they leave it off).

    ``service`` is the service name when ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES`` name none;
    ``prices`` prices each step on its span; ``processors``: span processors to add beside the exporters the
    variables name (an application's own, or a test's in-memory exporter). A second call replaces the first (which
    is shut down)."""
    global _current
    env = os.environ if environ is None else environ
    if not enabled(env):
        return None
    try:
        import opentelemetry.exporter.otlp.proto.http
        import opentelemetry.sdk  # noqa: F401
    except ImportError as exc:
        raise MissingExtra("otel", exc.name or "opentelemetry.sdk", "tracing (OTEL_TRACES_EXPORTER is set)") from exc
    from opentelemetry import trace
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: service}))
    provider = TracerProvider(resource=resource)
    for exporter in _exporters(env):
        provider.add_span_processor(BatchSpanProcessor(exporter))
    for processor in processors:
        provider.add_span_processor(processor)
    from importlib.metadata import PackageNotFoundError, version

    try:
        ours = version("foldline")
    except PackageNotFoundError:  # pragma: no cover - a source tree without an install
        ours = "0"
    tracer = provider.get_tracer("foldline", ours, schema_url=SCHEMA_URL)
    made = Tracing(provider, tracer, _truthy(env.get(CAPTURE_CONTENT_VARIABLE)), prices)
    with _lock:
        previous, _current = _current, made
    if previous is not None:
        previous.shutdown()
    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        trace.set_tracer_provider(provider)  # so libraries that trace (and user code) join the same traces
    return made


def current() -> Tracing | None:
    """This process's tracing (None when off)."""
    return _current


def shutdown() -> None:
    """Export what is buffered and turn tracing off."""
    global _current
    with _lock:
        done, _current = _current, None
    if done is not None:
        done.shutdown()


def traced_log(log: EventLog) -> EventLog:
    """``log``, its appends observed by the loop tracer when tracing is on (else ``log`` itself)."""
    tracing = _current
    if tracing is None:
        return log
    return TracedEventLog(log, tracing.loop)


class TracedEventLog(MeteredEventLog):
    """A log whose appends become spans (:class:`LoopTracer`); a session a writer takes over and reads
    (``acquire_and_read``) is handed to the tracer as it was read, so the tracer does not read it again."""

    def __init__(self, inner: EventLog, tracer: LoopTracer) -> None:
        super().__init__(inner, tracer)
        self.tracer = tracer

    def acquire_and_read(self, session_id: str) -> tuple[WriterLease, list[Envelope]]:
        lease, events = self.inner.acquire_and_read(session_id)
        self._loaded(session_id, events)
        return lease, events

    async def acquire_and_read_async(self, session_id: str) -> tuple[WriterLease, list[Envelope]]:
        lease, events = await self.inner.acquire_and_read_async(session_id)
        self._loaded(session_id, events)
        return lease, events

    def _loaded(self, session_id: str, events: Sequence[Envelope]) -> None:
        try:
            self.tracer.observe_loaded(session_id, events)
        except Exception as exc:  # the session was read; the tracer reads it again with the next append
            self.tracer.observation_failed(session_id, exc)


def traced_dispatcher(dispatcher: StepDispatcher, *, loop: bool, serve: bool) -> StepDispatcher:
    """``dispatcher`` traced when tracing is on: ``loop`` — this process's loops hand steps to it (their ``chat``
    span's context goes into each hand-over); ``serve`` — it does the work (its spans join the hand-over's trace)."""
    tracing = _current
    if tracing is None:
        return dispatcher
    return TracedStepDispatcher(dispatcher, tracing, loop=loop, serve=serve)


# ---------------------------------------------------------------------------------------------- the loop


class _Pending:
    """A span being gathered: its name, kind, parent, start and attributes. The SDK span is made once, when it
    ends (one ``start_span`` with every attribute, started at the time it was opened) — or earlier when something
    needs its context (a dispatcher's hand-over) — so a step costs the loop as little as the SDK allows."""

    __slots__ = ("attributes", "events", "kind", "name", "parent", "span", "start_ns")

    def __init__(self, name: str, kind: Any, parent: Context | None, attributes: dict[str, Any], start_ns: int) -> None:
        self.name = name
        self.kind = kind
        self.parent = parent
        self.attributes = attributes
        self.start_ns = start_ns
        self.events: list[tuple[str, dict[str, Any], int]] = []
        self.span: Span | None = None

    def opened(self, tracer: Tracer) -> Span:
        """The SDK span, made now if it was not yet."""
        if self.span is None:
            self.span = tracer.start_span(
                self.name, context=self.parent, kind=self.kind, attributes=self.attributes, start_time=self.start_ns
            )
            self.attributes = {}
        return self.span

    def end(self, tracer: Tracer, at: int, error: tuple[str, str] | None = None) -> None:
        """End it at ``at`` (ns since the epoch; ``error``: its ``error.type`` and a description)."""
        if error is not None:
            self.attributes["error.type"] = error[0]
        span = self.span
        if span is None:
            span = tracer.start_span(
                self.name, context=self.parent, kind=self.kind, attributes=self.attributes, start_time=self.start_ns
            )
        elif self.attributes:
            span.set_attributes(self.attributes)
        for name, attributes, when in self.events:
            span.add_event(name, attributes, timestamp=when)
        if error is not None:
            from opentelemetry.trace import Status, StatusCode

            span.set_status(Status(StatusCode.ERROR, error[1]))
        span.end(end_time=at)


@dataclass
class _SessionSpans:
    """What the tracer keeps of one session between appends."""

    tracker: DropTracker
    turn: Span | None = None
    turn_context: Context | None = None
    turn_number: int | None = None
    step: _Pending | None = None
    step_id: tuple[int, int] | None = None  # (turn, step) of ``step``
    # a turn and a step whose spans a dispatcher's hand-over opened before their events were logged (a
    # dispatched step's opening is logged with its request/dispatch, after the hand-over): adopted when logged
    early_turn: int | None = None
    early_step: tuple[int, int] | None = None
    header: EpochHeader | None = None
    header_reason: str | None = None  # the reason of a header written in the open step
    provider: str = ""
    model: str = ""
    tools: dict[str, _Pending] = field(default_factory=dict)
    session: Session | None = None  # the projection, kept only when content is captured


class LoopTracer:
    """Turns a loop's appends into ``invoke_agent``, ``chat`` and ``execute_tool`` spans (an append observer:
    ``MeteredEventLog(log, tracing.loop)``). Keeps the ``capacity`` most recently written sessions.

    The loop's own thread only notes what it appended and when (and the context a turn starts in); the spans are
    built from those notes, with those times, on a thread of this tracer's, so the work of the SDK is off the loop's
    path. What is noted is built at once when a dispatcher needs a step's context (:meth:`step_context`) and when
    the tracer is flushed (:meth:`flush`: at :func:`shutdown`)."""

    def __init__(self, tracing: Tracing, capacity: int = 4096) -> None:
        from opentelemetry import context, trace
        from opentelemetry.trace import SpanKind

        self.tracing = tracing
        self.tracer = tracing.tracer
        self.capacity = capacity
        self._sessions: OrderedDict[str, _SessionSpans] = OrderedDict()
        self._lock = threading.Lock()
        self._current = context.get_current
        self._in_context = trace.set_span_in_context
        self._kinds = SpanKind
        self._notes: deque[tuple[str, Sequence[Envelope], int, Context | None]] = deque()
        self._next_seq: dict[str, int] = {}  # per session, what the notes reach (the loop's thread's view)
        self._lost: set[str] = set()  # sessions whose state the tracer's thread no longer has
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.failures = 0  # notes the tracer could not turn into spans (logged)

    # ----------------------------------------------------------------- the observer protocol

    def observe_events(
        self,
        session_id: str,
        envelopes: Sequence[Envelope],
        *,
        history: Callable[[int, int], Sequence[Envelope]] | None = None,
    ) -> None:
        if not envelopes:
            return
        now = time.time_ns()
        first = envelopes[0].seq
        known = self._next_seq.get(session_id, 0)
        if session_id in self._lost:
            self._lost.discard(session_id)
            known = 0
        if first > known:  # a session this process did not see from its start (a resume): read what it missed
            if history is None:
                raise ValueError(f"session {session_id!r}: events start at seq {first} and no history was given")
            self._notes.append((session_id, tuple(history(known, first)), 0, None))
        starts = any(isinstance(e.data, TurnStart) for e in envelopes)
        self._notes.append((session_id, envelopes, now, self._current() if starts else None))
        self._next_seq[session_id] = envelopes[-1].seq + 1
        if len(self._next_seq) > 2 * self.capacity:
            self._next_seq.clear()  # rebuilt as sessions append again; a forgotten session reads its history
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="foldline-tracing", daemon=True)
            self._thread.start()
        self._wake.set()

    def observe_loaded(self, session_id: str, envelopes: Sequence[Envelope]) -> None:
        """A writer took the session over and read it whole (``envelopes``, from seq 0): the tracer starts from them
        (no span is made of them) instead of reading them back with the first append."""
        self._lost.discard(session_id)
        self._next_seq[session_id] = envelopes[-1].seq + 1 if envelopes else 0
        if envelopes:
            self._notes.append((session_id, tuple(envelopes), 0, None))

    def flush(self) -> None:
        """Build the spans of everything noted so far (this thread)."""
        with self._lock:
            self._drain()

    def stop(self) -> None:
        """Build what is noted and stop the tracer's thread."""
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.flush()

    def _work(self) -> None:
        """Build spans from the notes in batches (every :data:`BATCH_S` at most), letting the loop's thread have
        the interpreter back between two notes: the loop waits for at most one note's work, never a batch's."""
        while not self._stopping:
            self._wake.wait()
            time.sleep(BATCH_S)
            self._wake.clear()
            while self._notes and not self._stopping:
                with self._lock:
                    self._drain(1)
                time.sleep(0)  # hand the interpreter to a waiting loop

    def _drain(self, limit: int = -1) -> None:
        while self._notes and limit:
            limit -= 1
            session_id, envelopes, at, ambient = self._notes.popleft()
            try:
                self._apply(session_id, envelopes, at, ambient)
            except Exception:  # the log is durable; a span that cannot be built is counted and logged
                self.failures += 1
                self._sessions.pop(session_id, None)
                _LOG.exception("tracing: spans of session %r not built", session_id)

    def _apply(self, session_id: str, envelopes: Sequence[Envelope], at: int, ambient: Context | None) -> None:
        if at == 0:  # the history of a session seen mid-way
            state = self._sessions.get(session_id)
            if state is None or (envelopes and state.tracker.next_seq != envelopes[0].seq):
                state = self._fresh(session_id)
            self._catch_up(state, envelopes)
            self._keep(session_id, state)
            return
        state = self._sessions.get(session_id)
        if state is None or state.tracker.next_seq != envelopes[0].seq:
            state = self._fresh(session_id)
            if envelopes[0].seq:  # its history is not here (dropped from the cache): the loop's thread reads it
                self._lost.add(session_id)  # with its next append
                return
        self._keep(session_id, state)
        for env in envelopes:
            self._one(session_id, state, env, at, ambient)

    def observation_failed(self, session_id: str, exc: BaseException) -> None:
        self._next_seq.pop(session_id, None)

    def append_fenced(self, session_id: str) -> None:
        return None

    def step_context(self, session_id: str, turn: int | None = None, step: int | None = None) -> Context | None:
        """The context of the session's open ``chat`` span (the hand-over carries it to the dispatcher).

        A dispatched step's opening (``step/start``, and ``turn/start`` on a turn's first step) is logged with its
        ``request/dispatch``, after the hand-over: given the hand-over's ``turn`` and ``step``, the spans of a turn
        and a step not logged yet are opened now, in the caller's context, and taken as theirs when their events
        are logged."""
        with self._lock:
            self._drain()
            state = self._sessions.get(session_id)
            if turn is not None and step is not None and (state is None or state.step_id != (turn, step)):
                if state is None:
                    state = self._fresh(session_id)
                    self._keep(session_id, state)
                self._open_early(session_id, state, turn, step, time.time_ns())
            if state is None or state.step is None:
                return None
            return self._in_context(state.step.opened(self.tracer))

    def _open_early(self, session_id: str, state: _SessionSpans, turn: int, step: int, at: int) -> None:
        if state.turn is None or state.turn_number != turn:
            self._open_turn(session_id, state, turn, None, at, self._current())
            state.early_turn = turn
        self._open_step(session_id, state, turn, step, at)
        state.early_step = (turn, step)

    # ----------------------------------------------------------------- the state of a session

    def _fresh(self, session_id: str) -> _SessionSpans:
        state = _SessionSpans(DropTracker(session_id))
        if self.tracing.capture_content:
            state.session = Session(session_id)
        return state

    def _catch_up(self, state: _SessionSpans, missed: Sequence[Envelope]) -> None:
        for _ in state.tracker.feed(missed):
            pass
        for env in missed:
            if isinstance(env.data, RequestHeader):
                state.header = env.data.header
                state.provider, state.model = env.data.header.config.provider, env.data.header.config.model
        if state.session is not None:
            state.session.extend(missed, values_checked=True)

    def _keep(self, session_id: str, state: _SessionSpans) -> None:
        self._sessions[session_id] = state
        self._sessions.move_to_end(session_id)
        while len(self._sessions) > self.capacity:
            _, dropped = self._sessions.popitem(last=False)
            self._end_all(dropped, time.time_ns())

    def _one(self, session_id: str, state: _SessionSpans, env: Envelope, at: int, ambient: Context | None) -> None:
        verdicts = list(state.tracker.feed((env,)))
        if state.session is not None:
            state.session.extend((env,), values_checked=True)
        data = env.data
        if isinstance(data, StepStart):
            state.header_reason = None
            if state.early_step == (data.turn, data.step) and state.step is not None:
                state.early_step = None  # its span was opened by the hand-over
            else:
                self._open_step(session_id, state, data.turn, data.step, at)
        elif isinstance(data, RequestDispatch):
            if (step := state.step) is not None:
                step.name = f"chat {state.model}"
                if step.span is not None:
                    step.span.update_name(step.name)
                step.attributes.update(self._request_attributes(state, env, data))
                if state.session is not None:
                    step.attributes["gen_ai.input.messages"] = _messages_json(state.session.derive_messages())
                    if state.header is not None and state.header.system:
                        step.attributes["gen_ai.system_instructions"] = orjson.dumps(
                            [{"type": "text", "content": state.header.system}]
                        ).decode()
        elif isinstance(data, AssistantMessage):
            if (step := state.step) is not None and data.surface_op == "append" and data.usage is not None:
                step.attributes.update(self._response_attributes(env, data))
                for verdict in verdicts:
                    step.attributes.update(self._verdict_attributes(verdict))
                if state.session is not None:
                    message = {
                        "role": "assistant",
                        "parts": _parts(data.content),
                        "finish_reason": FINISH_REASONS.get(data.stop_reason or "", data.stop_reason or "stop"),
                    }
                    step.attributes["gen_ai.output.messages"] = orjson.dumps([message]).decode()
                interrupted = data.stop_reason == "interrupted"
                step.end(self.tracer, at, ("interrupted", "the answer was interrupted") if interrupted else None)
                state.step = state.step_id = None
        elif isinstance(data, ToolCall):
            attrs: dict[str, Any] = {
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": data.name,
                "gen_ai.tool.call.id": data.call_id,
                "gen_ai.tool.type": "function",
                "gen_ai.conversation.id": session_id,
                "foldline.seq": env.seq,
            }
            if self.tracing.capture_content:
                attrs["gen_ai.tool.call.arguments"] = data.arguments
            state.tools[data.call_id] = _Pending(
                f"execute_tool {data.name}", self._kinds.INTERNAL, state.turn_context, attrs, at
            )
        elif isinstance(data, ToolResult):
            if (tool := state.tools.pop(data.call_id) if data.call_id in state.tools else None) is not None:
                tool.attributes["foldline.result.seq"] = env.seq
                if self.tracing.capture_content and not data.is_error:
                    tool.attributes["gen_ai.tool.call.result"] = _text(data.content)
                tool.end(self.tracer, at, ("tool_error", _text(data.content)[:200]) if data.is_error else None)
        elif isinstance(data, RequestHeader):
            state.header, state.header_reason = data.header, data.reason
            state.provider, state.model = data.header.config.provider, data.header.config.model
            if state.turn is not None:
                state.turn.set_attribute("gen_ai.provider.name", PROVIDER_NAMES.get(state.provider, state.provider))
        elif isinstance(data, TurnStart):
            if state.early_turn == data.turn and state.turn is not None:  # its span was opened by the hand-over
                state.early_turn = None
                state.turn.set_attribute("foldline.seq", env.seq)
            else:
                self._open_turn(session_id, state, data.turn, env.seq, at, ambient)
        elif isinstance(data, LlmRetry):
            if state.step is not None:
                retry: dict[str, Any] = {"foldline.attempt": data.attempt, "error.type": data.error_type}
                if data.status is not None:
                    retry["http.response.status_code"] = data.status
                if data.wait_ms is not None:
                    retry["foldline.retry.wait_ms"] = data.wait_ms
                state.step.events.append(("foldline.retry", retry, at))
        elif isinstance(data, StepEnd):
            # a step that ended without an answer (a quarantine, an error) — not a later one opened early
            if state.step is not None and state.step_id in (None, (data.turn, data.step)):
                state.step.end(self.tracer, at, ("no_answer", "the step ended without an answer"))
                state.step = state.step_id = None
        elif isinstance(data, CompactionStart | CompactionEnd):
            if state.turn is not None:
                state.turn.add_event(f"foldline.{env.type.replace('/', '.')}", {"foldline.seq": env.seq}, timestamp=at)
        elif isinstance(data, TurnEnd):
            turn_span = state.turn
            self._end_all(state, at, keep_turn=True)
            if turn_span is not None:
                turn_span.set_attribute("foldline.turn.reason", data.reason)
                if data.reason in ("error", "aborted", "context-overflow"):
                    from opentelemetry.trace import Status, StatusCode

                    turn_span.set_status(Status(StatusCode.ERROR, f"the turn ended {data.reason}"))
                    turn_span.set_attribute("error.type", data.reason)
                turn_span.end(end_time=at)
            state.turn = state.turn_context = None

    def _open_turn(
        self, session_id: str, state: _SessionSpans, turn: int, seq: int | None, at: int, ambient: Context | None
    ) -> None:
        self._end_all(state, at)
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.conversation.id": session_id,
            "foldline.turn": turn,
        }
        if seq is not None:
            attributes["foldline.seq"] = seq
        span = self.tracer.start_span(
            "invoke_agent", context=ambient, start_time=at, kind=self._kinds.INTERNAL, attributes=attributes
        )
        if state.provider:
            span.set_attribute("gen_ai.provider.name", PROVIDER_NAMES.get(state.provider, state.provider))
        state.turn, state.turn_context, state.turn_number = span, self._in_context(span), turn
        state.early_turn = state.early_step = None

    def _open_step(self, session_id: str, state: _SessionSpans, turn: int, step: int, at: int) -> None:
        if state.step is not None:
            state.step.end(self.tracer, at)
        state.step = _Pending(
            "chat",
            self._kinds.CLIENT,
            state.turn_context,
            {
                "gen_ai.operation.name": "chat",
                "gen_ai.conversation.id": session_id,
                "foldline.turn": turn,
                "foldline.step": step,
            },
            at,
        )
        state.step_id = (turn, step)

    def _end_all(self, state: _SessionSpans, at: int, *, keep_turn: bool = False) -> None:
        """End what is still open (a turn that never ended: its process stopped, or a new turn began)."""
        for tool in state.tools.values():
            tool.end(self.tracer, at)
        state.tools.clear()
        if state.step is not None:
            state.step.end(self.tracer, at)
            state.step = state.step_id = None
        if state.turn is not None and not keep_turn:
            state.turn.end(end_time=at)
            state.turn = state.turn_context = None

    # ----------------------------------------------------------------- attributes

    def _request_attributes(self, state: _SessionSpans, env: Envelope, data: RequestDispatch) -> dict[str, Any]:
        attrs: dict[str, Any] = {
            "gen_ai.provider.name": PROVIDER_NAMES.get(state.provider, state.provider),
            "gen_ai.request.model": state.model,
            "foldline.seq": env.seq,
            "foldline.request.digest": data.digest,
            "foldline.request.bytes": data.bytes,
            "foldline.serializer": f"{data.serializer}/v{data.serializer_version}",
            "foldline.header.reason": state.header_reason or "unchanged",
        }
        config = state.header.config if state.header is not None else None
        if config is not None:
            if config.max_tokens is not None:
                attrs["gen_ai.request.max_tokens"] = config.max_tokens
            if config.temperature is not None:
                attrs["gen_ai.request.temperature"] = config.temperature
            if config.stop:
                attrs["gen_ai.request.stop_sequences"] = list(config.stop)
        return attrs

    def _response_attributes(self, env: Envelope, data: AssistantMessage) -> dict[str, Any]:
        assert data.usage is not None
        usage = normalize_usage(data.usage)
        attrs: dict[str, Any] = {
            "gen_ai.usage.input_tokens": usage.prompt,
            "gen_ai.usage.cache_read.input_tokens": usage.cache_read,
            "gen_ai.usage.cache_creation.input_tokens": usage.cache_write,
            "gen_ai.usage.output_tokens": usage.completion,
            "gen_ai.response.finish_reasons": [FINISH_REASONS.get(data.stop_reason or "", data.stop_reason or "stop")],
            "foldline.response.seq": env.seq,
        }
        if data.usage.reasoning_tokens is not None:
            attrs["foldline.usage.reasoning_tokens"] = data.usage.reasoning_tokens
        if data.provider_message_id:
            attrs["gen_ai.response.id"] = data.provider_message_id
        if data.provider_request_id:
            attrs["foldline.provider.request_id"] = data.provider_request_id
        return attrs

    def _verdict_attributes(self, verdict: StepVerdict) -> dict[str, Any]:
        attrs: dict[str, Any] = {}
        drop = verdict.drop
        if drop is not None:
            attrs["foldline.drop.cause"] = drop.cause
            attrs["foldline.drop.causes"] = list(drop.causes)
            attrs["foldline.drop.lost_tokens"] = drop.lost_tokens
            if drop.header_fields:
                attrs["foldline.drop.header_fields"] = list(drop.header_fields)
        prices = self.tracing.prices
        if prices is None:
            return attrs
        priced = price_step(verdict, prices)
        if priced.cost is None or priced.prices is None:
            attrs["foldline.cost.unknown"] = priced.name
            return attrs
        attrs["foldline.cost.currency"] = priced.prices.currency
        attrs["foldline.cost.spend"] = float(priced.cost.spend)
        attrs["foldline.cost.saved"] = float(priced.cost.saved)
        if drop is not None and priced.drop_cost is not None:
            attrs["foldline.drop.cost"] = float(priced.drop_cost)
            attrs["foldline.drop.key"] = drop_key(drop)
        return attrs


# ---------------------------------------------------------------------------------------------- content


def _text(blocks: Sequence[ContentBlock]) -> str:
    return "".join(b.text for b in blocks if isinstance(b, TextBlock))


def _parts(blocks: Sequence[ContentBlock]) -> list[dict[str, Any]]:
    """Content blocks as the conventions' message parts (opaque reasoning state is left out)."""
    parts: list[dict[str, Any]] = []
    for b in blocks:
        if isinstance(b, TextBlock):
            parts.append({"type": "text", "content": b.text})
        elif isinstance(b, ReasoningBlock):
            parts.append({"type": "reasoning", "content": b.text})
        elif isinstance(b, ToolCallBlock):
            parts.append({"type": "tool_call", "id": b.id, "name": b.name, "arguments": b.arguments})
        elif isinstance(b, ToolResultBlock):
            parts.append({"type": "tool_call_response", "id": b.tool_call_id, "response": _text(b.content)})
        elif isinstance(b, ImageBlock):
            image = b.image
            parts.append(
                {"type": "file", "modality": "image", "mime_type": image.media_type, "file_id": image.attachment_id}
            )
        elif isinstance(b, RedactedReasoningBlock | EncryptedReasoningBlock):
            continue
    return parts


def _messages_json(messages: Sequence[Message]) -> str:
    return orjson.dumps([{"role": m.role, "parts": _parts(m.content)} for m in messages]).decode()


# ---------------------------------------------------------------------------------------------- dispatchers


class TracedStepDispatcher(StepDispatcher):
    """A step dispatcher whose hand-overs carry the loop's trace (``loop``) and whose work is traced (``serve``)."""

    def __init__(self, inner: StepDispatcher, tracing: Tracing, *, loop: bool, serve: bool) -> None:
        self.inner = inner
        self.tracing = tracing
        self.loop = loop
        self.serve = serve

    def __getattr__(self, name: str) -> Any:  # the wrapped dispatcher's other attributes (its counters)
        return getattr(self.inner, name)

    def _carried(self, handoff: StepHandoff) -> StepHandoff:
        if not self.loop or handoff.trace:
            return handoff
        from opentelemetry import propagate

        parent = self.tracing.loop.step_context(handoff.session_id, handoff.turn, handoff.step)
        if parent is None:
            return handoff
        carrier: dict[str, str] = {}
        propagate.inject(carrier, context=parent)
        return dataclasses.replace(handoff, trace=carrier) if carrier else handoff

    def _span(self, name: str, handoff: StepHandoff) -> Span:
        from opentelemetry import propagate
        from opentelemetry.trace import SpanKind

        parent = propagate.extract(dict(handoff.trace or {}))
        return self.tracing.tracer.start_span(
            name,
            context=parent,
            kind=SpanKind.INTERNAL,
            attributes={
                "gen_ai.conversation.id": handoff.session_id,
                "foldline.turn": handoff.turn,
                "foldline.step": handoff.step,
                "foldline.boundary": handoff.boundary,
            },
        )

    async def prepare(self, handoff: StepHandoff) -> PreparedStep:
        handoff = self._carried(handoff)
        if not self.serve:
            return await self.inner.prepare(handoff)
        span = self._span("foldline.dispatch.prepare", handoff)
        try:
            prepared = await self.inner.prepare(handoff)
        except BaseException as exc:
            _failed(span, exc)
            raise
        span.set_attributes(
            {
                "foldline.request.digest": prepared.digest,
                "foldline.request.bytes": prepared.bytes,
                "foldline.serializer": f"{prepared.serializer}/v{prepared.serializer_version}",
                **{f"foldline.seconds.{k}": v for k, v in prepared.timings.items()},
            }
        )
        span.end()
        return prepared

    async def send(
        self, handoff: StepHandoff, prepared: PreparedStep, *, on_delta: Callable[[AnswerDelta], None] | None = None
    ) -> StepAnswer:
        handoff = self._carried(handoff)
        if not self.serve:
            return await self.inner.send(handoff, prepared, on_delta=on_delta)
        span = self._span("foldline.dispatch.send", handoff)
        span.set_attribute("foldline.request.digest", prepared.digest)
        try:
            answer = await self.inner.send(handoff, prepared, on_delta=on_delta)
        except BaseException as exc:
            _failed(span, exc)
            raise
        if answer.request_id:
            span.set_attribute("foldline.provider.request_id", answer.request_id)
        if answer.message_id:
            span.set_attribute("gen_ai.response.id", answer.message_id)
        span.end()
        return answer

    async def aclose(self) -> None:
        await self.inner.aclose()


def _failed(span: Span, exc: BaseException) -> None:
    from opentelemetry.trace import Status, StatusCode

    span.set_status(Status(StatusCode.ERROR, str(exc)[:200]))
    span.set_attribute("error.type", type(exc).__name__)
    span.end()


# ---------------------------------------------------------------------------------------------- projectors


def record_apply(events: int, applied: int, duplicates: int, sessions: int, seconds: float) -> None:
    """A batch a projector applied (its span ends now and began ``seconds`` ago); nothing when tracing is off."""
    tracing = _current
    if tracing is None:
        return
    end = time.time_ns()
    span = tracing.tracer.start_span(
        "foldline.projector.apply",
        start_time=end - int(seconds * 1e9),
        attributes={
            "foldline.events": events,
            "foldline.applied": applied,
            "foldline.duplicates": duplicates,
            "foldline.sessions": sessions,
        },
    )
    span.end(end_time=end)
