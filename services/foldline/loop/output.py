"""Structured output: the type a turn's final answer must have, checked and returned typed.

An :class:`OutputType` names a pydantic-validatable type (a model, a dataclass, ``list[int]``...) or a JSON
Schema. Given to an agent (``AgentOptions.output``) or to one turn (``run_turn(..., output=...)``), its JSON Schema
and name go into the logged call config (``config.outputSchema`` / ``config.outputName``: a change of them is a
header change like any other, and a turn without them drops them), and the serializers send them with each
provider's native structured-output feature (docs/FORMAT.md §9.10). When the turn ends, its final text is
validated: the value is :attr:`~foldline.loop.TurnResult.output`. A text that does not validate is answered with
a logged ``user/message`` (source :data:`OUTPUT_RETRY_SOURCE`) telling the model what was wrong, and the turn takes
another step — at most :attr:`OutputType.retries` times; then, or at once with ``retries=0``, the turn raises
:class:`~foldline.errors.OutputInvalid` (the turn is closed in the log first).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final, Generic, TypeVar, cast, overload

import pydantic

from ..core.frozen import OrderedObject, freeze_ordered
from ..core.header import OUTPUT_NAME_PATTERN
from ..errors import ConfigError, MissingExtra

__all__ = ["OUTPUT_RETRY_SOURCE", "OutputCheck", "OutputType", "strict_schema"]

T = TypeVar("T")

#: The source of the ``user/message`` that tells the model its answer did not match the output type.
OUTPUT_RETRY_SOURCE: Final = "output-retry"


class OutputCheck(Exception):
    """An answer that does not validate (internal: the loop turns it into a retry or OutputInvalid)."""

    def __init__(self, errors: str) -> None:
        super().__init__(errors)
        self.errors = errors


def strict_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """``schema`` with ``"additionalProperties": false`` added (last) to every object schema with properties that
    does not say otherwise: the providers' strict structured outputs require it; the order is otherwise kept."""

    def walk(node: Any) -> Any:
        if isinstance(node, Mapping):
            out = {k: walk(v) for k, v in node.items()}
            if isinstance(out.get("properties"), Mapping) and "additionalProperties" not in out:
                out["additionalProperties"] = False
            return out
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    result: dict[str, Any] = walk(schema)
    return result


class OutputType(Generic[T]):
    """The shape a turn's final answer must have: a type pydantic validates, or a JSON Schema (a mapping).

    * ``name``: the schema's name the OpenAI APIs send (default: the type's name, or ``output``);
    * ``retries``: how many times a wrong answer is sent back to the model with what was wrong before the turn
      raises :class:`~foldline.errors.OutputInvalid` (0: raise at the first wrong answer).

    A type's schema is pydantic's (``TypeAdapter(T).json_schema()``: properties in declaration order) with
    ``additionalProperties: false`` on each object (:func:`strict_schema`); a JSON Schema is sent as given and the
    answer checked with ``jsonschema`` (installed with ``foldline[mcp]``) and returned as plain JSON.
    """

    @overload
    def __init__(self: OutputType[T], shape: type[T], *, name: str | None = None, retries: int = 2) -> None: ...

    @overload
    def __init__(
        self: OutputType[Any], shape: Mapping[str, Any], *, name: str | None = None, retries: int = 2
    ) -> None: ...

    def __init__(self, shape: Any, *, name: str | None = None, retries: int = 2) -> None:
        if retries < 0:
            raise ConfigError(f"OutputType retries must be >= 0, got {retries}")
        self.retries = retries
        self._adapter: pydantic.TypeAdapter[Any] | None = None
        self._validator: Any = None
        if isinstance(shape, Mapping):
            try:
                import jsonschema
            except ImportError as exc:  # pragma: no cover - the test environment installs it
                raise MissingExtra("mcp", "jsonschema", "an output type given as a JSON Schema") from exc
            try:
                jsonschema.Draft202012Validator.check_schema(dict(shape))
            except jsonschema.SchemaError as exc:
                raise ConfigError(f"the output schema is not a valid JSON Schema: {exc.message}") from None
            self._validator = jsonschema.Draft202012Validator(dict(shape))
            schema: Mapping[str, Any] = shape
            default_name = str(shape.get("title") or "output")
        else:
            try:
                self._adapter = pydantic.TypeAdapter(shape)
                schema = strict_schema(self._adapter.json_schema())
            except pydantic.PydanticUserError as exc:  # pragma: no cover - pydantic names the type
                raise ConfigError(f"no JSON Schema for the output type {shape!r}: {exc}") from None
            default_name = getattr(shape, "__name__", "output")
        if schema.get("type", "object") != "object":
            raise ConfigError(
                "the output schema must describe a JSON object (the providers' structured outputs take an object at "
                "the root): wrap the value in a model with one field"
            )
        self.name = name or (default_name if OUTPUT_NAME_PATTERN.fullmatch(default_name) else "output")
        if not OUTPUT_NAME_PATTERN.fullmatch(self.name):
            raise ConfigError(f"OutputType name must be 1 to 64 letters, digits, '_' or '-', got {self.name!r}")
        self.schema: OrderedObject = freeze_ordered(schema)

    def validate(self, text: str) -> T:
        """The answer's value, or :class:`OutputCheck` saying what is wrong with it."""
        if self._adapter is not None:
            try:
                return cast(T, self._adapter.validate_json(text))
            except pydantic.ValidationError as exc:
                raise OutputCheck(_pydantic_errors(exc)) from None
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise OutputCheck(f"the answer is not JSON ({exc})") from None
        problems = sorted(self._validator.iter_errors(value), key=lambda e: list(e.absolute_path))
        if problems:
            raise OutputCheck("; ".join(f"{_path(e.absolute_path)}: {e.message}" for e in problems[:8]))
        return cast(T, value)

    def retry_text(self, errors: str) -> str:
        """The ``user/message`` that sends a wrong answer back to the model."""
        return (
            f"Your answer does not match the output schema {self.name}: {errors}. Answer again with only one JSON "
            "value that matches the schema."
        )


def _path(parts: Any) -> str:
    joined = ".".join(str(p) for p in parts)
    return joined or "(root)"


def _pydantic_errors(exc: pydantic.ValidationError) -> str:
    """At most eight of the errors, each as ``path: message``, in a stable order."""
    out = [f"{_path(e['loc'])}: {e['msg']}" for e in exc.errors(include_url=False)[:8]]
    return "; ".join(out)
