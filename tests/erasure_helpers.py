"""Helpers of the erasure tests: a real session whose every kind of content holds a canary, made by the loop."""

from __future__ import annotations

import asyncio
import io
import struct
import zlib
from pathlib import Path

import fastavro

from foldline.adapters.fs_attachments import FilesystemAttachmentStore
from foldline.config import Config, Stores, open_stores
from foldline.core.content import ImageBlock, ImageRef, TextBlock
from foldline.core.header import CallConfig
from foldline.export import export_session
from foldline.loop import Agent, AgentOptions, Toolset
from foldline.ports.attachments import AttachmentStore
from foldline.providers.base import serializer_for
from foldline.providers.emulated import emulated_provider
from foldline.replay.verify import rebuild_requests

__all__ = ["canary_png", "canary_session", "inflated", "put_request_bodies", "scan"]


def canary_png(canary: str, width: int = 4, height: int = 3) -> bytes:
    """A real PNG whose bytes hold ``canary`` (a tEXt chunk), so the attachment object itself carries it."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    raw = b"".join(b"\x00" + bytes([(x * 40 + y) % 256 for x in range(width)]) for y in range(height))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    text = chunk(b"tEXt", b"Comment\x00" + canary.encode())
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + text + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


def canary_tools(canary: str) -> Toolset:
    tools = Toolset()

    @tools.tool
    def lookup(topic: str) -> str:
        """Look a topic up in the notes."""
        return f"notes on {topic}: the code word is {canary}"

    return tools


def canary_session(data_dir: Path, session_id: str, canary: str, out: Path) -> Path:
    """Run a two-turn session on a scratch embedded data directory — the canary in the system prompt, the user's
    text, an image's bytes and name, the tool results (and so the model's answers and tool arguments that echo
    them) — and export it (with its image) to ``out``; returns the directory the image objects were copied to."""
    stores = open_stores(Config(data_dir=data_dir))
    provider = emulated_provider()
    options = AgentOptions(
        config=CallConfig("anthropic", "claude-emulated", max_tokens=256),
        system=f"You keep the secrets of {canary}.",
        tools=canary_tools(canary),
        archive_requests=True,
    )

    async def run() -> None:
        agent = Agent(session_id, stores.log, provider, options, attachments=stores.attachments)
        image = stores.attachments.put(canary_png(canary), "image/png")
        ref = image.image_ref()
        named = ImageRef(ref.attachment_id, ref.media_type, ref.bytes, ref.width, ref.height, f"{canary}.png")
        await agent.run_turn([TextBlock(f"Look up {canary} please."), ImageBlock(named)])
        await agent.run_turn(f"And once more for {canary}.")
        await provider.aclose()

    try:
        asyncio.run(run())
        bundle = out.parent / f"{out.name}.attachments"
        with out.open("wb") as fp:
            export_session(
                stores.log, session_id, fp, attachments=stores.attachments, bundle=FilesystemAttachmentStore(bundle)
            )
        return bundle
    finally:
        stores.close()


def put_request_bodies(stores: Stores, session_id: str, attachments: AttachmentStore | None = None) -> list[str]:
    """Put the exact wire body of each of the session's requests into the attachment store, as a dispatcher that
    archives requests does (``archive_requests``); returns their ids (the ``request/dispatch`` digests)."""
    target = attachments or stores.attachments
    ids = []
    for dispatch, _seq, request in rebuild_requests(session_id, stores.log.read(session_id)):
        body = serializer_for(dispatch.serializer, dispatch.serializer_version).serialize(request, stores.attachments)
        meta = target.put(body, "application/json")
        assert meta.attachment_id == dispatch.digest
        ids.append(meta.attachment_id)
    return ids


def inflated(data: bytes) -> bytes:
    """The bytes a search must look in: an Avro object container (an archive segment: deflated blocks, in which a
    string is not found by its bytes) with its records, decoded, after the raw bytes (``repr`` keeps every string
    and the ASCII of every bytes value); anything else as it is."""
    if not data.startswith(b"Obj\x01"):
        return data
    return data + repr(list(fastavro.reader(io.BytesIO(data)))).encode()


def scan(root: Path, needle: bytes) -> list[Path]:
    """Every file under ``root`` whose bytes (an archive segment's inflated too) hold ``needle``."""
    return [p for p in sorted(root.rglob("*")) if p.is_file() and needle in inflated(p.read_bytes())]
