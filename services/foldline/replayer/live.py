"""Past the divergence: the changed agent goes on against a provider, as a fork child of the recorded session.

The child's log begins with the recorded session's events up to the diverging step (the turn's start when the
step is its turn's first) — a fork seed (``core/fork.py``): same seqs, a ``session/end-seed`` naming the parent
and the seed's length, and the cut turn closed ``interrupted`` when the cut falls inside one. A new loop
instance with the changed agent then runs the recorded inputs from there on: the diverging step's inputs, then
each later recorded turn's first-step inputs. Its requests go to a real provider adapter (the emulator, or
one configured), its tool calls to the change's tools — so ``live`` past a tool call needs ``Change.tools``.

The child is written to the log given (``foldline replay --live --as NEW_ID``) or to a log in memory.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..adapters.memory_log import MemoryEventLog
from ..config import Config
from ..config.factories import providers
from ..core.content import Usage
from ..core.events import Envelope
from ..core.fork import fork_seed
from ..core.header import EpochHeader
from ..errors import ConflictError, InvalidChange, SessionExists
from ..export import referenced_images
from ..loop.agent import Agent, StepRecord
from ..loop.options import AgentOptions, wall_clock_ms
from ..loop.tools import Toolset
from ..ports.attachments import AttachmentStore
from ..ports.event_log import EventLog
from ..providers.base import Provider
from ..providers.header_defaults import prompt_cache_key
from ..replay.verify import verify_events
from .change import Change, build_tools
from .engine import Found
from .recording import RecordedStep, Recording, Script

__all__ = ["Live", "ProviderFactory", "configured_providers", "continue_live", "emulated_provider_for"]

#: (serializer name, provider name) of the recorded session → the provider the live child talks to.
ProviderFactory = Callable[[str, str], Provider]


def emulated_provider_for(serializer: str, provider: str) -> Provider:
    """The in-process emulator, speaking the recorded session's wire format."""
    from ..providers.emulated import emulated_provider, wire_format_of

    return emulated_provider(wire_format_of(serializer, provider))


def configured_providers(config: Config) -> ProviderFactory:
    """The configured provider for a recorded wire format when ``config`` names one (``FOLDLINE_ANTHROPIC_URL``
    for ``anthropic-messages``, ``FOLDLINE_OPENAI_URL`` for ``openai-chat``), else the emulator."""

    def make(serializer: str, provider: str) -> Provider:
        p = config.providers
        if (provider, serializer) == ("anthropic", "anthropic-messages") and p.anthropic_url:
            return providers(config)["anthropic"]
        if (provider, serializer) == ("openai", "openai-chat") and p.openai_url:
            return providers(config)["openai"]
        return emulated_provider_for(serializer, provider)

    return make


@dataclass(frozen=True, slots=True)
class Live:
    """Go on past the divergence: the child's id (default ``<session>.replay``), the log it is written to
    (default: one in memory), the provider it talks to (default: the emulator), and the attachment store beside
    that log (the images of the recording — its seed's and its inputs' — are copied there when it lacks them;
    default: the recording's store)."""

    child_id: str | None = None
    log: EventLog | None = None
    provider: ProviderFactory | None = None
    attachments: AttachmentStore | None = None


def _copy_images(events: Sequence[Envelope], source: AttachmentStore | None, target: AttachmentStore) -> None:
    """Every image ``events`` reference into ``target`` (verified on the way), where it is not there yet."""
    for e in events:
        for ref in referenced_images(e):
            if source is not None and source is not target and not target.exists(ref.attachment_id):
                data = source.get(ref.attachment_id, ref)
                target.put(data, ref.media_type, width=ref.width, height=ref.height)


