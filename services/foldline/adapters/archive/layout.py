"""Where a session's archive objects live in an archive store, and the manifest's JSON.

Keys (relative to the store's root; docs/RETENTION.md, "The archive layout"):

* ``sessions/<h>/<id>/manifest.json`` — ``<h>`` the first two hex digits of the sha256 of the session id
  (spreads sessions over 256 prefixes, which S3 scales by), ``<id>`` the session id percent-encoded
  (a leading dot too; no ``/`` survives, so one session's objects never fall under another's directory);
* ``sessions/<h>/<id>/seg-<first>-<end>.avro`` — seqs ``first`` up to ``end`` (exclusive), each 12 digits.

The manifest is canonical JSON: ``{"v":1,"session":…,"segments":[{"key","first","end","sha256","bytes"}…],
"pending":null|{…}}``, plus, only while there is one, ``"merging":{"segment":{…},"inputs":[{…}…]}`` (a merge
announced) and ``"retired":[{"at":<epoch ms>,"keys":[…]}…]`` (the keys of the segments each merge replaced,
not deleted yet: readers skip them, so they cost a read little). A manifest
with neither is byte for byte what a version without merges writes, and readers of that version read any
manifest (they take ``segments`` and ignore the rest). :func:`decode_manifest` checks everything a reader
relies on: the session, segments contiguous from seq 0, keys that name their ranges, digests that are sha256
hex; a merge's inputs that are a run of the segments its output covers exactly; retired segments that are not
live.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any
from urllib.parse import quote, unquote

from ...core import codec as canonical
from ...errors import ArchiveCorrupt
from ...ports.archive import Manifest, MergeIntent, RetiredSegment, SegmentRef

__all__ = [
    "MANIFEST_NAME",
    "SESSIONS_PREFIX",
    "decode_manifest",
    "encode_manifest",
    "merge_problem",
    "manifest_key",
    "segment_key",
    "segment_name",
    "session_dir",
    "session_of_manifest_key",
]

SESSIONS_PREFIX = "sessions/"
MANIFEST_NAME = "manifest.json"
_SEGMENT_NAME = re.compile(r"^seg-(\d{12})-(\d{12})\.avro$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def session_dir(session_id: str) -> str:
    shard = hashlib.sha256(session_id.encode()).hexdigest()[:2]
    encoded = quote(session_id, safe="")
    if encoded.startswith("."):  # "." and ".." are not names; a leading dot hides a file
        encoded = "%2E" + encoded[1:]
    return f"{SESSIONS_PREFIX}{shard}/{encoded}/"


def manifest_key(session_id: str) -> str:
    return session_dir(session_id) + MANIFEST_NAME


def segment_name(first: int, end: int) -> str:
    return f"seg-{first:012d}-{end:012d}.avro"


def segment_key(session_id: str, ref: SegmentRef) -> str:
    return session_dir(session_id) + ref.key


def session_of_manifest_key(key: str) -> str | None:
    """The session id a manifest key belongs to (``None`` for any other key)."""
    parts = key.split("/")
    if len(parts) != 4 or parts[0] + "/" != SESSIONS_PREFIX or parts[3] != MANIFEST_NAME:
        return None
    return unquote(parts[2])


def _ref_json(ref: SegmentRef) -> dict[str, Any]:
    return {"key": ref.key, "first": ref.first, "end": ref.end, "sha256": ref.sha256, "bytes": ref.size}


def encode_manifest(manifest: Manifest) -> bytes:
    value: dict[str, Any] = {
        "v": 1,
        "session": manifest.session_id,
        "segments": [_ref_json(s) for s in manifest.segments],
        "pending": None if manifest.pending is None else _ref_json(manifest.pending),
    }
    if manifest.merging is not None:
        value["merging"] = {
            "segment": _ref_json(manifest.merging.segment),
            "inputs": [_ref_json(s) for s in manifest.merging.inputs],
        }
    if manifest.retired:
        groups: dict[int, list[str]] = {}  # one group per merge: its time and the keys it retired
        for r in manifest.retired:
            groups.setdefault(r.at_ms, []).append(r.key)
        value["retired"] = [{"at": at, "keys": keys} for at, keys in groups.items()]
    return canonical.canonical_json(value)


def _ref(value: Any) -> SegmentRef:
    ref = SegmentRef(
        str(value["key"]), int(value["first"]), int(value["end"]), str(value["sha256"]), int(value["bytes"])
    )
    m = _SEGMENT_NAME.match(ref.key)
    if m is None or (int(m.group(1)), int(m.group(2))) != (ref.first, ref.end):
        raise ValueError(f"segment key {ref.key!r} does not name seqs {ref.first}..{ref.end}")
    if not 0 <= ref.first < ref.end or ref.size < 0 or not _HEX64.match(ref.sha256):
        raise ValueError(f"segment {ref.key!r} has a bad range, size or digest")
    return ref


def decode_manifest(raw: bytes, session_id: str, where: str) -> Manifest:
    """The manifest in ``raw`` (read from ``where``); ArchiveCorrupt naming ``where`` when it is not one."""
    try:
        value = canonical.loads(raw)
        if value.get("v") != 1:
            raise ValueError(f"unknown manifest version {value.get('v')!r}")
        if value["session"] != session_id:
            raise ValueError(f"it belongs to session {value['session']!r}")
        segments = tuple(_ref(s) for s in value["segments"])
        pending = None if value["pending"] is None else _ref(value["pending"])
        merge = value.get("merging")
        merging = (
            None if merge is None else MergeIntent(_ref(merge["segment"]), tuple(_ref(s) for s in merge["inputs"]))
        )
        retired = tuple(
            RetiredSegment(_retired_key(key), at)
            for g in value.get("retired", ())
            for at in (_at_ms(g["at"]),)
            for key in g["keys"]
        )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ArchiveCorrupt(where, f"not a manifest of session {session_id!r}: {exc}") from exc
    at = 0
    for ref in segments:
        if ref.first != at:
            raise ArchiveCorrupt(
                where, f"segments are not contiguous from seq 0: {ref.key} starts at {ref.first}, expected {at}"
            )
        at = ref.end
    if pending is not None and pending.first != at:
        raise ArchiveCorrupt(where, f"the pending segment {pending.key} does not start at the watermark {at}")
    if merging is not None:
        problem = merge_problem(segments, merging)
        if problem:
            raise ArchiveCorrupt(where, f"the merge of {merging.segment.key} {problem}")
    live = {ref.key for ref in segments}
    for r in retired:
        if r.key in live:
            raise ArchiveCorrupt(where, f"{r.key} is listed both as a segment and as retired")
    return Manifest(session_id, segments, pending, merging, retired)


def _retired_key(key: Any) -> str:
    """A retired segment's key, checked cheaply (readers never read one; a tidy deletes it in the session's
    directory): a segment name without a path."""
    if not isinstance(key, str) or not (key.startswith("seg-") and key.endswith(".avro")) or "/" in key:
        raise ValueError(f"not a retired segment's key: {key!r}")
    return key


def _at_ms(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"a retired segment's time must be epoch milliseconds, not {value!r}")
    return value


def merge_problem(segments: tuple[SegmentRef, ...], merge: MergeIntent) -> str:
    """Why ``merge`` cannot replace a run of ``segments`` (empty when it can): its inputs must be two or more
    of them, adjacent, exactly as listed, and its output must cover exactly their seqs."""
    inputs = merge.inputs
    if len(inputs) < 2:
        return "names fewer than two inputs"
    if (merge.segment.first, merge.segment.end) != (inputs[0].first, inputs[-1].end):
        return f"covers seqs {merge.segment.first}..{merge.segment.end}, its inputs {inputs[0].first}..{inputs[-1].end}"
    try:
        start = segments.index(inputs[0])
    except ValueError:
        return f"names input {inputs[0].key}, which is not one of the segments"
    if segments[start : start + len(inputs)] != inputs:
        return "names inputs that are not a run of the segments as listed"
    return ""
