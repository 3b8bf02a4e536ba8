"""Image dimensions read from the bytes themselves (PNG, JPEG, GIF, WebP), so metadata is checkable."""

from __future__ import annotations

import struct

__all__ = ["image_dimensions", "sniff_media_type"]


def sniff_media_type(data: bytes) -> str | None:
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith(b"\xff\xd8"):
        return "image/jpeg"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "image/gif"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None


def image_dimensions(data: bytes, media_type: str) -> tuple[int, int]:
    """(width, height) of an image; ``ValueError`` when the bytes are not that kind of image."""
    sniffed = sniff_media_type(data)
    if sniffed != media_type:
        raise ValueError(f"bytes are {sniffed or 'not a known image type'}, not {media_type}")
    try:
        if media_type == "image/png":
            w, h = struct.unpack(">II", data[16:24])
            return int(w), int(h)
        if media_type == "image/gif":
            w, h = struct.unpack("<HH", data[6:10])
            return int(w), int(h)
        if media_type == "image/webp":
            return _webp(data)
        return _jpeg(data)
    except (struct.error, IndexError) as exc:
        raise ValueError(f"truncated {media_type} header") from exc


def _jpeg(data: bytes) -> tuple[int, int]:
    i = 2
    while i + 9 < len(data):
        if data[i] != 0xFF:
            raise ValueError("malformed JPEG marker")
        marker = data[i + 1]
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:
            i += 2
            continue
        (length,) = struct.unpack(">H", data[i + 2 : i + 4])
        if marker in (0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF):
            h, w = struct.unpack(">HH", data[i + 5 : i + 9])
            return int(w), int(h)
        i += 2 + length
    raise ValueError("JPEG has no frame header")


def _webp(data: bytes) -> tuple[int, int]:
    chunk = data[12:16]
    if chunk == b"VP8X":
        w = int.from_bytes(data[24:27], "little") + 1
        h = int.from_bytes(data[27:30], "little") + 1
        return w, h
    if chunk == b"VP8 ":
        w, h = struct.unpack("<HH", data[26:30])
        return int(w) & 0x3FFF, int(h) & 0x3FFF
    if chunk == b"VP8L":
        b = data[21:25]
        w = 1 + (((b[1] & 0x3F) << 8) | b[0])
        h = 1 + (((b[3] & 0xF) << 10) | (b[2] << 2) | ((b[1] & 0xC0) >> 6))
        return w, h
    raise ValueError("unknown WebP chunk")
