"""A deterministic local model provider that speaks the Anthropic Messages, OpenAI Chat Completions, OpenAI
Responses and DeepSeek chat wire formats.

The emulator receives real wire bodies (whatever an adapter serialized), parses and checks them like the
real APIs would (unknown fields, tool-result pairing, breakpoint count, each model's settings), answers through a
:class:`Script` in each API's live shape (docs/EMULATOR.md, "Fidelity"), and reports usage from a deterministic
token count and a prefix cache modelled on the real providers.
Nothing here reads the clock except through the injected ``clock``, and nothing is random.

One module per role:

* :mod:`.script` — what a script sees (:class:`Conversation` of format-neutral parts) and answers
  (:class:`Reply`); the default :class:`ToolLoopScript`.
* :mod:`.tokens` — the token stream: blocks, :func:`count_tokens`, the prefix digest chain.
* :mod:`.anthropic_messages`, :mod:`.openai_chat`, :mod:`.openai_responses` — one per API: its request parser
  and answer shape.
* :mod:`.prompt` and :mod:`.checks` — what the parsers build, and the checks that refuse a request.
* :mod:`.cache` — both cache policies and their accounting.
* :mod:`.answer` — the script's reply cut at stop sequences and ``max_tokens``.
* :mod:`.wire_api` — what each API provides; :mod:`.emulator` — the :class:`Emulator` that routes a
  request through all of the above.
* :mod:`.streaming` — an answer written as its API's event stream; :mod:`.faults` — injected faults.
* :mod:`.transport` — the in-process httpx transport; :mod:`.server` — the HTTP server.
"""

from .cache import AnthropicCachePolicy, OpenAICachePolicy
from .emulator import Emulator, EmulatorResponse
from .faults import Fault, FaultPlan
from .script import (
    Api,
    Conversation,
    ImagePart,
    Part,
    ReasoningPart,
    Reply,
    Role,
    Script,
    ScriptedCall,
    StopOverride,
    TextPart,
    ToolCallPart,
    ToolDef,
    ToolLoopScript,
    ToolResultPart,
    Turn,
    scripted_arguments,
)
from .server import EmulatorServer, ServerLimits, serve
from .tokens import count_tokens
from .transport import EmulatorTransport

__all__ = [
    "AnthropicCachePolicy",
    "Api",
    "Conversation",
    "Emulator",
    "EmulatorResponse",
    "EmulatorServer",
    "EmulatorTransport",
    "Fault",
    "FaultPlan",
    "ImagePart",
    "OpenAICachePolicy",
    "Part",
    "ReasoningPart",
    "Reply",
    "Role",
    "Script",
    "ScriptedCall",
    "ServerLimits",
    "StopOverride",
    "TextPart",
    "ToolCallPart",
    "ToolDef",
    "ToolLoopScript",
    "ToolResultPart",
    "Turn",
    "count_tokens",
    "scripted_arguments",
    "serve",
]
