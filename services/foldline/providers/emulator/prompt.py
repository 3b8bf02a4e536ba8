"""What a parser builds from a request body: the conversation a script sees and the blocks tokens count.

A parser adds the blocks that lead the prompt (tools, Anthropic's system) and then each wire message; after
each message it records a :class:`Mark` (how far the turns, blocks and system texts reached, and what the
next message's checks need of it). A parse may also *resume* after a prefix of the message list that an
earlier request held byte for byte (:class:`Resume`, :mod:`.prefix`): the prefix's turns, blocks and marks
are taken as they were, and the digest chain goes on from the state it had after them when the blocks that
lead the prompt are the same — so parsing a request costs its new messages, not the conversation.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .checks import RequestRejected
from .script import Api, Conversation, Part, Role, ToolDef, Turn
from .structured import OutputFormat
from .tokens import Block, block, chain_seed, mark_role, part_block, tool_block

__all__ = ["Chain", "Mark", "Prompt", "Resume"]


@dataclass(frozen=True, slots=True)
class Mark:
    """The prompt after one message: turns, message blocks and system texts so far, and the API's state
    (Anthropic: the message's ``tool_use`` ids; Chat: the calls not answered yet)."""

    turns: int
    blocks: int
    system: int
    state: frozenset[str]


@dataclass(frozen=True, slots=True)
class Chain:
    """The digest chain of a prompt whose leading blocks were ``lead`` (with the API and model): the digest
    at each block boundary, and the hash state after each message's blocks (by message)."""

    lead: bytes
    digests: list[bytes]
    states: list[Any]  # hashlib objects, one per message


@dataclass(frozen=True, slots=True)
class Resume:
    """A prefix of a request's messages parsed before: ``messages`` of them, what they added, the mark after
    each, the last one decoded again (checks that look one message back), and the chain it had (if any)."""

    messages: int
    turns: Sequence[Turn]
    blocks: Sequence[Block]
    system: Sequence[str]
    marks: Sequence[Mark]
    last: Any
    breakpoints: Sequence[int]  # message blocks (by index among them) marked as cache breakpoints
    tokens: Sequence[int]  # the message blocks' tokens, cumulative
    chain: Chain | None

    @property
    def state(self) -> frozenset[str]:
        return self.marks[-1].state if self.marks else frozenset()


@dataclass(slots=True)
class Prompt:
    """A parsed request, built in prompt order (tools, system, messages). Read it only once it is complete."""

    api: Api
    model: str
    system: list[str] = field(default_factory=list)
    tools: list[ToolDef] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    blocks: list[Block] = field(default_factory=list)
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    thinking: bool = False
    #: request settings the API repeats in its answer (the Responses API echoes instructions, tools, sampling…)
    echo: dict[str, Any] = field(default_factory=dict)
    #: the shape the request asks the answer to have (structured output; None: free text)
    output: OutputFormat | None = None
    lead: int = -1  # blocks before the first message (-1: no message added yet)
    lead_system: int = 0  # system texts before the first message
    marks: list[Mark] = field(default_factory=list)  # one per message (a resumed prefix's included)
    resumed: Resume | None = None
    _breakpoints: list[int] = field(default_factory=list)  # message blocks marked as breakpoints
    _tokens: list[int] = field(default_factory=list)  # message blocks' tokens, cumulative
    _chain: tuple[list[bytes], str] | None = field(default=None, init=False, repr=False)
    _states: list[Any] = field(default_factory=list, init=False, repr=False)
    _auto: tuple[int, Block, bool] | None = field(default=None, init=False, repr=False)  # mark_last_block's undo

    def add_tool(self, tool: ToolDef, ttl: float | None = None) -> None:
        b = tool_block(tool)
        b.ttl = ttl
        self.tools.append(tool)
        self.blocks.append(b)

    def add_system_block(self, text: str, *, marked: bool, ttl: float | None = None) -> None:
        """A system text outside the message list (Anthropic's ``system``); ``marked`` leads it with the role."""
        b = block({"text": text, "type": "text"}, role="system" if marked else None)
        b.ttl = ttl
        self.system.append(text)
        self.blocks.append(b)

    def _start_messages(self) -> None:
        if self.lead < 0:
            self.lead, self.lead_system = len(self.blocks), len(self.system)

    def resume(self, prefix: Resume) -> None:
        """Take a prefix of the message list as parsed before (after the leading blocks, before any message)."""
        self._start_messages()
        self.resumed = prefix
        self.turns.extend(prefix.turns)
        self.blocks.extend(prefix.blocks)
        self.system.extend(prefix.system)
        self.marks.extend(prefix.marks)
        self._breakpoints.extend(prefix.breakpoints)
        self._tokens.extend(prefix.tokens)

    def add_turn(self, role: Role, parts: Sequence[Part], ttls: Sequence[float | None] = ()) -> None:
        """One wire message; ``ttls`` marks its parts as cache breakpoints (Anthropic's ``cache_control``)."""
        if not parts:
            raise RequestRejected(400, f"messages: a {role} message has no content")
        if self.lead < 0:
            self._start_messages()
        blocks = [part_block(p) for p in parts]
        at = len(self.blocks) - self.lead
        if ttls:
            for i, (b, ttl) in enumerate(zip(blocks, ttls, strict=False)):
                b.ttl = ttl
                if ttl is not None:
                    self._breakpoints.append(at + i)
        mark_role(blocks[0], role)
        tokens = self._tokens
        total = tokens[-1] if tokens else 0
        for b in blocks:
            total += b.tokens
            tokens.append(total)
        self.turns.append(Turn(role, tuple(parts)))
        self.blocks.extend(blocks)

    def mark(self, state: frozenset[str] = frozenset()) -> None:
        """Record the prompt after a message (call it after every message a parser adds)."""
        if self.lead < 0:
            self._start_messages()
        self.marks.append(
            Mark(len(self.turns), len(self.blocks) - self.lead, len(self.system) - self.lead_system, state)
        )

    def mark_last_block(self, ttl: float) -> None:
        """Make the last block a breakpoint of at least ``ttl`` (automatic caching) — a copy: blocks of a
        parsed prefix are shared with the requests that parsed it."""
        last = self.blocks[-1]
        self.blocks[-1] = Block(last.data, last.tokens, max(last.ttl or 0.0, ttl))
        at = len(self.blocks) - 1 - max(self.lead, 0)
        added = self.lead >= 0 and at >= 0 and (not self._breakpoints or self._breakpoints[-1] != at)
        if added:
            self._breakpoints.append(at)
        self._auto = (len(self.blocks) - 1, last, added)

    def message_blocks(self) -> tuple[list[Block], list[int]]:
        """The message blocks and the breakpoints among them as the messages alone make them (without the
        request-wide automatic breakpoint): what a later request that shares these messages starts from."""
        lead = max(self.lead, 0)
        blocks = self.blocks[lead:]
        breakpoints = self._breakpoints
        if self._auto is not None:
            at, original, added = self._auto
            if at >= lead:
                blocks[at - lead] = original
            if added:
                breakpoints = breakpoints[:-1]
        return blocks, list(breakpoints)

    # -------------------------------------------------------------- what the accounting reads

    @property
    def tokens(self) -> int:
        return self.tokens_through(len(self.blocks) - 1)

    def tokens_through(self, index: int) -> int:
        """Tokens of the blocks up to and including ``index`` (``-1``: none)."""
        if index < 0:
            return 0
        lead = len(self.blocks) if self.lead < 0 else self.lead
        if index < lead:
            return sum(b.tokens for b in self.blocks[: index + 1])
        return sum(b.tokens for b in self.blocks[:lead]) + self._tokens[index - lead]

    def breakpoints(self) -> list[int]:
        """Indexes of the blocks marked as cache breakpoints."""
        lead = len(self.blocks) if self.lead < 0 else self.lead
        return [i for i in range(lead) if self.blocks[i].ttl is not None] + [lead + i for i in self._breakpoints]

    def lead_key(self) -> bytes:
        """What the digest chain's start depends on: the API, the model and the blocks before the messages."""
        lead = len(self.blocks) if self.lead < 0 else self.lead
        h = hashlib.sha256(chain_seed(self.api, self.model))
        for b in self.blocks[:lead]:
            h.update(len(b.data).to_bytes(8, "little") + b.data)
        return h.digest()

    def digests(self) -> tuple[list[bytes], str]:
        """The digest chain at every block boundary and the prompt digest (see :mod:`.tokens`)."""
        if self._chain is None:
            self._chain = self._digest_chain()
        return self._chain

    def _digest_chain(self) -> tuple[list[bytes], str]:
        lead = len(self.blocks) if self.lead < 0 else self.lead
        prefix = self.resumed
        chain = prefix.chain if prefix is not None else None
        if prefix is not None and chain is not None and prefix.marks and chain.lead == self.lead_key():
            # the same leading blocks: the prefix's digests hold, and its state after its last message goes on
            done = lead + prefix.marks[-1].blocks
            out = chain.digests[:done]
            states = chain.states[: prefix.messages]
            h = states[-1].copy()
            marks = self.marks[prefix.messages :]
        else:
            h = hashlib.sha256(chain_seed(self.api, self.model))
            out, states, done, marks = [], [], 0, self.marks
        for mark in marks:
            for b in self.blocks[done : lead + mark.blocks]:
                h.update(b.data)
                out.append(h.digest())
            done = lead + mark.blocks
            states.append(h.copy())
        for b in self.blocks[done:]:  # blocks after the last mark (all of them when no message is marked)
            h.update(b.data)
            out.append(h.digest())
        self._states = states
        return out, h.hexdigest()

    def chain(self) -> Chain:
        """This prompt's chain, for a later request that resumes after a prefix of its messages."""
        digests = self.digests()[0]
        return Chain(self.lead_key(), digests, self._states)

    def conversation(self) -> Conversation:
        return Conversation(
            self.api,
            self.model,
            "\n".join(self.system) or None,
            tuple(self.tools),
            tuple(self.turns),
            self.max_tokens,
            self.stop,
            self.digests()[1],
            self.thinking,
        )
