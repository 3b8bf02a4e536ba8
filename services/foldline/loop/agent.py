"""The agent loop. One step, in order (the reconstruction boundary):

1. claim the inbox batch; run ``agent/pre-step`` hooks (reject → no step; enter → extra messages);
2. ``step/start`` and one sourced ``user/message`` per entered message;
3. render system prompt and tools (every step, compared by value — no change signals);
4. let ``agent/request`` hooks replace the frozen call-config seed (nothing else);
5. a full ``request/header`` snapshot when one is owed (initial | resume | change);
6. build the request from the derived messages and folded header, frozen, marked as a loop request;
7. the invariant companion rebuilds it from the raw log; a mismatch refuses to send;
8. serialize to exact wire bytes and append ``step/start``, the user messages, the owed header and
   ``request/dispatch`` with the body's digest in ONE append; then send through the retrying sender —
   every attempt posts the same bytes, and each failed attempt is appended as ``llm/retry`` before the
   wait (streamed when the logged header config says so; each event as ``assistant/chunk`` when
   ``TransportSettings.log_chunks``). With a dispatcher (``AgentOptions.dispatcher``) the opening is held
   and travels with the hand-over, the dispatcher builds and serializes the request from the fold and the
   opening and answers its digest, the companion checks it, the loop writes the opening with ``request/dispatch``
   in one append, and only then does the dispatcher send — one attempt per call, the retries driven and
   logged here the same way;
9. append the ``assistant/message`` (with the provider's request and message ids) and its ``tool/call``
   events; run tools; append ``tool/result``s; a tool's additional context goes to the inbox for a later
   claim. With a dispatcher the results and ``step/end`` are held and written with the next opening or the
   turn's end (:meth:`Agent._hold`).

How a turn ends, by the answer's stop reason: ``end_turn`` (and any answer without tool calls) completes
it; ``tool_use`` runs the tools and takes another step; ``pause_turn`` takes another step without running
anything (the provider paused a long answer; the next request, which carries the paused answer, lets it
continue); ``max_tokens`` ends it ``max-tokens`` and ``refusal`` ends it ``refusal`` — neither runs a tool
(a call cut short is not even logged as one); a full context window (the stop reason
``model_context_window_exceeded`` or a :class:`~foldline.errors.ContextOverflow` answer) ends it
``context-overflow``, and :attr:`TurnResult.detail` says what to change. After a refusal, a provider whose
documentation asks for the refused turn to be removed before continuing (Anthropic) gets it removed: the
next step opens with a ``user/message`` (source ``refusal-reset``) that replaces the refused turn's entries
on the surface — logged, so every later request is still rebuilt from the log.

Cancelling a turn while its answer streams closes the connection and appends what had arrived as an
``assistant/message`` with stop reason ``interrupted`` (its text only; an unfinished tool call or reasoning
block is left out), then ends the turn ``aborted``. That message is model-visible: the next request shows
the model its own cut-off answer.

A request the provider still fails when the retries run out (:class:`~foldline.errors.RetriesExhausted`)
ends the turn ``error`` and is returned, not raised: :attr:`TurnResult.failure` holds the typed error, the
step is closed, and the next turn starts from a valid log. :meth:`Agent.stream` runs a turn as typed events
for a caller that shows the answer as it is written (loop/stream.py).

Pauses (docs/LOOP.md): the inbox is durable (``loop/inbox.py``: what a step claims is logged as ``inbox/claim``);
a call of a tool that needs approval is logged with ``approval/request`` and the turn pauses until it is decided
(``loop/approvals.py``); a turn a crash left open is ended or continued by ``AgentOptions.on_crash``
(``loop/recovery.py``); :meth:`Agent.continue_turn` goes on with an open turn. A sub-agent a tool runs names
this session and call in its first event (``loop/subagents.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Any, ClassVar, Literal

import msgspec

from ..collector import collector_paused
from ..core import codec
from ..core.content import ContentBlock, TextBlock, ToolCallBlock, Usage
from ..core.events import (
    ApprovalDecision,
    AssistantChunk,
    AssistantMessage,
    Envelope,
    EventData,
    InboxClaim,
    RequestDispatch,
    RequestHeader,
    SessionParent,
    StepEnd,
    StepStart,
    ToolCall,
    ToolResult,
    TurnEnd,
    TurnEndReason,
    TurnRecovery,
    TurnStart,
    UserMessage,
    logged,
)
from ..core.header import CallConfig, EpochHeader
from ..core.inbox import InboxDecision
from ..core.limits import check_request_size
from ..core.lineage import lineage
from ..core.pauses import OpenStep, changed_arguments_note, denied_result, open_turn, pending_approvals, taken_entries
from ..core.projection import Session
from ..core.repair import closing_events, interrupted_result
from ..core.request import GenerateOptions
from ..core.validation import check_session_id
from ..errors import (
    AttachmentError,
    ConfigError,
    ContentErased,
    ContextOverflow,
    FencedError,
    FoldlineError,
    NoOpenTurn,
    OutputInvalid,
    RetriesExhausted,
    TurnOpen,
)
from ..ports.attachments import AttachmentStore
from ..ports.event_log import EventLog, WriterLease
from ..ports.inbox import InboxStore
from ..providers.base import Provider, ProviderResponse
from ..providers.framing import IncrementalBody
from ..providers.header_defaults import header_config
from ..providers.model_rules import check_call_config
from ..providers.retry import FailedAttempt, RetryingSender
from ..providers.sse import ServerSentEvent
from ..providers.streaming import AnswerProgress
from ..replay.invariant import InvariantCompanion
from ..replay.registry import mark_loop_request
from ..replay.step import answer_records, dispatch_record, quarantine_record, retry_record, session_request
from ._durable import append_durably
from ._refusal import REFUSAL_RESET_TEXT, refusal_reset, refused_turn
from ._remote import dispatch_remote
from .approvals import CallPlan, Waiting, approval_requests, plan_calls
from .calls import CURRENT_CALL, ToolCallContext
from .hooks import Enter, PreStepContext, PreStepHook, Reject, RequestHook
from .inbox import Inbox, InboxItem, new_entry_id
from .options import CONTEXT_OVERFLOW_FIX, AgentOptions, StepRecord, TurnResult, wall_clock_ms
from .output import OUTPUT_RETRY_SOURCE, OutputCheck, OutputType
from .pressure import relieve_pressure
from .recovery import recovery_events
from .stream import (
    DEFAULT_STREAM_BUFFER,
    AttemptDiscarded,
    EventBuffer,
    StepFinished,
    StepStarted,
    StreamEvent,
    ToolCallFinished,
    ToolCallResult,
    TurnFinished,
    TurnStream,
)
from .tool_runner import ToolRun

__all__ = ["CONTEXT_OVERFLOW_FIX", "REFUSAL_RESET_TEXT", "Agent", "AgentOptions", "StepRecord", "TurnResult"]


#: What continuing an open step answers when the step had no answer to finish: the turn goes on with a new step.
_NEXT = object()


def _in_call_order(
    calls: Sequence[ToolCallBlock],
    answered: Mapping[str, ToolResult],
    stopped: Mapping[str, ToolResult],
    changed: Mapping[str, str],
) -> list[ToolResult]:
    """The results of ``calls`` in the answer's order (``answered``, else ``stopped``; a call in neither was
    answered before); a call run with an approver's changed arguments says so first in its result."""
    out: list[ToolResult] = []
    for call in calls:
        result = answered.get(call.id) or stopped.get(call.id)
        if result is None:
            continue
        if call.id in changed:
            note = changed_arguments_note(changed[call.id])
            result = msgspec.structs.replace(result, content=(note, *result.content))
        out.append(result)
    return out


