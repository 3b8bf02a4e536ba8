"""The optional parts of foldline (its extras) and the modules each brings.

The base install runs the embedded default (SQLite log, filesystem attachments, in-process folds, the
emulator); each server backend is an extra (pyproject.toml): ``kafka``, ``redis``, ``s3``, ``archive``,
``faust``, ``mcp`` (MCP servers as tool sources), and ``distributed`` for all the servers' clients at once;
``console`` brings the operator console's web server, ``otel`` OpenTelemetry tracing. :func:`require` fails with
:class:`~foldline.errors.MissingExtra` naming the extra before an adapter that needs it is built;
:func:`missing_extra` turns an import that failed on such a module into the same error (the CLI's last line
of defence, so every command says which extra to install in one line).
"""

from __future__ import annotations

import importlib

from ..errors import MissingExtra

__all__ = ["EXTRAS", "missing_extra", "require"]

#: Each extra and the top-level modules it installs (the first one is named when it is missing).
EXTRAS: dict[str, tuple[str, ...]] = {
    "kafka": ("confluent_kafka", "fastavro"),
    "redis": ("redis",),
    "s3": ("boto3", "botocore"),
    "archive": ("fastavro",),
    "faust": ("faust", "mode", "aiokafka"),
    "mcp": ("mcp", "jsonschema"),
    "console": ("starlette", "uvicorn", "jinja2"),
    "otel": ("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http", "opentelemetry.exporter.otlp.proto.grpc"),
}
_EXTRA_OF = {"confluent_kafka": "kafka", "fastavro": "archive", "redis": "redis", "hiredis": "redis"}
_EXTRA_OF |= {"boto3": "s3", "botocore": "s3", "s3transfer": "s3", "faust": "faust", "mode": "faust"}
_EXTRA_OF |= {"aiokafka": "faust", "mcp": "mcp", "mcp_types": "mcp", "jsonschema": "mcp"}
_EXTRA_OF |= {"starlette": "console", "uvicorn": "console", "jinja2": "console", "markupsafe": "console"}
_EXTRA_OF |= {"opentelemetry": "otel", "grpc": "otel"}


def require(*extras: str, what: str = "this") -> None:
    """Import every module of each of ``extras`` (what the adapters do next anyway); MissingExtra naming the
    first one that is not installed (``what``: the thing that needs it, for the message)."""
    for extra in extras:
        for module in EXTRAS[extra]:
            try:
                importlib.import_module(module)
            except ImportError as exc:
                raise MissingExtra(extra, module, what) from exc


def missing_extra(exc: ModuleNotFoundError) -> MissingExtra | None:
    """The MissingExtra an import failure means, when the module is one an extra installs (else ``None``)."""
    top = (exc.name or "").partition(".")[0]
    extra = _EXTRA_OF.get(top)
    return None if extra is None else MissingExtra(extra, top)
