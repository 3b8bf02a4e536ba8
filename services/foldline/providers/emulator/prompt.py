"""What a parser builds from a request body: the conversation a script sees and the blocks tokens count."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .checks import RequestRejected
from .script import Api, Conversation, Part, Role, ToolDef, Turn
from .tokens import Block, block, digest_chain, mark_role, part_block, tool_block

__all__ = ["Prompt"]


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
    _chain: tuple[list[bytes], str] | None = field(default=None, init=False, repr=False)

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

    def add_turn(self, role: Role, parts: Sequence[Part], ttls: Sequence[float | None] = ()) -> None:
        """One wire message; ``ttls`` marks its parts as cache breakpoints (Anthropic's ``cache_control``)."""
        if not parts:
            raise RequestRejected(400, f"messages: a {role} message has no content")
        blocks = [part_block(p) for p in parts]
        for b, ttl in zip(blocks, ttls, strict=False):
            b.ttl = ttl
        mark_role(blocks[0], role)
        self.turns.append(Turn(role, tuple(parts)))
        self.blocks.extend(blocks)

    @property
    def tokens(self) -> int:
        return sum(b.tokens for b in self.blocks)

    def breakpoints(self) -> list[int]:
        """Indexes of the blocks marked as cache breakpoints."""
        return [i for i, b in enumerate(self.blocks) if b.ttl is not None]

    def digests(self) -> tuple[list[bytes], str]:
        """The digest chain at every block boundary and the prompt digest (see :mod:`.tokens`)."""
        if self._chain is None:
            self._chain = digest_chain(self.api, self.model, self.blocks)
        return self._chain

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
