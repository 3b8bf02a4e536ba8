"""One run of a changed agent over a recorded session: the loop's own code, fed the recording.

The agent is a real :class:`~foldline.loop.Agent` — the same step, header render, request build, invariant
companion, serializer and body cache as in production — on a scratch log in memory. What it is given:

* **inputs**: an ``agent/pre-step`` hook enters, at each step, the user messages the recorded step entered
  (with their sources); a turn the recording ended before its next step ends there too (rejected, or
  failed);
* **a provider** (:class:`ReplayProvider`) that, for each loop request, compares the changed agent's body
  with the recorded one — the sha256 the agent just logged in its ``request/dispatch`` against the digest
  the recording logged for the same step (equal digests: equal bytes) — and, while they are equal, answers
  with the recorded answer. A compaction's summarize one-shot is compared with the recorded one
  (``compaction/summary.inputDigest``, or its rebuild) and answered with the recorded summary. The first
  request that differs raises :class:`Diverged`, which ends the run;
* **tools** that answer each call with the recorded result (nothing runs, nothing has a side effect), and
  show the model the change's tool specs, or the recorded ones of the step;
* **the recorded header, step by step**: the system prompt and tools of each step's recorded request unless
  the change sets them; the recorded call config with the change's fields, through an ``agent/request`` hook;
* **the recorded pressure actions**: before a step where the recording trimmed or compacted, the agent's
  :class:`~foldline.loop.pressure.PressurePolicy` is one that makes exactly that action (its budget just under
  the recorded estimate, its recent window ending where the recorded range ends, …); elsewhere none. With
  ``Change.pressure`` the agent's own policy runs instead.

The recorded side is folded as ``foldline verify`` folds it (:class:`~foldline.core.projection.Session` over the
log, :func:`~foldline.replay.step.session_request` at each step's boundary), so every recorded request the
changed one is compared with is the request rebuilt from the log; the recorded body a divergence is diffed
against is that request serialized with the logged serializer version and checked against the logged digest.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from ..adapters.memory_log import MemoryEventLog
from ..core import codec
from ..core import compaction as cc
from ..core.content import TextBlock, ToolCallBlock, Usage
from ..core.events import CompactionStart, Envelope, RequestDispatch
from ..core.header import CallConfig, ToolSpec
from ..core.projection import Message, Session
from ..core.request import GenerateOptions
from ..errors import (
    AttachmentError,
    ContextOverflow,
    FoldlineError,
    InvalidChange,
    NotReplayable,
    ProviderError,
    ReplayError,
)
from ..loop.agent import Agent
from ..loop.hooks import Enter, PreStepContext, Reject
from ..loop.options import AgentOptions
from ..loop.pressure import PressurePolicy
from ..loop.tools import ToolOutput, Toolset
from ..ports.event_log import WriterLease
from ..providers.base import Body, Provider, ProviderResponse, Serializer, serializer_for
from ..providers.retry import RetryingSender
from ..providers.streaming import AnswerProgress
from ..replay.step import session_request
from ..replay.verify import summarize_serializer
from .change import Change, SystemSource, build_tools
from .recording import PressureAction, RecordedCall, RecordedCompaction, RecordedStep, RecordedTrims, Recording, Script

__all__ = ["Diverged", "Found", "ReplayProvider", "RunResult", "recorded_body", "run_once"]

_Progress = Callable[[], None]
_PolicyFactory = Callable[[], PressurePolicy]
_TRIM_NOTE = re.compile(r"\[trimmed: (\d+) of (\d+) characters")


class Diverged(Exception):
    """The changed agent's provider call differs from the recorded one (ends the run)."""

    def __init__(self, call: RecordedCall | None, sent: Literal["step", "summarize"], body: bytes, note: str | None):
        super().__init__(note or "the request differs from the recorded one")
        self.call = call
        self.sent = sent
        self.body = body
        self.note = note


class _RecordedEnd(Exception):
    """The recording ends the turn here: the replayed loop ends it the way it ends a failed turn."""


@dataclass(frozen=True, slots=True)
class Found:
    """What a run found at its divergence: the recorded and the changed side of the first differing call."""

    call: RecordedCall | None
    sent: Literal["step", "summarize"]
    note: str | None
    changed_body: bytes
    changed_request: GenerateOptions | None  # the loop request the changed agent built (a step)
    recorded_request: GenerateOptions | None  # the recorded request of that step, rebuilt from the log
    previous_recorded: GenerateOptions | None  # the recorded request of the step before it
    summarize: tuple[GenerateOptions, Serializer] | None  # the recorded summarize one-shot (a compaction)


