"""Structured output as the APIs take it, and an answer that honours it.

Each API's parser reads its native field with the checks the API applies — Anthropic ``output_config.format``,
Chat Completions ``response_format``, Responses ``text.format``, DeepSeek's JSON mode — into an
:class:`OutputFormat` on the :class:`~.prompt.Prompt`. The answer's text is then one JSON value: the script's
text when it already is JSON (a script may answer a wrong shape on purpose), else a value built from the schema
(:func:`schema_value`, deterministic from the prompt's digest, objects in the schema's property order). DeepSeek's
JSON mode carries no schema: the model reads the one the prompt states (the first JSON object after the words
"JSON Schema" in the system text), as a model would.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from . import checks
from .checks import RequestRejected

__all__ = ["OutputFormat", "anthropic_format", "chat_format", "deepseek_format", "responses_format", "schema_value"]

_NAME: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")


@dataclass(frozen=True, slots=True)
class OutputFormat:
    """The shape a request asks its answer to have: a JSON Schema (None: any JSON object, DeepSeek's JSON mode)."""

    schema: Mapping[str, Any] | None


def _schema(value: Any, where: str) -> Mapping[str, Any]:
    schema = checks.json_object(value, where)
    if schema.get("type", "object") != "object":
        raise RequestRejected(400, f"{where}: the root of an output schema must be an object schema")
    return schema


def anthropic_format(req: Mapping[str, Any]) -> OutputFormat | None:
    """``output_config.format``: ``{"type": "json_schema", "schema": {...}}`` (the parser checked its keys)."""
    config = req.get("output_config")
    if not isinstance(config, Mapping) or config.get("format") is None:
        return None
    fmt = checks.json_object(config["format"], "output_config.format")
    checks.exact_keys(fmt, frozenset({"type", "schema"}), "output_config.format")
    if fmt.get("type") != "json_schema":
        raise RequestRejected(400, "output_config.format.type: Input should be 'json_schema'")
    return OutputFormat(_schema(fmt.get("schema"), "output_config.format.schema"))


def _json_schema(fmt: Mapping[str, Any], where: str) -> OutputFormat:
    name = fmt.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise RequestRejected(400, f"Invalid '{where}.name': a-z, A-Z, 0-9, '_' and '-', at most 64 characters.")
    strict = fmt.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise RequestRejected(400, f"Invalid type for '{where}.strict': expected a boolean.")
    return OutputFormat(_schema(fmt.get("schema"), f"{where}.schema"))


def chat_format(req: Mapping[str, Any]) -> OutputFormat | None:
    """``response_format``: ``text``, ``json_object`` or ``json_schema`` with ``json_schema {name, schema, strict}``."""
    value = req.get("response_format")
    if value is None:
        return None
    fmt = checks.json_object(value, "response_format")
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return OutputFormat(None)
    if kind != "json_schema":
        raise RequestRejected(400, "Invalid value for 'response_format.type'.", param="response_format.type")
    spec = checks.json_object(fmt.get("json_schema"), "response_format.json_schema")
    checks.known_parameters(spec, frozenset({"name", "schema", "strict", "description"}), "response_format.json_schema")
    return _json_schema(spec, "response_format.json_schema")


def responses_format(req: Mapping[str, Any]) -> OutputFormat | None:
    """``text.format``: ``{"type": "json_schema", "name", "schema", "strict"}`` (or ``text`` / ``json_object``)."""
    value = req.get("text")
    if value is None:
        return None
    text = checks.json_object(value, "text")
    checks.known_parameters(text, frozenset({"format", "verbosity"}), "text")
    if text.get("format") is None:
        return None
    fmt = checks.json_object(text["format"], "text.format")
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return OutputFormat(None)
    if kind != "json_schema":
        raise RequestRejected(400, "Invalid value for 'text.format.type'.", param="text.format.type")
    checks.known_parameters(fmt, frozenset({"type", "name", "schema", "strict", "description"}), "text.format")
    return _json_schema(fmt, "text.format")


def deepseek_format(req: Mapping[str, Any], texts: Sequence[str]) -> OutputFormat | None:
    """DeepSeek's ``response_format``: ``text`` or ``json_object``; JSON mode asks for the word "json" in the prompt
    (``texts``: the system and user texts), and the schema is the one the prompt states, if any."""
    value = req.get("response_format")
    if value is None:
        return None
    fmt = checks.json_object(value, "response_format")
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind != "json_object":
        raise RequestRejected(400, "response_format.type: expected 'text' or 'json_object'")
    if not any("json" in t.lower() for t in texts):
        raise RequestRejected(
            400, "Prompt must contain the word 'json' in some form to use 'response_format' of type 'json_object'."
        )
    for text in texts:
        at = text.find("JSON Schema")
        start = text.find("{", at) if at >= 0 else -1
        if start >= 0:
            try:
                stated, _ = json.JSONDecoder().raw_decode(text, start)
            except ValueError:
                continue
            if isinstance(stated, dict):
                return OutputFormat(stated)
    return OutputFormat(None)


def answer_text(fmt: OutputFormat, scripted: str, seed: bytes) -> str:
    """The answer's text under ``fmt``: the script's own when it is JSON, else a value of the schema's shape."""
    try:
        json.loads(scripted)
    except ValueError:
        pass
    else:
        return scripted
    value = schema_value(fmt.schema, seed, fmt.schema) if fmt.schema is not None else {"answer": scripted}
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def schema_value(schema: Any, seed: bytes, root: Mapping[str, Any] | None, depth: int = 0) -> Any:
    """A value that matches ``schema`` (types, enums, consts, ``$ref`` into ``$defs``, ``anyOf``/``oneOf``, arrays,
    objects with every property in its order), chosen from ``seed``."""
    if not isinstance(schema, Mapping) or depth > 12:
        return None
    h = hashlib.sha256(seed).digest()
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/") and root is not None:
        target: Any = root
        for part in ref[2:].split("/"):
            target = target.get(part) if isinstance(target, Mapping) else None
        return schema_value(target, seed, root, depth + 1)
    if "const" in schema:
        return schema["const"]
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return enum[h[0] % len(enum)]
    for key in ("anyOf", "oneOf", "allOf"):
        options = schema.get(key)
        if isinstance(options, list) and options:
            usable = [o for o in options if not (isinstance(o, Mapping) and o.get("type") == "null")] or options
            return schema_value(usable[0], seed, root, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None:
        kind = "object" if "properties" in schema else "string"
    if kind == "object":
        properties = schema.get("properties")
        out: dict[str, Any] = {}
        if isinstance(properties, Mapping):
            for name, spec in properties.items():
                out[name] = schema_value(spec, seed + name.encode("utf-8"), root, depth + 1)
        return out
    if kind == "array":
        count = max(int(schema.get("minItems", 1)), 1)
        return [schema_value(schema.get("items"), seed + bytes([i]), root, depth + 1) for i in range(count)]
    if kind == "integer":
        low = schema.get("minimum", 0)
        return int(low) + h[0] % 50
    if kind == "number":
        low = schema.get("minimum", 0)
        return float(low) + (h[0] % 200) / 4
    if kind == "boolean":
        return bool(h[0] & 1)
    if kind == "null":
        return None
    words = ("alpha", "bravo", "cache", "delta", "event", "fold", "graph", "header")
    return f"{words[h[0] % len(words)]}-{h.hex()[:6]}"