def check_provider(provider: Provider, config: CallConfig) -> None:
    """A request goes through ``provider``: its config must name that provider (an adapter sends its own API's
    body to its own server; a config naming another provider would be logged as sent there), else ConfigError."""
    if config.provider != provider.name:
        raise ConfigError(
            f"the call config names provider {config.provider!r}, but this loop sends through the {provider.name!r} "
            f"adapter ({type(provider).__name__}); give the Agent a {config.provider!r} adapter (another server of "
            f"an API takes name={config.provider!r}) or a config with provider={provider.name!r}"
        )


#: while fewer sessions than this are being opened at once in a process (:meth:`Agent.open`), a new session's
#: key is made as it opens; beyond it, at its first step. Making keys while a thousand sessions open at once
#: (32 key threads taking the interpreter lock in turn with the event loop) halved the openings per second
#: (docs/DISPATCHER.md).
KEYS_AT_OPEN_BELOW = 16


class Agent:
    """One loop instance on one session. Create it, then ``await run_turn(...)``."""

    _opening: ClassVar[int] = 0  # sessions being opened now in this process (Agent.open)

    def __init__(
        self,
        session_id: str,
        log: EventLog,
        provider: Provider,
        options: AgentOptions,
        *,
        attachments: AttachmentStore | None = None,
        clock: Callable[[], int] = wall_clock_ms,
        opened: tuple[WriterLease, list[Envelope]] | None = None,
        inbox: InboxStore | None = None,
        parent: SessionParent | None = None,
        new_id: Callable[[], str] = new_entry_id,
    ) -> None:
        """Become the session's writer and load it (``opened``: what :meth:`open` already acquired).

        A call config the model does not accept is refused first (:class:`~foldline.errors.UnsupportedSetting`,
        :mod:`foldline.providers.model_rules`), before the session is opened. ``inbox`` is the session's durable
        inbox (default: the log's, :meth:`~foldline.ports.event_log.EventLog.inbox`); ``parent`` makes a new
        session a sub-agent of that session's call (its first event, :mod:`.subagents`); ``new_id`` makes inbox
        entry ids. On load, a turn the last instance left open is handled first: one paused on approvals waits
        for :meth:`continue_turn`; one a crash interrupted is ended or continued by ``options.on_crash``."""
        self.session_id = check_session_id(session_id)
        check_provider(provider, options.config)
        check_call_config(provider.serializer, options.config)
        self.log = log
        self.provider = provider
        self._options = options
        self._seeded_with = options.config  # the config value this instance last took from its options
        self.attachments = attachments
        self.clock = clock
        self._pre_step: list[PreStepHook] = []
        self._request_hooks: list[RequestHook] = []
        if options.subject is not None and log.sealer is not None:
            log.sealer.bind(session_id, options.subject)
        self.lease: WriterLease
        self.lease, loaded = opened if opened is not None else log.acquire_and_read(session_id)
        with collector_paused():
            self.session = Session(session_id, loaded)  # validates on load
        store = inbox if inbox is not None else log.inbox()
        #: the session's durable inbox; the log names every entry taken already (loop/inbox.py)
        self.inbox = Inbox(store, session_id, taken=taken_entries(loaded), clock=clock, new_id=new_id)
        first: list[EventData] = self._adopt(parent, loaded) if parent is not None else []
        state = open_turn(loaded)
        self._open_at: int | None = None  # seq of the open turn's turn/start (paused, or to continue)
        if state is None:
            first += closing_events(loaded)  # nothing open; a compaction cut short outside a turn is finished
        elif state.paused:
            self._open_at = state.start_seq  # waits for decisions: continue_turn
        else:  # the last instance stopped mid-turn: end it or continue it, as the policy says (loop/recovery.py)
            first += recovery_events(loaded, state, options.tools, options.on_crash)
            if any(isinstance(d, TurnRecovery) and d.policy == "continue" for d in first):
                self._open_at = state.start_seq
        if first:
            start, now = self.session.next_seq, clock()
            events = [logged(start + i, now, d) for i, d in enumerate(first)]
            log.append(session_id, start, events, lease=self.lease)  # once per load, before any step: no wait
            self.session.extend(events, values_checked=True)
        self._first_request = True
        options.bind()  # what is read here is read once: assigning it later is refused, not ignored
        self.invariant = (
            InvariantCompanion(
                log,
                attachments=attachments,
                on_violation=options.on_invariant_violation,
                full_check_every=options.invariant_full_check_every,
                fresh_growth=options.invariant_fresh_growth,
            )
            if options.invariant
            else None
        )
        if self.invariant is not None:
            # the companion folds the events this open read from the log itself (its own fold): its first check
            # reads only what was appended after them, not the whole session again
            self.invariant.load(session_id, loaded)
        self._bodies = IncrementalBody(provider.serializer)  # this session's reusable body prefix
        settings = getattr(provider, "settings", None)
        self.sender = options.sender if options.sender is not None else RetryingSender(settings)
        self._refused = refused_turn(loaded)  # seqs of a refused last turn still to be removed
        self.turn = 1 + max((e.data.turn for e in loaded if isinstance(e.data, TurnStart)), default=-1)
        self.last_request: GenerateOptions | None = None
        self.last_timings: dict[str, float] = {}  # the last step's breakdown (StepRecord.timings)
        self._unwritten = []
        self._after_write = []
        self._on_drop = []
        self._recent: list[Envelope] = []  # from the last request/dispatch on (_note_recent)
        self._phase = "append"  # where log-write seconds of the current step are counted
        self.step_listeners: list[Callable[[StepRecord], None]] = []
        #: the loop as pressure relief (loop/pressure.py) and a dispatched step (loop/_remote.py) use it
        self.context = LoopContext(self)

    @classmethod
    async def open(
        cls,
        session_id: str,
        log: EventLog,
        provider: Provider,
        options: AgentOptions,
        *,
        attachments: AttachmentStore | None = None,
        clock: Callable[[], int] = wall_clock_ms,
        inbox: InboxStore | None = None,
        parent: SessionParent | None = None,
        new_id: Callable[[], str] = new_entry_id,
    ) -> Agent:
        """The constructor for asyncio callers: the lease and the load are awaited (many sessions open at once).

        A new session's key (sealed content) starts being made as it opens, so its write overlaps the opening
        and the first hand-over — unless more than :data:`KEYS_AT_OPEN_BELOW` sessions are being opened at once,
        whose keys' writes would slow their openings: those start at each session's first step."""
        Agent._opening += 1
        try:
            opened = await log.acquire_and_read_async(session_id)
            crowded = Agent._opening > KEYS_AT_OPEN_BELOW
        finally:
            Agent._opening -= 1
        agent = cls(
            session_id,
            log,
            provider,
            options,
            attachments=attachments,
            clock=clock,
            opened=opened,
            inbox=inbox,
            parent=parent,
            new_id=new_id,
        )
        if not opened[1] and not crowded and log.sealer is not None:
            log.sealer.make_ahead(session_id)
        return agent

    # -------------------------------------------------------------- public API

    async def __aenter__(self) -> Agent:
        """Start the agent's tool sources (MCP servers: their processes and connections) for its lifetime."""
        await self.options.tools.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        """Stop the tool sources this agent started; no server process outlives the block."""
        await self.options.tools.stop()

    @property
    def options(self) -> AgentOptions:
        """This instance's options; assign their fields (``agent.options.config = ...``), not a new object."""
        return self._options

    @options.setter
    def options(self, value: AgentOptions) -> None:
        raise ConfigError(
            "an Agent keeps the AgentOptions it was built with; assign their fields (agent.options.config = ...) "
            "or build a new Agent on the session"
        )

    def inject(self, text: str | Sequence[ContentBlock], source: str = "inject") -> str:
        """Put a message into the session's durable inbox for the next step's claim; returns its entry id once it
        is durable (a crash before the claim loses nothing; the claim is logged, so it never enters twice)."""
        content = (TextBlock(text),) if isinstance(text, str) else tuple(text)
        return self.inbox.put(InboxItem(content, source))

    def on_pre_step(self, hook: PreStepHook) -> PreStepHook:
        self._pre_step.append(hook)
        return hook

    def on_request(self, hook: RequestHook) -> RequestHook:
        self._request_hooks.append(hook)
        return hook

    def stream(
        self,
        text: str | Sequence[ContentBlock] | None = None,
        source: str = "user",
        *,
        buffer: int = DEFAULT_STREAM_BUFFER,
        output: OutputType[Any] | None = None,
    ) -> TurnStream:
        """Run one turn as :meth:`run_turn` does, read as typed events while it runs (loop/stream.py):
        ``async for event in agent.stream("...")``. The log is the same as :meth:`run_turn`'s; ``buffer`` events
        wait for a slow reader before pieces of the answer are merged. Leaving the loop early cancels the turn
        (``async with agent.stream(...) as events`` returns once that is logged)."""
        events = EventBuffer(buffer)
        return TurnStream(self._streamed_turn(text, source, events, output), events)

    async def _streamed_turn(
        self,
        text: str | Sequence[ContentBlock] | None,
        source: str,
        events: EventBuffer,
        output: OutputType[Any] | None = None,
    ) -> TurnResult:
        self._events = events
        try:
            return await self.run_turn(text, source, output=output)
        finally:
            self._events = None

    def _emit(self, event: StreamEvent) -> None:
        if self._events is not None:
            self._events.push(event)

    @property
    def turn_open(self) -> bool:
        """A turn of this session is open — paused on approvals, or continued after a crash — and
        :meth:`continue_turn` goes on with it (:meth:`run_turn` refuses until then)."""
        return self._open_at is not None

    async def run_turn(
        self,
        text: str | Sequence[ContentBlock] | None = None,
        source: str = "user",
        *,
        output: OutputType[Any] | None = None,
    ) -> TurnResult:
        """Run one turn: steps until the model stops calling tools (or the step limit), or until it pauses on
        approvals (``reason`` ``paused``: decide them, then :meth:`continue_turn`). ``text`` is the turn's prompt,
        entered at its first step after the inbox's messages.

        A provider that still fails once the retries run out ends the turn ``error``: the result's ``failure``
        holds the :class:`~foldline.errors.RetriesExhausted` (nothing is raised). Other provider and tool
        failures still raise, after the turn was closed in the log.

        ``output`` (else ``AgentOptions.output``) asks for structured output (loop/output.py): its schema goes into
        the logged call config, the final answer is validated and returned as :attr:`TurnResult.output`; a wrong
        answer is sent back to the model up to ``output.retries`` times, then
        :class:`~foldline.errors.OutputInvalid` is raised (after the turn was closed in the log). A turn continued
        with :meth:`continue_turn` (after a pause or a crash) asks for the agent's ``AgentOptions.output``."""
        if self._open_at is not None:
            raise TurnOpen(
                self.session_id,
                self.turn - 1,
                f"session {self.session_id!r} has an open turn (paused on approvals, or continued after a crash); "
                "continue it first (Agent.continue_turn, or `foldline resume`)",
            )
        self._output = output if output is not None else self.options.output
        try:
            return await self._run_turn(text, source)
        finally:
            self._output = None

    async def _run_turn(self, text: str | Sequence[ContentBlock] | None, source: str) -> TurnResult:
        if text is not None:
            self.inbox.prompt(InboxItem((TextBlock(text),) if isinstance(text, str) else tuple(text), source))
        turn = self.turn
        self.turn += 1
        start = self.session.next_seq
        self._turn_start_seq = start
        if self.options.dispatcher is not None:
            # written with the first step's opening (_hold); given up unwritten, the turn's number is free again
            self._hold(TurnStart(turn), dropped=lambda: setattr(self, "turn", turn))
        else:
            await self._append(TurnStart(turn))
        return await self._run(turn, 0, start)

    async def continue_turn(self) -> TurnResult:
        """Go on with the open turn: take the decisions of a paused one (waiting ``options.approval_wait_s`` for
        those still missing — then it pauses again), run its calls and continue; or answer the calls of one a crash
        interrupted as ``turn/recover`` says and continue. :class:`~foldline.errors.NoOpenTurn` when none is open."""
        if self._open_at is None:
            raise NoOpenTurn(f"session {self.session_id!r} has no open turn to continue; run_turn starts a new one")
        state = open_turn(await self.log.read_async(self.session_id, self._open_at))
        if state is None:  # pragma: no cover - only this instance writes the session
            self._open_at = None
            raise NoOpenTurn(f"session {self.session_id!r} has no open turn to continue")
        self._turn_start_seq = state.start_seq
        step = state.step
        self._output = self.options.output
        try:
            return await self._run(state.turn, state.steps, state.start_seq, step)
        finally:
            self._output = None

    async def _run(self, turn: int, step: int, start: int, resume: OpenStep | None = None) -> TurnResult:
        """The steps of a turn from ``step`` on (after the open step ``resume``, when continuing one), then its end."""
        records: list[StepRecord] = []
        reason: TurnEndReason = "completed"
        detail: str | None = None
        final_text = ""
        self._open_at = start
        wanted = self._output
        value: Any = None
        retries = 0
        try:
            while True:
                if resume is not None:
                    open_step, resume = resume, None
                    outcome = await self._resume_step(open_step)
                    if outcome is _NEXT:
                        continue
                else:
                    if self.options.pressure is not None:
                        await relieve_pressure(self.context, self.options.pressure)
                    outcome = await self._step(turn, step)
                    step += 1
                if outcome is None:
                    reason = "blocked"
                    break
                assert isinstance(outcome, tuple)
                record, response = outcome
                records.append(record)
                final_text = "".join(b.text for b in response.content if isinstance(b, TextBlock))
                stop = response.stop_reason
                if stop in ("max_tokens", "length"):
                    reason = "max-tokens"
                    break
                if stop == "refusal":
                    reason = "refusal"
                    break
                if stop == "model_context_window_exceeded":
                    reason, detail = "context-overflow", CONTEXT_OVERFLOW_FIX
                    break
                if stop != "pause_turn" and not any(isinstance(b, ToolCallBlock) for b in response.content):
                    if wanted is None:
                        break
                    try:
                        value = wanted.validate(final_text)
                        break
                    except OutputCheck as exc:
                        if retries >= wanted.retries:
                            await self._append(TurnEnd(turn, "completed"))
                            raise OutputInvalid(turn, final_text, exc.errors, retries + 1) from None
                        retries += 1
                        self.inject(wanted.retry_text(exc.errors), OUTPUT_RETRY_SOURCE)
                if step >= self.options.max_steps_per_turn:
                    reason = "interrupted"
                    break
        except Waiting:
            pending = pending_approvals(self.session_id, await self.log.read_async(self.session_id, start))
            return self._finished(TurnResult(turn, "paused", tuple(records), final_text, pending=tuple(pending)))
        except asyncio.CancelledError:
            if not self._waiting:  # cancelled while waiting for decisions: the turn stays paused, as logged
                await self._close_turn(turn, step, "aborted")
                self._open_at = None
            raise
        except ContextOverflow as exc:
            await self._close_turn(turn, step, "context-overflow")
            self._open_at = None
            return self._finished(
                TurnResult(turn, "context-overflow", tuple(records), final_text, f"{CONTEXT_OVERFLOW_FIX} ({exc})")
            )
        except RetriesExhausted as exc:
            await self._close_turn(turn, step, "error")
            self._open_at = None
            return self._finished(TurnResult(turn, "error", tuple(records), final_text, str(exc), exc))
        except OutputInvalid:
            self._open_at = None  # the turn is closed in the log
            raise
        except Exception:
            await self._close_turn(turn, step, "error")
            self._open_at = None
            raise
        finally:
            self._waiting = False
        await self._append(TurnEnd(turn, reason))
        self._open_at = None
        if reason == "refusal":
            self._refused = (start, self.session.next_seq - 1)
        return self._finished(TurnResult(turn, reason, tuple(records), final_text, detail, output=value))

    def _finished(self, result: TurnResult) -> TurnResult:
        self._emit(TurnFinished(result))
        return result

    def _refusal_reset(self, seq: int) -> UserMessage | None:
        """The ``user/message`` that removes a refused last turn, where one is owed (loop/_refusal.py)."""
        if self._refused is None or not self.options.reset_after_refusal:
            return None
        return refusal_reset(self.session, self._refused, seq)

    # -------------------------------------------------------------- the step

    async def _step(self, turn: int, step: int) -> tuple[StepRecord, ProviderResponse] | None:
        self.last_timings, self._phase, self._step_began = {}, "append", time.monotonic()
        logged = self._unwritten[0].seq if self._unwritten else self.session.next_seq  # seqs in the log
        if not logged and self.log.sealer is not None:
            # a new session's first step: its key is made while the step's request is handed over, not before its
            # first write (nothing to do when its opening started it: Agent.open)
            self.log.sealer.make_ahead(self.session_id)
        if self._unwritten and (self._pre_step or self.options.tools.sources):
            await self._append()  # a hook or a tool source may take long: what is held is written first
        # tool sources (MCP servers) reconnect and refresh their lists where due, before the claim; the render
        # below reads what they now hold, and a difference is a change snapshot like any other
        await self.options.tools.refresh()
        batch = await self.inbox.claim_async()
        extra: list[InboxItem] = []
        for hook in self._pre_step:
            decision = hook(PreStepContext(self.session_id, turn, step, batch))
            if inspect.isawaitable(decision):
                decision = await decision
            if isinstance(decision, Reject):
                self.inbox.give_back(batch)
                return None
            assert isinstance(decision, Enter)
            extra.extend(decision.messages)
        first_request = self._first_request
        header, reason = self._render_header()
        base = self.session.next_seq
        entered: list[EventData] = [StepStart(turn, step)]
        reset = self._refusal_reset(base + 1)
        if reset is not None:
            entered.append(reset)
        claimed = tuple(item.entry for item in batch if item.entry is not None)
        if claimed:  # the inbox entries this opening takes, logged with their messages (loop/inbox.py)
            entered.append(InboxClaim(claimed))
        for item in (*batch, *extra):
            entered.append(UserMessage(f"u{base + len(entered)}", item.content, item.source))
        if reason is not None:
            entered.append(RequestHeader(header, reason))
        if self.options.dispatcher is not None:
            # the opening travels with the hand-over and is written with request/dispatch (loop/_remote.py)
            refused = self._refused

            def dropped() -> None:  # never written: the claimed messages go back, the owed header stays owed
                self._first_request, self._refused = first_request, refused
                self.inbox.give_back(batch)

            def written() -> Awaitable[None]:
                return self.inbox.taken(claimed)  # the log names them: never entered again

            try:
                self._hold(*entered, written=written, dropped=dropped)
            except BaseException:  # refused by the session's rules: nothing is held
                dropped()
                raise
            self._refused = None
            request = self.last_request = mark_loop_request(session_request(self.session))
            return await dispatch_remote(self.context, self.options.dispatcher, request, turn, step, reason)
        try:
            dispatch_seq, body, digest = await self._open_step(turn, step, entered)
        except BaseException:
            if not self._step_open:  # nothing reached the log: the claimed messages go back to the inbox
                self._first_request = first_request
                self.inbox.give_back(batch)
            raise
        finally:
            if self._step_open:
                self._refused = None  # the reset, if one was owed, is in the log
                await self.inbox.taken(claimed)  # the log names them: never entered again

        stream = self.last_request.config.stream if self.last_request is not None else False
        began = time.monotonic()
        response = await self._send(turn, step, self.provider, body, stream)
        self.last_timings["send"] = time.monotonic() - began
        return await self._answer(turn, step, dispatch_seq, digest, reason, response)

    async def _send(self, turn: int, step: int, provider: Provider, body: bytes, stream: bool) -> ProviderResponse:
        """Send through the retrying sender: each failed attempt is appended as ``llm/retry`` before its wait."""
        self._phase = "send"  # its llm/retry and assistant/chunk appends are the send's time
        settings = self.sender.settings
        chunks = self._chunk_logger(turn, step) if settings.log_chunks else None
        # a streamed attempt that fails after its first byte (cut, broken off by an error event, malformed) is
        # logged with what had arrived of it: its events as assistant/chunk of its attempt, before its llm/retry —
        # so the current attempt's events are kept until it ends
        arrived: dict[int, list[ServerSentEvent]] = {}

        def keep(attempt: int, read: Sequence[ServerSentEvent]) -> None:
            if attempt not in arrived:
                arrived.clear()  # an earlier attempt's events are logged by now, or were not cut
            arrived.setdefault(attempt, []).extend(read)

        keeping = chunks is None and stream
        events = self._events
        progress = AnswerProgress(chunks if not keeping else keep, on_delta=events.push if events is not None else None)
        self._emit(StepStarted(turn, step))

        async def failed_attempt(failed: FailedAttempt) -> None:
            if progress.deltas:  # the caller saw pieces of an answer that will not be logged
                self._emit(AttemptDiscarded(turn, step, failed.attempt, failed.error_type))
            cut = arrived.pop(failed.attempt, None) if failed.received_bytes else None
            if cut:
                await self._append(
                    *(AssistantChunk(turn, step, failed.attempt, i, e.data, e.event) for i, e in enumerate(cut))
                )
            await self._append(retry_record(turn, step, failed))

        try:
            return await self.sender.send(
                provider, body, stream=stream, on_failed_attempt=failed_attempt, progress=progress
            )
        except asyncio.CancelledError:
            await self._record_interrupted(progress)
            raise

    async def _answer(
        self, turn: int, step: int, dispatch_seq: int, digest: str, reason: str | None, response: ProviderResponse
    ) -> tuple[StepRecord, ProviderResponse]:
        """Log the answer (durable before any tool runs), run its tools, close the step."""
        self._phase = "answer"
        answer = answer_records(turn, step, self.session.next_seq, response)
        message = answer[0]
        assert isinstance(message, AssistantMessage)
        response = ProviderResponse(
            message.content, response.usage, response.stop_reason, response.request_id, response.message_id
        )
        plan: dict[str, CallPlan] | None = None
        if any(isinstance(e, ToolCall) for e in answer):
            calls = [b for b in message.content if isinstance(b, ToolCallBlock)]
            held = approval_requests(self.options.tools, turn, step, calls)  # loop/approvals.py
            await self._append(*answer, *held)  # durable before any tool runs
            for call in answer:
                if isinstance(call, ToolCall):
                    self._emit(ToolCallFinished(turn, step, call.call_id, call.name, call.arguments))
            answer = []
            if held:  # no call of this answer runs before every approval is decided; else the turn pauses
                waiting = {r.call_id for r in held}
                decided = await self._await_decisions([c for c in calls if c.id in waiting], {})
                plan = plan_calls(calls, decided)
        return await self._close_step(turn, step, dispatch_seq, digest, reason, response, answer, plan)

    async def _await_decisions(
        self, calls: Sequence[ToolCallBlock], decided: dict[str, ApprovalDecision]
    ) -> dict[str, ApprovalDecision]:
        """Take the decisions on ``calls`` from the inbox into the log (``approval/decision``, naming each entry),
        waiting up to ``options.approval_wait_s`` for the missing ones; raises :class:`Waiting` (the turn pauses)
        when some are still missing then. ``decided``: the decisions the log holds already."""
        waiting = {c.id for c in calls if c.id not in decided}
        deadline = time.monotonic() + self.options.approval_wait_s
        pause = 0.02
        while waiting:
            entries = await self.inbox.store.entries_async(self.session_id)
            stale = self.inbox.stale(entries, decided)
            found = self.inbox.decisions(entries, waiting)
            if found:
                taking: list[EventData] = []
                for e in found:
                    item = e.item
                    assert isinstance(item, InboxDecision)
                    taking.append(
                        ApprovalDecision(
                            item.call_id, item.verdict, e.id, item.reason, item.arguments, item.decided_by, e.time
                        )
                    )
                await self._append(*taking)
                for d in taking:
                    assert isinstance(d, ApprovalDecision)
                    decided[d.call_id] = d
                    waiting.discard(d.call_id)
                await self.inbox.taken([e.id for e in found])
            if stale:
                await self.inbox.taken(stale)  # later decisions of calls decided already never count
            if not waiting:
                break
            left = deadline - time.monotonic()
            if left <= 0:
                raise Waiting(sorted(waiting))
            self._waiting = True  # a cancellation now leaves the turn paused (_run)
            await asyncio.sleep(min(pause, left))
            self._waiting = False
            pause = min(pause * 2, 1.0)
        return decided

    async def _resume_step(self, open_step: OpenStep) -> tuple[StepRecord, ProviderResponse] | object:
        """Finish the step a continued turn left open: its calls' decisions, runs and results, then ``step/end``.
        ``_NEXT`` when the step had no answer (closed as it is: the next step asks again)."""
        turn, step = open_step.turn, open_step.step
        self.last_timings, self._phase, self._step_began = {}, "answer", time.monotonic()
        answer = open_step.answer
        if answer is None or open_step.dispatch is None or open_step.dispatch_seq is None:
            await self._append(StepEnd(turn, step))
            self._step_open = False
            return _NEXT
        decided = dict(open_step.decided)
        if open_step.pending:
            decided = await self._await_decisions(open_step.pending, decided)
        recovery = open_step.recovery
        plan = plan_calls(
            open_step.calls,
            decided,
            answered=open_step.answered,
            interrupted=recovery.interrupted if recovery is not None else (),
        )
        response = ProviderResponse(
            answer.content,
            answer.usage if answer.usage is not None else Usage(),
            answer.stop_reason or "tool_use",
            answer.provider_request_id,
            answer.provider_message_id,
        )
        self._step_open = True
        dispatch = open_step.dispatch
        return await self._close_step(
            turn, step, open_step.dispatch_seq, dispatch.digest, open_step.header_reason, response, [], plan
        )

    def _chunk_logger(self, turn: int, step: int) -> Callable[[int, Sequence[ServerSentEvent]], Awaitable[None]]:
        """Appends each read's server-sent events as ``assistant/chunk`` events (``log_chunks``)."""
        counts: dict[int, int] = {}

        async def log(attempt: int, events: Sequence[ServerSentEvent]) -> None:
            first = counts.get(attempt, 0)
            counts[attempt] = first + len(events)
            await self._append(
                *(AssistantChunk(turn, step, attempt, first + i, e.data, e.event) for i, e in enumerate(events))
            )

        return log

    async def _record_interrupted(self, progress: AnswerProgress) -> None:
        """A cancelled stream: what had arrived, as an ``interrupted`` assistant message (before step/end)."""
        partial = progress.partial()
        if partial is None:
            return
        message = AssistantMessage(
            f"a{self.session.next_seq}",
            partial.content,
            partial.usage,
            "interrupted",
            "append",
            None,
            progress.request_id,
            partial.message_id,
        )
        with contextlib.suppress(FoldlineError):  # the cancellation is what the caller must see; the turn still ends
            await self._append(message)

    async def _close_step(
        self,
        turn: int,
        step: int,
        dispatch_seq: int,
        digest: str,
        reason: str | None,
        response: ProviderResponse,
        pending: list[EventData],
        plan: Mapping[str, CallPlan] | None = None,
    ) -> tuple[StepRecord, ProviderResponse]:
        """Run the answer's tools (as ``plan`` says, when approvals or a recovery decided for some), then append
        ``pending`` (answer events not yet written), their results and ``step/end`` in one append. A tool's
        additional context is put into the durable inbox first, for a later claim."""
        closing = pending
        calls = [b for b in response.content if isinstance(b, ToolCallBlock)]
        answered: dict[str, ToolResult] = {}  # calls a decision or a recovery answers without running them
        runs: list[ToolCallBlock] = []  # the calls the tool runner runs, each with the arguments it runs with
        changed: dict[str, str] = {}
        for call in calls:
            action = plan.get(call.id) if plan is not None else None
            if action is None or action.action == "run":
                if action is not None and action.arguments is not None:
                    changed[call.id] = action.arguments
                    runs.append(msgspec.structs.replace(call, arguments=action.arguments))
                else:
                    runs.append(call)
            elif action.action == "deny":
                answered[call.id] = denied_result(call.id, call.name, action.reason)
            elif action.action == "interrupted":
                answered[call.id] = interrupted_result(call.id, call.name)
            # "skip": answered before (a continued step)
        contexts: list[tuple[str, str]] = []
        if runs:
            # the calls run concurrently, their results in call order (loop/tool_runner.py), each with its call's
            # context set for the tool (loop/calls.py); a cancelled turn logs each call it stopped as
            # interrupted, then run_turn closes the step and the turn
            run = ToolRun(
                runs,
                self.options.tools,
                self.options.tool_run_settings(),
                self.attachments,
                enter=lambda call: self._call_context(turn, step, call),
            )
            try:
                ran = await run.run()
            except asyncio.CancelledError:
                with contextlib.suppress(FoldlineError):
                    stopped = {r.call_id: r for r in run.results()}
                    await self._append(*closing, *_in_call_order(calls, answered, stopped, changed))
                raise
            for result, context in ran:
                answered[result.call_id] = result
                if context:
                    contexts.append((result.call_id, context))
        closing.extend(_in_call_order(calls, answered, {}, changed))
        for call_id, text in contexts:  # one entry per call: a call run again after a crash puts the same one
            entry_id = "context-" + codec.digest_bytes(call_id.encode())[7:39]
            await self.inbox.put_async(InboxItem((TextBlock(text),), "tool-context"), entry_id=entry_id)
        closing.append(StepEnd(turn, step))
        held = self.options.dispatcher is not None
        if held:  # written with the next step's opening or the turn's end, whichever comes first (_hold)
            self._hold(*closing)
        else:
            await self._append(*closing)
        self._step_open = False
        timings = self.last_timings
        timings["total"] = time.monotonic() - self._step_began
        # a held closing written with the turn's end adds that write to this step's total (_append)
        record = StepRecord(
            turn, step, dispatch_seq, digest, response.usage, reason, timings if held else dict(timings)
        )

        def closed() -> None:  # once the closing is in the log
            if self._events is not None:
                for e in closing:
                    if isinstance(e, ToolResult):
                        self._emit(ToolCallResult(turn, step, e.call_id, e.name, e.content, e.is_error))
                self._emit(StepFinished(turn, step, response.usage, response.stop_reason, digest, dispatch_seq))
            for listener in self.step_listeners:
                listener(record)

        if held:
            self._after_write.append(closed)
        else:
            closed()
        return record, response

    @contextlib.contextmanager
    def _call_context(self, turn: int, step: int, call: ToolCallBlock) -> Iterator[None]:
        """The call's context, set while its tool runs (:mod:`.calls`: a sub-agent reads its parent from it)."""
        context = ToolCallContext(
            self.session_id, call.id, call.name, turn, step, self.log, self.provider, self.attachments, self.clock
        )
        token = CURRENT_CALL.set(context)
        try:
            yield
        finally:
            CURRENT_CALL.reset(token)

    def _adopt(self, parent: SessionParent, loaded: Sequence[Envelope]) -> list[EventData]:
        """A sub-agent's session: its first event names the parent (a new session), or it already does."""
        if not loaded:
            return [parent]
        found = lineage(loaded)
        if (
            found is None
            or found.kind != "subagent"
            or (found.parent_id, found.call_id) != (parent.parent_id, parent.call_id)
        ):
            raise ConfigError(
                f"session {self.session_id!r} exists and is not the sub-agent of call {parent.call_id!r} of session "
                f"{parent.parent_id!r}; give the sub-agent another session id"
            )
        return []

    async def _open_step(self, turn: int, step: int, entered: Sequence[EventData]) -> tuple[int, bytes, str]:
        """Build, check and serialize the step's request, then log the step's opening in ONE append.

        ``step/start``, the entered user messages, the owed ``request/header`` and ``request/dispatch`` (the
        digest of the exact body) become durable together, before anything is sent. The live session takes
        the opening events first so the request can be built from it; if anything fails before the append
        (invariant, serialization, the log itself) the session is reloaded from the log, which holds none of
        them. An unreadable attachment is the exception: the opening is logged with ``attachment/quarantine``
        in place of the dispatch, so ``foldline verify`` can name the step it kept from being sent.
        """
        start = self.session.next_seq
        now = self.clock()
        opening = [logged(start + i, now, d) for i, d in enumerate(entered)]
        self.session.extend(opening)
        try:
            request = mark_loop_request(session_request(self.session))
            self.last_request = request
            boundary = self.session.next_seq
            if self.invariant is not None:
                await self.invariant.check(self.session_id, boundary, request, pending=opening)
            serializer = self.provider.serializer
            try:
                body, digest = self._bodies.serialize(request, self.attachments)
            except AttachmentError as exc:
                await self._write(opening, Envelope(boundary, self.clock(), quarantine_record(exc)))
                raise
            check_request_size(len(body))  # over the limit: nothing of the step is logged, nothing sent
            if self.invariant is not None:
                self.invariant.check_body(self.session_id, boundary, digest, serializer)
            if self.options.archive_requests and self.attachments is not None:
                self.attachments.put(body, "application/json")
            dispatch = dispatch_record(turn, step, serializer, body, digest)
            await self._write(opening, Envelope(boundary, self.clock(), dispatch))
            return boundary, body, digest
        except BaseException:
            if not self._step_open:
                self.session = Session(self.session_id, await self.log.read_async(self.session_id))
            raise

    async def _write(self, opening: Sequence[Envelope], last: Envelope) -> None:
        """Append the step's opening plus ``last``; the live session already holds the opening."""
        await self._durably(opening[0].seq, [*opening, last])
        self._step_open = True
        self.session.extend((last,), values_checked=True)  # the log checked its values

    def _render_header(self) -> tuple[EpochHeader, Literal["initial", "resume", "change"] | None]:
        folded = self.session.header()
        assigned = self.options.config
        # the first request starts from the options; later ones from the folded header, unless the options'
        # config was given a new value since this instance last took it (it takes effect: a change snapshot)
        taken = self._first_request or assigned != self._seeded_with
        seed = assigned if taken or folded is None else folded.config
        # the output schema is the turn's output type's, else the options' config's (a turn without one drops it)
        wanted = self._output
        schema, name = (
            (wanted.schema, wanted.name) if wanted is not None else (assigned.output_schema, assigned.output_name)
        )
        if seed.output_schema != schema or seed.output_name != name:
            seed = seed.with_overrides(output_schema=schema, output_name=name)
        for hook in self._request_hooks:
            seed = hook(seed)
            if not isinstance(seed, CallConfig):
                raise TypeError("an agent/request hook must return a CallConfig")
        check_provider(self.provider, seed)
        check_call_config(self.provider.serializer, seed)  # an assigned config or a hook may choose a refused one
        self._seeded_with = assigned  # taken (a refused one is proposed again at the next request)
        seed = header_config(self.provider.serializer, self.session_id, seed)
        system = self.options.system() if callable(self.options.system) else self.options.system
        header = EpochHeader(seed, system or None, self.options.tools.specs() or None)
        if self._first_request:
            self._first_request = False
            return header, ("initial" if folded is None else "resume")
        if header != folded:
            return header, "change"
        return header, None

    # -------------------------------------------------------------- log writes

    _step_open = False
    _output: OutputType[Any] | None = None  # the output type of the turn that runs
    _events: EventBuffer | None = None  # the caller's event stream while a turn runs under stream()
    _turn_start_seq = 0
    _step_began = 0.0
    _waiting = False  # waiting for approval decisions (a cancellation then leaves the turn paused)

    _unwritten: list[Envelope]  # held events: in the live session, not yet in the log (_hold)
    _after_write: list[Callable[[], Awaitable[None] | None]]  # what follows once the held events are written
    _on_drop: list[Callable[[], None]]  # what undoes holding them, if they are given up unwritten

    async def _append(self, *datas: EventData) -> None:
        """Append ``datas`` — after the held events, in the same write, when some are held (:meth:`_hold`)."""
        start = self.session.next_seq
        now = self.clock()
        events = [logged(start + i, now, d) for i, d in enumerate(datas)]
        held = self._unwritten
        if held:
            began = time.monotonic()
            await self._durably(held[0].seq, [*held, *events])
            self._unwritten = []
            if "total" in self.last_timings:  # a closed step's closing, written with the turn's end: its time
                self.last_timings["total"] += time.monotonic() - began
        else:
            await self._durably(start, events)
        self.session.extend(events, values_checked=True)  # the log checked their values
        self._on_drop = []
        self._note_recent(events)
        if self._after_write:
            reports, self._after_write = self._after_write, []
            for report in reports:
                done = report()
                if done is not None:
                    await done

    def _hold(
        self,
        *datas: EventData,
        written: Callable[[], Awaitable[None] | None] | None = None,
        dropped: Callable[[], None] | None = None,
    ) -> None:
        """Take ``datas`` into the live session now and write them with the next append.

        On the dispatched path every write is a transaction of the log; a step's closing (its tool results
        and ``step/end``) and a turn's ``turn/start`` are held so they go out with the next step's opening or
        the turn's end — one write fewer per step. Nothing slow runs while events are held: the next opening
        is built at once (a pre-step hook or a tool source writes them first; a compaction's ``compaction/start``
        is itself an append), and a failure or cancellation writes them before the turn is closed
        (:meth:`_close_turn`). A crash in between is a crash before the closing was written: the tool calls
        are answered as the crash policy says (loop/recovery.py). Stream events and step listeners of a held
        closing are reported once it is written (``written``). A dispatched step's opening is held too: it
        travels with the hand-over and is written with its ``request/dispatch`` (loop/_remote.py); ``dropped``
        undoes what holding it did (the inbox claim, the owed header) should it be given up unwritten.
        """
        start = self.session.next_seq
        now = self.clock()
        events = [logged(start + i, now, d) for i, d in enumerate(datas)]
        # the log checks their values when it takes them; given up unwritten, the session is read again
        self.session.extend(events, values_checked=True)
        self._unwritten.extend(events)
        self._note_recent(events)
        if written is not None:
            self._after_write.append(written)
        if dropped is not None:
            self._on_drop.append(dropped)

    def _note_recent(self, events: Sequence[Envelope]) -> None:
        """Keep the events from the session's last request/dispatch on (:attr:`LoopContext.recent`)."""
        for i in range(len(events) - 1, -1, -1):
            if isinstance(events[i].data, RequestDispatch):
                self._recent = list(events[i:])
                return
        if self._recent:
            self._recent.extend(events)

    def _drop_held(self, session: Session) -> None:
        """Give up the held events (they could not be written): the live session becomes ``session``."""
        undo, self._on_drop = self._on_drop, []
        self._unwritten, self._after_write, self._recent = [], [], []
        self.session = session
        for step in reversed(undo):
            step()

    async def _durably(self, start: int, events: list[Envelope]) -> None:
        """Append ``events`` at ``start``, waiting out a log that does not answer for up to ``outage_s``.

        A failure whose outcome is unknown is settled by reading the log back: the batch either is there
        whole (done) or not at all (append again). Refusals (a stale writer, a broken rule, another
        writer's events at ``start``) are raised at once.
        """
        began = time.monotonic()
        try:
            await append_durably(self.log, self.session_id, self.lease, start, events, self.options.outage_s)
        except FencedError as exc:
            if self.log.erased(self.session_id):  # an erasure took the session: say so, not "another writer"
                raise ContentErased(self.session_id, "the loop stopped; nothing of this step was written") from exc
            raise
        finally:
            timings = self.last_timings
            timings[self._phase] = timings.get(self._phase, 0.0) + time.monotonic() - began

    async def _close_turn(self, turn: int, step: int, reason: TurnEndReason) -> None:
        """Leave the log consistent after a failure or cancellation: answer the tool calls still unanswered,
        close the open step and end the turn (the events :func:`~foldline.core.repair.closing_events` names
        for the turn as logged). Should this fail too, the next instance to load the session closes it."""
        try:
            if self._unwritten:  # held events first (a closing, an opening): the turn is closed as they leave it
                try:
                    await self._append()
                except FoldlineError:  # not written: the live session goes back to what the log holds
                    self._drop_held(Session(self.session_id, await self.log.read_async(self.session_id)))
            events = await self.log.read_async(self.session_id, self._turn_start_seq)
            state = open_turn(events)
            answers = {}
            if state is not None and state.step is not None:  # a denied call is answered with its denial
                step_state = state.step
                answers = {
                    c.id: denied_result(c.id, c.name, d.reason)
                    for c in step_state.unanswered
                    if (d := step_state.decided.get(c.id)) is not None and d.verdict == "deny"
                }
            closing = closing_events(events, reason, answers)
            self._step_open = False
            if closing:
                await self._append(*closing)
        except FoldlineError:
            pass  # the original error is what the caller needs to see; the log stays valid either way