@dataclass(frozen=True, slots=True)
class RunResult:
    compared: int  # recorded loop requests the changed agent built identically
    found: Found | None
    seconds: float


class _ScratchLog(MemoryEventLog):
    """The replayed agent's log, in memory; remembers the last event appended per session."""

    def __init__(self) -> None:
        super().__init__()
        self.last: dict[str, Envelope] = {}

    def append(
        self, session_id: str, expected_seq: int, events: Sequence[Envelope], *, lease: WriterLease | None = None
    ) -> int:
        head = super().append(session_id, expected_seq, events, lease=lease)
        if events:
            self.last[session_id] = events[-1]
        return head


class _RecordedFold:
    """The recorded log folded forward as ``verify`` folds it; keeps the messages each compaction summarized."""

    def __init__(self, script: Script) -> None:
        self.events = script.events
        self.session = Session(script.session_id)
        self.pos = 0
        self.regions: dict[int, Sequence[Message]] = {}  # compaction/start seq → the messages before it

    def advance(self, seq: int) -> None:
        """Fold the events before ``seq`` (a seq already folded past is a no-op: the fold never goes back)."""
        session = self.session
        while self.pos < seq:
            e = self.events[self.pos]
            if isinstance(e.data, CompactionStart):
                self.regions[e.seq] = session.derive_messages()
            session.append(e)
            self.pos += 1

    def request(self) -> GenerateOptions:
        return session_request(self.session)


class ReplayProvider(Provider):
    """Answers the replayed agent from the recording while its requests are the recorded ones."""

    def __init__(self, name: str, serializer: Serializer, run: _Run) -> None:
        self.name = name
        self.serializer = serializer
        self._run = run

    async def send(
        self, body: Body, *, stream: bool = False, progress: AnswerProgress | None = None
    ) -> ProviderResponse:
        return self._run.answer(body)


class _ReplayTools(Toolset):
    """The recorded tool results, in call order; the change's specs or the recorded step's."""

    def __init__(self, run: _Run) -> None:
        super().__init__()
        self._run = run

    def specs(self) -> tuple[ToolSpec, ...]:
        return self._run.tool_specs()

    async def call(self, name: str, arguments: str) -> ToolOutput:
        return self._run.tool_result(name)


