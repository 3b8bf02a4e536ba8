"""The emulator's streamed answers: an API's unstreamed answer object written as that API's event stream.

Each function takes the JSON object the API answers when the request does not stream and returns the
server-sent events that carry the same answer, each event's bytes separately (so a transport can send, delay
or cut the stream between events). Text, tool input and reasoning are split into pieces of ``piece_chars``
characters. Assembling the events (:mod:`foldline.providers.streaming`) gives back the same object, which is
what lets a test prove a streamed answer equal to the unstreamed one.

* Anthropic Messages: ``message_start`` (the message without content, ``stop_reason`` null, usage with
  ``output_tokens`` 1), per block ``content_block_start`` (text empty, tool ``input`` ``{}``, thinking empty with
  an empty signature; a redacted thinking block whole) — a ``ping`` after the first one — then its deltas
  (``text_delta``, ``input_json_delta`` pieces of the input's canonical JSON after an empty one,
  ``thinking_delta``, ``signature_delta``) and ``content_block_stop``, then ``message_delta`` (stop reason and
  sequence; the cumulative input, cache and output token counts) and ``message_stop``.
* OpenAI Chat Completions: ``chat.completion.chunk`` objects without event names — a first chunk with the
  role and empty content (holding the first tool call when the answer starts with one), content pieces, per
  tool call a chunk with its id, type, name and empty arguments then argument pieces, a chunk with the finish
  reason, the usage chunk (no choices) when the request asked for ``stream_options.include_usage`` (every other
  chunk then says ``"usage": null``), and ``data: [DONE]``. A reasoning server's ``reasoning_content`` streams
  the same way, before the content.
* OpenAI Responses: ``response.created`` and ``response.in_progress`` (the response without output), per
  output item ``response.output_item.added`` (empty), its parts (``response.content_part.added``, text
  pieces in ``response.output_text.delta``, ``.done``), reasoning summaries (``response.reasoning_summary_*``)
  or call arguments (``response.function_call_arguments.delta`` / ``.done``), ``response.output_item.done``
  with the whole item, then ``response.completed`` (``response.incomplete``) with the whole response. Every
  event carries its ``sequence_number``; text events carry their (empty) ``logprobs``.

:func:`stream_error_event` is the event each API breaks a stream off with (the ``error-mid`` fault).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ...core.codec import canonical_json
from ..sse import encode_sse

__all__ = ["anthropic_stream", "openai_chat_stream", "responses_stream", "stream_error_event"]

#: The usage keys of the Messages API's ``message_delta`` (cumulative counts; live answers carry these four).
_DELTA_USAGE = ("cache_creation_input_tokens", "cache_read_input_tokens", "input_tokens", "output_tokens")


def _pieces(text: str, size: int) -> Iterator[str]:
    for i in range(0, len(text), size):
        yield text[i : i + size]


def _event(name: str, data: dict[str, Any]) -> bytes:
    return encode_sse(name, canonical_json({**data, "type": name}).decode())


def anthropic_stream(message: dict[str, Any], piece_chars: int = 16) -> list[bytes]:
    """A Messages API answer as its event stream, one ``bytes`` per event."""
    usage = message["usage"]
    start = {
        **message,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {**usage, "output_tokens": 1},
    }
    out = [_event("message_start", {"message": start})]
    for index, block in enumerate(message["content"]):
        kind = block["type"]
        deltas: list[dict[str, Any]] = []
        if kind == "text":
            opened = {**block, "text": ""}
            deltas = [{"type": "text_delta", "text": p} for p in _pieces(block["text"], piece_chars)]
        elif kind == "tool_use":
            opened = {**block, "input": {}}
            arguments = canonical_json(block["input"]).decode()
            deltas = [{"type": "input_json_delta", "partial_json": p} for p in ["", *_pieces(arguments, piece_chars)]]
        elif kind == "thinking":
            opened = {**block, "thinking": "", "signature": ""}
            deltas = [{"type": "thinking_delta", "thinking": p} for p in _pieces(block["thinking"], piece_chars)]
            deltas.append({"type": "signature_delta", "signature": block["signature"]})
        else:  # sent whole (redacted thinking, and any block without deltas)
            opened = block
        out.append(_event("content_block_start", {"index": index, "content_block": opened}))
        if index == 0:
            out.append(_event("ping", {}))
        out.extend(_event("content_block_delta", {"index": index, "delta": d}) for d in deltas)
        out.append(_event("content_block_stop", {"index": index}))
    if not message["content"]:
        out.append(_event("ping", {}))
    delta = {"stop_reason": message["stop_reason"], "stop_sequence": message["stop_sequence"]}
    out.append(_event("message_delta", {"delta": delta, "usage": {k: usage[k] for k in _DELTA_USAGE}}))
    out.append(_event("message_stop", {}))
    return out


def _chunk(head: dict[str, Any], delta: dict[str, Any], finish: str | None = None) -> bytes:
    choice = {"delta": delta, "finish_reason": finish, "index": 0, "logprobs": None}
    return encode_sse(None, canonical_json({**head, "choices": [choice]}).decode())


def openai_chat_stream(completion: dict[str, Any], include_usage: bool, piece_chars: int = 16) -> list[bytes]:
    """A Chat Completions answer as its chunk stream, one ``bytes`` per event."""
    head: dict[str, Any] = {
        k: completion[k] for k in ("created", "id", "model", "service_tier", "system_fingerprint") if k in completion
    }
    head["object"] = "chat.completion.chunk"
    if include_usage:
        head["usage"] = None
    choice = completion["choices"][0]
    message = choice["message"]
    calls = [
        {
            "function": {"arguments": "", "name": call["function"]["name"]},
            "id": call["id"],
            "index": k,
            "type": "function",
        }
        for k, call in enumerate(message.get("tool_calls") or ())
    ]
    said = message.get("content") or message.get("reasoning_content")
    first: dict[str, Any] = {"content": "" if said else None, "role": "assistant"}
    if "refusal" in message:
        first["refusal"] = "" if message.get("refusal") else None
    opened_first = not said and not message.get("refusal") and bool(calls)
    if opened_first:
        first["tool_calls"] = [calls[0]]
    out = [_chunk(head, first)]
    out.extend(
        _chunk(head, {"reasoning_content": p}) for p in _pieces(message.get("reasoning_content") or "", piece_chars)
    )
    out.extend(_chunk(head, {"content": p}) for p in _pieces(message.get("content") or "", piece_chars))
    out.extend(_chunk(head, {"refusal": p}) for p in _pieces(message.get("refusal") or "", piece_chars))
    for k, (opened, call) in enumerate(zip(calls, message.get("tool_calls") or (), strict=True)):
        if k or not opened_first:
            out.append(_chunk(head, {"tool_calls": [opened]}))
        out.extend(
            _chunk(head, {"tool_calls": [{"function": {"arguments": p}, "index": k}]})
            for p in _pieces(call["function"]["arguments"], piece_chars)
        )
    out.append(_chunk(head, {}, choice["finish_reason"]))
    if include_usage:
        out.append(encode_sse(None, canonical_json({**head, "choices": [], "usage": completion["usage"]}).decode()))
    out.append(encode_sse(None, "[DONE]"))
    return out


def responses_stream(response: dict[str, Any], piece_chars: int = 16) -> list[bytes]:
    """A Responses API answer as its event stream, one ``bytes`` per event."""
    out: list[bytes] = []

    def emit(kind: str, **fields: Any) -> None:
        out.append(_event(kind, {**fields, "sequence_number": len(out)}))

    opened = {**response, "output": [], "status": "in_progress", "usage": None, "incomplete_details": None}
    emit("response.created", response=opened)
    emit("response.in_progress", response=opened)
    for index, item in enumerate(response["output"]):
        kind = item["type"]
        item_id = item.get("id")
        if kind == "message":
            emit(
                "response.output_item.added", output_index=index, item={**item, "content": [], "status": "in_progress"}
            )
            for k, part in enumerate(item["content"]):
                field = "refusal" if part["type"] == "refusal" else "text"
                emit(
                    "response.content_part.added",
                    item_id=item_id,
                    output_index=index,
                    content_index=k,
                    part={**part, field: ""},
                )
                text: dict[str, Any] = {"logprobs": []} if field == "text" else {}  # text events carry logprobs
                delta = "response.refusal.delta" if field == "refusal" else "response.output_text.delta"
                for p in _pieces(part[field], piece_chars):
                    emit(delta, item_id=item_id, output_index=index, content_index=k, delta=p, **text)
                done = "response.refusal.done" if field == "refusal" else "response.output_text.done"
                emit(done, item_id=item_id, output_index=index, content_index=k, **{field: part[field]}, **text)
                emit("response.content_part.done", item_id=item_id, output_index=index, content_index=k, part=part)
        elif kind == "reasoning":
            emit("response.output_item.added", output_index=index, item={**item, "summary": []})
            for k, part in enumerate(item.get("summary") or ()):
                emit(
                    "response.reasoning_summary_part.added",
                    item_id=item_id,
                    output_index=index,
                    summary_index=k,
                    part={**part, "text": ""},
                )
                for p in _pieces(part["text"], piece_chars):
                    emit(
                        "response.reasoning_summary_text.delta",
                        item_id=item_id,
                        output_index=index,
                        summary_index=k,
                        delta=p,
                    )
                emit(
                    "response.reasoning_summary_text.done",
                    item_id=item_id,
                    output_index=index,
                    summary_index=k,
                    text=part["text"],
                )
                emit(
                    "response.reasoning_summary_part.done",
                    item_id=item_id,
                    output_index=index,
                    summary_index=k,
                    part=part,
                )
        elif kind == "function_call":
            emit(
                "response.output_item.added",
                output_index=index,
                item={**item, "arguments": "", "status": "in_progress"},
            )
            for p in _pieces(item["arguments"], piece_chars):
                emit("response.function_call_arguments.delta", item_id=item_id, output_index=index, delta=p)
            emit(
                "response.function_call_arguments.done",
                item_id=item_id,
                output_index=index,
                arguments=item["arguments"],
            )
        else:
            emit("response.output_item.added", output_index=index, item=item)
        emit("response.output_item.done", output_index=index, item=item)
    final = "response.incomplete" if response.get("status") == "incomplete" else "response.completed"
    emit(final, response=response)
    return out


def stream_error_event(api: str, error_type: str | None, sequence_number: int) -> bytes:
    """The event an API breaks a stream off with: a transient error of ``error_type`` (None: the API's usual
    one — Anthropic ``overloaded_error``, OpenAI ``server_error``). ``sequence_number``: the Responses API's."""
    if api == "anthropic":
        kind = error_type or "overloaded_error"
        message = "Overloaded" if kind == "overloaded_error" else f"emulated {kind}"
        return _event("error", {"error": {"message": message, "type": kind}})
    kind = error_type or "server_error"
    message = (
        "The server had an error while processing your request. Sorry about that!"
        if kind == "server_error"
        else f"emulated {kind}"
    )
    if api == "openai-responses":
        fields = {"code": kind, "message": message, "param": None, "sequence_number": sequence_number}
        return _event("error", fields)
    return encode_sse(
        None, canonical_json({"error": {"code": None, "message": message, "param": None, "type": kind}}).decode()
    )