class LoopContext:
    """One loop instance as the code that does part of its step sees it: pressure relief
    (:class:`~.pressure.PressureContext`) and a dispatched step (:class:`~._remote.DispatchContext`). It reads
    the instance's live state and appends, sends and answers through the instance's own paths — the only
    ways those modules reach the loop."""

    __slots__ = ("__weakref__", "_agent")

    def __init__(self, agent: Agent) -> None:
        self._agent = agent

    @property
    def session_id(self) -> str:
        return self._agent.session_id

    @property
    def session(self) -> Session:
        return self._agent.session

    @property
    def epoch(self) -> int:
        return self._agent.lease.epoch

    @property
    def provider(self) -> Provider:
        return self._agent.provider

    @property
    def attachments(self) -> AttachmentStore | None:
        return self._agent.attachments

    @property
    def config(self) -> CallConfig:
        return self._agent.options.config

    @property
    def archive_requests(self) -> bool:
        return self._agent.options.archive_requests

    @property
    def invariant(self) -> InvariantCompanion | None:
        return self._agent.invariant

    @property
    def timings(self) -> dict[str, float]:
        return self._agent.last_timings

    async def append(self, *datas: EventData) -> None:
        """Append ``datas`` (after the held events, in the same write)."""
        await self._agent._append(*datas)

    @property
    def held(self) -> Sequence[Envelope]:
        """The events taken into the session and not written yet (a step's opening, the previous closing)."""
        return tuple(self._agent._unwritten)

    @property
    def recent(self) -> Sequence[Envelope]:
        """The session's events from its last ``request/dispatch`` on, held or written (empty when not known)."""
        agent = self._agent
        return tuple(agent._recent) if agent._recent else tuple(agent._unwritten)

    async def send(self, turn: int, step: int, provider: Provider, body: bytes, stream: bool) -> ProviderResponse:
        return await self._agent._send(turn, step, provider, body, stream)

    async def answer(
        self, turn: int, step: int, dispatch_seq: int, digest: str, reason: str | None, response: ProviderResponse
    ) -> tuple[StepRecord, ProviderResponse]:
        return await self._agent._answer(turn, step, dispatch_seq, digest, reason, response)