class _Run:
    def __init__(
        self, recording: Recording, script: Script, change: Change, *, on_request: _Progress | None = None
    ) -> None:
        self.recording = recording
        self.script = script
        self.change = change
        self.system: SystemSource | None = change.system
        self.tools: Toolset | None = build_tools(change.tools) if change.tools is not None else None
        self.fold = _RecordedFold(script)
        self.scratch = _ScratchLog()
        self.turns = {t.turn: t for t in script.turns}
        self.call_index = 0
        self.compared = 0
        self.current: RecordedStep | None = None
        self.current_request: GenerateOptions | None = None
        self.previous_request: GenerateOptions | None = None
        self.results: list[tuple[str, ToolOutput]] = []
        self.expected_failure: BaseException | None = None
        self.agent: Agent | None = None
        self.on_request = on_request

    # ------------------------------------------------------------------ the agent's parts

    def system_text(self) -> str:
        if self.system is not None:
            return self.system() if callable(self.system) else self.system
        return self._recorded().system or ""

    def request_hook(self, seed: CallConfig) -> CallConfig:
        return self.change.apply(self._recorded().config)

    def tool_specs(self) -> tuple[ToolSpec, ...]:
        if self.tools is not None:
            return self.tools.specs()
        return self._recorded().tools or ()

    def tool_result(self, name: str) -> ToolOutput:
        if not self.results:
            raise _RecordedEnd("the recording has no result for this tool call")
        recorded_name, output = self.results.pop(0)
        if recorded_name != name:
            step = self.current
            raise NotReplayable(
                self.script.session_id,
                step.start_seq if step is not None else 0,
                f"the recorded tool results are not in the order of the answer's calls ({recorded_name!r} for a "
                f"call of {name!r})",
            )
        return output

    def _recorded(self) -> GenerateOptions:
        if self.current_request is None:  # pragma: no cover - the pre-step hook sets it before any render
            raise RuntimeError("no recorded step is current")
        return self.current_request

    def pre_step(self, ctx: PreStepContext) -> Enter | Reject:
        turn = self.turns.get(ctx.turn)
        if turn is None or ctx.step >= len(turn.steps):
            if turn is not None and turn.end_reason == "blocked":
                return Reject("the recording's step was rejected here")
            raise _RecordedEnd(f"the recording ends turn {ctx.turn} before step {ctx.step}")
        step = turn.steps[ctx.step]
        self.fold.advance(step.boundary)
        if self.fold.pos != step.boundary:  # pragma: no cover - the fold only ever moves to later seqs
            raise RuntimeError(f"the recorded fold is at seq {self.fold.pos}, past step boundary {step.boundary}")
        self.previous_request = self.current_request
        self.current, self.current_request = step, self.fold.request()
        self.results = [(r.name, ToolOutput(r.content, r.is_error)) for r in step.results]
        self._set_pressure((ctx.turn, ctx.step + 1))
        return Enter(tuple(step.inputs))

    # ------------------------------------------------------------------ the provider

    def answer(self, body: Body) -> ProviderResponse:
        sid = self.script.session_id
        last = self.scratch.last.get(sid)
        sent: Literal["step", "summarize"]
        if last is not None and isinstance(last.data, RequestDispatch):
            sent = "step"
        elif last is not None and isinstance(last.data, CompactionStart):
            sent = "summarize"
        else:  # pragma: no cover - the loop logs a dispatch or a compaction/start before every call
            raise NotReplayable(sid, last.seq if last else 0, "a provider call the loop logged nothing before")
        call = self.script.calls[self.call_index] if self.call_index < len(self.script.calls) else None
        if call is None or call.kind != sent:
            raise Diverged(call, sent, bytes(body), self._mismatch_note(call, sent))
        if sent == "step":
            step = call.step
            assert step is not None
            assert step.dispatch is not None
            assert isinstance(last.data, RequestDispatch)
            if step is not self.current:
                raise Diverged(call, sent, bytes(body), self._mismatch_note(call, sent))
            recorded = step.dispatch
            if last.data.digest != recorded.digest or last.data.bytes != recorded.bytes:
                raise Diverged(call, sent, bytes(body), None)
            self.call_index += 1
            self.compared += 1
            if self.on_request is not None:
                self.on_request()
            return self._step_answer(step)
        compaction = call.compaction
        if compaction is None:
            raise NotReplayable(sid, call.seq, "the recording ends inside this compaction")
        summary = compaction.summary
        if summary is None:  # the recorded summarize call failed: nothing was logged to compare the body with
            self.call_index += 1
            failure = ProviderError(f"the recording's summarize call for the compaction at seq {call.seq} failed")
            self.expected_failure = failure
            raise failure
        expected = summary.input_digest
        if expected is None:
            request, serializer = self.recorded_summarize(compaction)
            expected = codec.digest_bytes(serializer.serialize(request, self.recording.attachments))
        if codec.digest_bytes(bytes(body)) != expected:
            raise Diverged(call, sent, bytes(body), None)
        self.call_index += 1
        return ProviderResponse((TextBlock(summary.summary),), summary.usage or Usage(), "end_turn")

    def _step_answer(self, step: RecordedStep) -> ProviderResponse:
        message = step.answer
        if message is None:
            turn = self.turns[step.turn]
            failure: ProviderError
            if turn.end_reason == "context-overflow":
                failure = ContextOverflow("replay", 400, "the recorded request did not fit the model's context window")
            else:
                failure = ProviderError(f"the recording has no answer to the request at seq {step.dispatch_seq}")
            self.expected_failure = failure
            raise failure
        stop = message.stop_reason
        if stop is None:
            stop = "tool_use" if any(isinstance(b, ToolCallBlock) for b in message.content) else "end_turn"
        return ProviderResponse(
            message.content, message.usage or Usage(), stop, message.provider_request_id, message.provider_message_id
        )

    def _mismatch_note(self, call: RecordedCall | None, sent: str) -> str:
        where = self._where(self.current)
        if call is None:
            return f"the changed agent made a provider call ({sent}) after the recording's last one"
        if call.kind == "summarize":
            return (
                f"the recording compacted at seq {call.seq} before its next request; the changed agent sent "
                f"{where}'s request instead"
            )
        if sent == "summarize":
            return f"the changed agent compacted before {self._where(call.step)}; the recording did not"
        return f"the changed agent sent {where}'s request where the recording sent {self._where(call.step)}'s"

    @staticmethod
    def _where(step: RecordedStep | None) -> str:
        return f"turn {step.turn} step {step.step}" if step is not None else "a step"

    def recorded_summarize(self, compaction: RecordedCompaction) -> tuple[GenerateOptions, Serializer]:
        """The recorded summarize one-shot of ``compaction``, rebuilt from the log as ``verify`` rebuilds it."""
        summary = compaction.summary
        assert summary is not None
        if compaction.seq not in self.fold.regions:
            self.fold.advance(compaction.seq + 1)
        messages = self.fold.regions[compaction.seq]
        config = CallConfig(summary.provider, summary.model, max_tokens=summary.max_tokens)
        request = cc.summarize_request(
            messages[compaction.start : compaction.end + 1], config, summary.prompt_version or 1
        )
        if summary.serializer is not None and summary.serializer_version is not None:
            return request, serializer_for(summary.serializer, summary.serializer_version)
        return request, summarize_serializer(summary.provider)

    # ------------------------------------------------------------------ pressure

    def _set_pressure(self, key: tuple[int, int]) -> None:
        if self.change.pressure is not None or self.agent is None:
            return
        action = self.script.actions.get(key)
        self.agent.options.pressure = self._policy(action) if action is not None else None

    def _policy(self, action: PressureAction) -> PressurePolicy:
        """A policy under which the loop's pressure relief makes exactly ``action`` at that step."""
        self.fold.advance(action.seq)
        messages = self.fold.session.derive_messages()
        estimate = cc.estimate_tokens(messages)
        if isinstance(action, RecordedCompaction):
            summary = action.summary
            keep = cc.estimate_tokens(messages[action.end + 1 :])
            header = self.fold.session.header()
            own = summary is None or (
                header is not None
                and (header.config.provider, header.config.model) == (summary.provider, summary.model)
            )
            summarize = None if own or summary is None else CallConfig(summary.provider, summary.model)
            max_tokens = summary.max_tokens if summary is not None else 1  # a failed call logged none
            return self._checked(
                action.seq,
                lambda: PressurePolicy(
                    estimate - 1,
                    keep_recent_tokens=keep,
                    trim_over_tokens=None,
                    summary_max_tokens=max_tokens,
                    summarize_config=summarize,
                ),
            )
        positions = [t.surface_op.start for _, t in action.trims if not isinstance(t.surface_op, str)]
        before = [cc.message_tokens(messages[p]) for p in positions]
        keep = cc.estimate_tokens(messages[max(positions) + 1 :])
        kept = self._kept_chars(action)
        return self._checked(
            action.seq,
            lambda: PressurePolicy(
                estimate - 1, keep_recent_tokens=keep, trim_over_tokens=min(before) - 1, trim_keep_chars=kept
            ),
        )

    def _checked(self, seq: int, make: _PolicyFactory) -> PressurePolicy:
        try:
            return make()
        except ValueError as exc:
            raise NotReplayable(
                self.script.session_id, seq, f"no pressure policy makes the recorded action again: {exc}"
            ) from None

    def _kept_chars(self, action: RecordedTrims) -> int:
        seq, first = action.trims[0]
        text = "\n".join(p.text for p in first.content if isinstance(p, TextBlock))
        found = _TRIM_NOTE.search(text)
        if found is None:
            raise NotReplayable(self.script.session_id, seq, "a trimmed tool result without the loop's trim note")
        return int(found.group(2)) - int(found.group(1))

    # ------------------------------------------------------------------ the run

    async def run(self) -> RunResult:
        began = time.monotonic()
        sid, script = self.script.session_id, self.script
        if script.seed_end:
            self.scratch.append(sid, 0, list(script.events[: script.seed_end]), lease=self.scratch.acquire(sid))
        sender = RetryingSender()
        for i, turn in enumerate(script.turns):
            if i == 0 or turn.opens_instance:
                self.agent = await self._open_agent(i, sender)
            agent = self.agent
            assert agent is not None
            recorded_steps = len(turn.steps)
            agent.options.max_steps_per_turn = (
                recorded_steps if turn.end_reason == "interrupted" else recorded_steps + 1
            )
            self._set_pressure((turn.turn, 0))
            self.expected_failure = None
            try:
                await agent.run_turn(None)
            except Diverged as exc:
                return RunResult(self.compared, self._found(exc), time.monotonic() - began)
            except _RecordedEnd:
                pass
            except (ReplayError, InvalidChange):
                raise
            except ProviderError as exc:
                if exc is not self.expected_failure:
                    raise self._failed(exc) from exc
            except AttachmentError as exc:
                step = self.current
                if step is None or step.quarantine_seq is None:
                    raise self._failed(exc) from exc
            except FoldlineError as exc:
                raise self._failed(exc) from exc
        if self.call_index < len(script.calls):
            call = script.calls[self.call_index]
            note = f"the changed agent stopped where the recording went on to {self._where(call.step)} (seq {call.seq})"
            found = Found(call, call.kind, note, b"", None, None, self.current_request, None)
            return RunResult(self.compared, found, time.monotonic() - began)
        return RunResult(self.compared, None, time.monotonic() - began)

    async def _open_agent(self, turn_index: int, sender: RetryingSender) -> Agent:
        """A new loop instance where the recording began one: its serializer and provider from the recording."""
        script = self.script
        later = [s for t in script.turns[turn_index:] for s in t.steps]
        dispatch = next((s.dispatch for s in later if s.dispatch is not None), None)
        header = next((s.header for s in later if s.header is not None), None)
        if dispatch is None or header is None:  # the last instance made no request: nothing left to compare
            dispatch = next(c.step.dispatch for c in script.calls if c.step is not None and c.step.dispatch)
            header = next(s.header for t in script.turns for s in t.steps if s.header is not None)
        assert dispatch is not None
        assert header is not None
        config = self.change.apply(header.config)
        provider = ReplayProvider(
            config.provider, serializer_for(dispatch.serializer, dispatch.serializer_version), self
        )
        options = AgentOptions(
            config=config,
            system=self.system_text,
            tools=_ReplayTools(self),
            pressure=self.change.pressure,
            sender=sender,
            outage_s=0.0,
        )
        agent = await Agent.open(
            script.session_id, self.scratch, provider, options, attachments=self.recording.attachments
        )
        agent.on_pre_step(self.pre_step)
        agent.on_request(self.request_hook)
        return agent

    def _failed(self, exc: FoldlineError) -> ReplayError:
        hint = ""
        if isinstance(exc, AttachmentError):
            hint = (
                "; the recording's attachment objects must be at hand (an export file: pass the directory "
                "`foldline export --attachments` wrote)"
            )
        return ReplayError(
            self.script.session_id,
            f"at {self._where(self.current)} the changed agent failed: {type(exc).__name__}: {exc}{hint}",
        )

    def _found(self, exc: Diverged) -> Found:
        call = exc.call
        summarize: tuple[GenerateOptions, Serializer] | None = None
        compaction = call.compaction if call is not None and exc.sent == "summarize" else None
        if compaction is not None and compaction.summary is not None:
            summarize = self.recorded_summarize(compaction)
        changed = self.agent.last_request if self.agent is not None and exc.sent == "step" else None
        return Found(
            call, exc.sent, exc.note, exc.body, changed, self.current_request, self.previous_request, summarize
        )


async def run_once(
    recording: Recording, script: Script, change: Change, on_request: _Progress | None = None
) -> RunResult:
    """Replay ``script`` through an agent with ``change``, until the first request that differs or the end."""
    return await _Run(recording, script, change, on_request=on_request).run()


def recorded_body(recording: Recording, step: RecordedStep, request: GenerateOptions) -> bytes:
    """The recorded step's body: its rebuilt request serialized with the logged serializer version, checked
    against the logged digest (a recording that does not rebuild is :class:`NotReplayable`)."""
    dispatch = step.dispatch
    assert dispatch is not None
    assert step.dispatch_seq is not None
    body = serializer_for(dispatch.serializer, dispatch.serializer_version).serialize(request, recording.attachments)
    if codec.digest_bytes(body) != dispatch.digest or len(body) != dispatch.bytes:
        raise NotReplayable(
            recording.session_id,
            step.dispatch_seq,
            f"the recorded request does not rebuild to its logged digest {dispatch.digest}; run foldline verify",
        )
    return body