@dataclass(frozen=True, slots=True)
class LiveRun:
    child: str
    seed_length: int
    turns: int
    steps: tuple[StepRecord, ...]
    verified: int
    checked: int

    @property
    def usage(self) -> Usage:
        total = Usage()
        for r in self.steps:
            u = r.usage
            total = Usage(
                total.input + u.input,
                total.output + u.output,
                total.cache_read + u.cache_read,
                total.cache_write + u.cache_write,
            )
        return total


def _cut(script: Script, found: Found) -> tuple[int, RecordedStep | None, int]:
    """(first seq the child does not inherit, the recorded step whose inputs it starts with, its turn's index)."""
    call = found.call
    if call is None:
        last_turn = len(script.turns)
        return len(script.events), None, last_turn
    if call.step is not None:
        step = call.step
        index = next(i for i, t in enumerate(script.turns) if step in t.steps)
        turn = script.turns[index]
        before = (turn.turn, step.step) in script.actions
        return (turn.start_seq if step.step == 0 and not before else step.start_seq), step, index
    seq = call.seq
    index = max(i for i, t in enumerate(script.turns) if t.start_seq < seq)
    turn = script.turns[index]
    nxt = next((s for s in turn.steps if s.start_seq > seq), None)
    first = turn.steps.index(nxt) if nxt is not None else len(turn.steps)
    return (turn.start_seq if first == 0 else seq), nxt, index


def _header(script: Script, found: Found) -> EpochHeader:
    if found.recorded_request is not None:
        return found.recorded_request.header
    return next(s.header for t in script.turns for s in t.steps if s.header is not None)


async def continue_live(recording: Recording, script: Script, found: Found, change: Change, live: Live) -> LiveRun:
    """Write the fork child and run the changed agent on it (see the module docstring)."""
    sid = recording.session_id
    header = _header(script, found)
    if change.tools is None and header.tools:
        names = ", ".join(t.name for t in header.tools)
        raise InvalidChange(
            f"going on live runs the tools the model calls, and the recorded agent offers {names}: pass the "
            "agent's tools (--tools MODULE:OBJECT, or Change.tools)"
        )
    tools = build_tools(change.tools) if change.tools is not None else Toolset()
    cut, first, turn_index = _cut(script, found)
    log = live.log if live.log is not None else MemoryEventLog()
    child = live.child_id or f"{sid}.replay"
    if child == sid:
        raise SessionExists(child)
    at_seq = max(0, cut - 1)
    seed = fork_seed(recording.events, sid, at_seq, wall_clock_ms())
    if log.head(child) != 0:
        raise SessionExists(child)
    store = live.attachments if live.attachments is not None else recording.attachments
    if store is not None:  # the seed's images, and those of the recorded inputs the child is given
        _copy_images(recording.events, recording.attachments, store)
    try:
        log.append(child, 0, seed, lease=log.acquire(child))
    except ConflictError:
        raise SessionExists(child) from None
    config = change.apply(header.config)
    if config.prompt_cache_key == prompt_cache_key(sid):  # derived for the parent: the child derives its own
        config = config.with_overrides(prompt_cache_key=None)
    dispatch = next(c.step.dispatch for c in script.calls if c.step is not None and c.step.dispatch is not None)
    factory = live.provider or emulated_provider_for
    provider = factory(dispatch.serializer, config.provider)
    options = AgentOptions(config=config, system=change.system or header.system, tools=tools, pressure=change.pressure)
    records: list[StepRecord] = []
    turns = 0
    try:
        agent = await Agent.open(child, log, provider, options, attachments=store)
        agent.step_listeners.append(records.append)
        inputs = [first.inputs] if first is not None else []
        inputs += [t.steps[0].inputs for t in script.turns[turn_index + 1 :] if t.steps]
        for batch in inputs:
            for item in batch:
                agent.inject(item.content, item.source)
            await agent.run_turn(None)
            turns += 1
    finally:
        await provider.aclose()
    report = verify_events(child, log.read(child), store)
    return LiveRun(child, at_seq + 1, turns, tuple(records), report.matched, report.checked)
