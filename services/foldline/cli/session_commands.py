"""Commands on sessions: list, show, export, import, fork and resume them.

The data directory is ``--data-dir``, else ``$FOLDLINE_DATA_DIR``, else ``./foldline-data``. ``sessions``,
``show`` and ``export`` only read: they open the stores read-only and never create a data directory.

Exit status of ``sessions``, ``show``, ``export`` and ``import``: 0 on success; 2 on any reported error — a
usage error, a foldline error (unknown or existing session, a bad export line, an unavailable store) or a
file that cannot be read or written — with one line on stderr and nothing written; 1 only for an
unexpected crash (a bug: please report it).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, BinaryIO

import orjson
import typer
from rich.table import Table
from rich.text import Text

from ..config.prices import load_price_table
from ..core.codec import json_default
from ..core.content import (
    EncryptedReasoningBlock,
    ImageBlock,
    ReasoningBlock,
    RedactedReasoningBlock,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
)
from ..core.cost import PriceTable, drop_key, price_step
from ..core.diff import snapshot_diffs
from ..core.drops import DropTracker
from ..core.events import (
    MAX_TIME_MS,
    ApprovalDecision,
    ApprovalRequest,
    AssistantChunk,
    AssistantMessage,
    AttachmentQuarantine,
    CompactionSummary,
    Envelope,
    InboxClaim,
    LlmRetry,
    RequestDispatch,
    RequestHeader,
    SessionEndSeed,
    SessionParent,
    ToolCall,
    ToolResult,
    TurnEnd,
    TurnRecovery,
    UserMessage,
)
from ..core.lineage import ChildLink, child_links, lineage
from ..core.projection import fold_request_header
from ..core.sealing import erased_view
from ..core.validation import id_problem
from ..core.wire import encode_event, header_to_json
from ..errors import ConfigError, InputError, SessionNotFound, TurnOpen
from .cost_commands import step_note
from .options import BackendOpt, DataDirOpt, JsonOpt, config_for, session_ids, stores_for
from .output import console, diff_lines, err_console, fail_on_errors, json_safe, line, literal, write_json

if TYPE_CHECKING:
    from ..export import ExportSummary

__all__ = ["register"]

EXIT_CODES = "Exit status: 0 ok; 2 error (one line on stderr, nothing written)."
_PAGE = 1000  # events read per page by show
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

AttachmentsOpt = Annotated[
    Path | None,
    typer.Option(
        "--attachments",
        help="A directory holding the session's attachment objects (the embedded store's layout): export copies "
        "them there, import takes them from there.",
        show_default=False,
    ),
]


def register(app: typer.Typer) -> None:
    app.command("sessions", epilog=EXIT_CODES)(fail_on_errors(sessions_cmd))
    app.command("show", epilog=EXIT_CODES)(fail_on_errors(show))
    app.command("export", epilog=EXIT_CODES)(fail_on_errors(export_cmd))
    app.command("import", epilog=EXIT_CODES)(fail_on_errors(import_cmd))
    app.command("fork")(fail_on_errors(fork))
    app.command("resume")(fail_on_errors(resume))


def _iso(ms: int) -> str:
    if not 0 <= ms <= MAX_TIME_MS:  # the log rules keep times in range; an old file may not
        return f"{ms} ms (not a date)"
    moment = _EPOCH + timedelta(milliseconds=ms)  # exact: a float division would round the last millisecond
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def sessions_cmd(data_dir: DataDirOpt = None, backend: BackendOpt = None, as_json: JsonOpt = False) -> None:
    """List the sessions of the log as a tree: id, event count, the time of the last event, and where each came
    from — a fork of a parent's prefix, or a sub-agent a parent's tool call ran — with its children below it."""
    rows: list[dict[str, Any]] = []
    config = config_for(data_dir, backend)
    if config.backend != "embedded" or config.data_dir.exists():  # do not create a data dir just to list it
        with stores_for(config, read_only=True) as stores:
            for sid in stores.log.sessions():
                events = stores.log.read(sid)
                last_ms = events[-1].time if events else None
                own = lineage(events)
                rows.append(
                    {
                        "id": sid,
                        "events": len(events),
                        "lastEventTime": last_ms,
                        "lastEventAt": None if last_ms is None else _iso(last_ms),
                        "parent": own.to_json() if own is not None else None,
                        "children": [
                            {"id": link.child_id, "callId": link.call_id, "tool": link.tool}
                            for link in child_links(events)
                        ],
                    }
                )
    known = {row["id"] for row in rows}
    for row in rows:  # a fork names its children nowhere in its parent's log: found from the children's side
        parent = row["parent"]
        if parent is not None and parent["kind"] == "fork" and parent["parent"] in known:
            for other in rows:
                if other["id"] == parent["parent"]:
                    other["children"].append({"id": row["id"], "fork": True, "seq": parent["seq"]})
    if as_json:
        write_json(rows, canonical=True)
        return
    where = f" in {config.data_dir}" if config.backend == "embedded" else ""
    if not rows:
        console.print(literal(f"no sessions{where}"))
        return
    table = Table(title=literal(f"sessions{where}"))
    table.add_column("session")
    table.add_column("events", justify="right")
    table.add_column("last event (UTC)")
    table.add_column("from")
    by_id = {row["id"]: row for row in rows}
    shown: set[str] = set()

    def add(row: dict[str, Any], depth: int) -> None:
        if row["id"] in shown:
            return
        shown.add(row["id"])
        parent = row["parent"]
        origin = ""
        if parent is not None and parent["kind"] == "subagent":
            origin = f"sub-agent of {parent['parent']} (call {parent['callId']}, {parent['tool']})"
        elif parent is not None:
            origin = f"fork of {parent['parent'] or 'an unnamed parent'} (seed ends at seq {parent['seq']})"
        name = ("  " * depth + ("└ " if depth else "")) + row["id"]
        table.add_row(literal(name), f"{row['events']:,}", row["lastEventAt"] or "-", literal(origin))
        for child in row["children"]:
            if child["id"] in by_id:
                add(by_id[child["id"]], depth + 1)

    for row in rows:
        parent = row["parent"]
        if parent is None or parent["parent"] not in by_id:
            add(row, 0)
    for row in rows:  # anything left (a cycle a hand-made log could draw) at the top
        add(row, 0)
    console.print(table)


# ------------------------------------------------------------------ show


def _blocks(content: tuple[object, ...]) -> str:
    parts = []
    for b in content:
        if isinstance(b, TextBlock):
            parts.append(b.text if len(b.text) <= 80 else b.text[:77] + "…")
        elif isinstance(b, ImageBlock):
            parts.append(f"[image {b.image.attachment_id[:15]}… {b.image.width}x{b.image.height}]")
        elif isinstance(b, ToolCallBlock):
            parts.append(f"[call {b.name}({b.arguments if len(b.arguments) <= 80 else b.arguments[:77] + '…'})]")
        elif isinstance(b, ToolResultBlock):
            parts.append(f"[result {b.tool_call_id}: {_blocks(b.content)}]")
        elif isinstance(b, ReasoningBlock):
            parts.append(f"[reasoning {b.text if len(b.text) <= 60 else b.text[:57] + '…'}]")
        elif isinstance(b, RedactedReasoningBlock | EncryptedReasoningBlock):
            parts.append("[encrypted reasoning]")
    return " ".join(parts)


def _summary(data: object, note: str = "") -> str:
    """One event in a line of plain text (escaped when printed); ``note``: its step's cost, for an answer."""
    match data:
        case UserMessage():
            op = "" if data.surface_op == "append" else f" replace {data.surface_op.start}..{data.surface_op.end}"
            return f"({data.source}{op}) {_blocks(data.content)}"
        case AssistantMessage():
            u = data.usage
            usage = f" [in {u.input} read {u.cache_read} write {u.cache_write} out {u.output}]" if u else ""
            stop = f" ({data.stop_reason})" if data.stop_reason in ("interrupted", "refusal", "pause_turn") else ""
            named = (("request", data.provider_request_id), ("message", data.provider_message_id))
            ids = [f"{k}={v}" for k, v in named if v]
            cost = f" [{note}]" if note else ""
            return _blocks(data.content) + usage + cost + stop + (f" {{{' '.join(ids)}}}" if ids else "")
        case LlmRetry():
            status = f"HTTP {data.status} " if data.status is not None else ""
            then = f"retry in {data.wait_ms} ms" if data.wait_ms is not None else "gave up"
            after = f" after {data.received_bytes} answer bytes" if data.received_bytes else " before any answer byte"
            rid = f" request={data.provider_request_id}" if data.provider_request_id else ""
            return f"attempt {data.attempt} failed: {status}{data.error_type}{after}; {then}{rid}"
        case AssistantChunk():
            name = f"{data.event} " if data.event else ""
            return f"attempt {data.attempt} #{data.index} {name}{data.data[:100]}"
        case ToolResult():
            op = "" if data.surface_op == "append" else " (trim)"
            child = f" → sub-agent session {data.child_session_id}" if data.child_session_id else ""
            return f"{data.name} {data.call_id}{op}{' ERROR' if data.is_error else ''}{child}: {_blocks(data.content)}"
        case ApprovalRequest():
            return f"{data.name} call {data.call_id} awaits a decision (arguments {data.arguments_digest[:19]}…)"
        case ApprovalDecision():
            changed = f" with arguments {data.arguments}" if data.arguments is not None else ""
            why = f": {data.reason}" if data.reason else ""
            by = f" by {data.decided_by}" if data.decided_by else ""
            return f"{data.verdict} call {data.call_id}{changed}{by}{why} (inbox entry {data.entry})"
        case InboxClaim():
            return f"takes inbox entr{'y' if len(data.entries) == 1 else 'ies'} {', '.join(data.entries)}"
        case TurnRecovery():
            parts = [f"turn {data.turn}: {data.policy}"]
            if data.interrupted:
                parts.append(f"interrupted {', '.join(data.interrupted)}")
            if data.rerun:
                parts.append(f"run again {', '.join(data.rerun)}")
            return "; ".join(parts)
        case SessionParent():
            return f"sub-agent of {data.parent_id} (call {data.call_id}, {data.tool})"
        case SessionEndSeed():
            return f"fork of {data.parent_id or 'an unnamed parent'}" + (
                f" (seed of {data.seed_length} events)" if data.seed_length is not None else ""
            )
        case ToolCall():
            args = data.arguments if len(data.arguments) <= 120 else data.arguments[:117] + "…"
            return f"{data.name}({args}) id={data.call_id}"
        case RequestHeader():
            return (
                f"reason={data.reason} "
                + orjson.dumps(header_to_json(data.header), default=json_default).decode()[:160]
            )
        case RequestDispatch():
            return f"{data.serializer}/v{data.serializer_version} {data.digest[:23]}… {data.bytes} bytes"
        case TurnEnd():
            return f"turn {data.turn} {data.reason}"
        case CompactionSummary():
            return f"{data.provider}/{data.model}: {data.summary[:100]}"
        case AttachmentQuarantine():
            return f"{data.attachment_id[:23]}… {data.failure}"
    return ""


class _StepNotes:
    """Each answer's step cost (spend, saved, its drop's cost), as the transcript streams by."""

    def __init__(self, session: str, table: PriceTable) -> None:
        self.tracker = DropTracker(session)
        self.table = table

    def feed(self, page: list[Envelope]) -> dict[int, str]:
        """Notes by the seq of the answer that completes each step in ``page``."""
        out: dict[int, str] = {}
        for verdict in self.tracker.feed(page):
            priced = price_step(verdict, self.table)
            note = step_note(priced, self.table.currency)
            if verdict.drop is not None:
                note += f" ({drop_key(verdict.drop)})"
            out[verdict.step.response_seq] = note
        return out


@contextlib.contextmanager
def _progress(total: int, what: str, unit: str = "", *, beside_output: bool = True) -> Iterator[Callable[[int], None]]:
    """A progress bar on stderr when it is a terminal (else nothing); yields ``advance(n)``.

    ``beside_output=False``: only while stdout goes elsewhere (a file, a pipe) — when the output itself
    streams onto the terminal, it is the progress.
    """
    if not err_console.is_terminal or (not beside_output and console.is_terminal):
        yield lambda _n: None
        return
    from rich.progress import BarColumn, DownloadColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    count = DownloadColumn() if unit == "bytes" else MofNCompleteColumn()
    with Progress(
        TextColumn("{task.description}"), BarColumn(), count, TimeElapsedColumn(), console=err_console, transient=True
    ) as progress:
        task = progress.add_task(what, total=total or None)
        yield lambda n: progress.advance(task, n)


def show(
    session: Annotated[str, typer.Argument(help="Session id.")],
    data_dir: DataDirOpt = None,
    backend: BackendOpt = None,
    json: Annotated[
        bool, typer.Option("--json", help="Print the events themselves, one canonical JSON object per line.")
    ] = False,
) -> None:
    """Print a session's transcript, header snapshots included, as it streams from the log.

    One line per event: seq, type and a summary of its content. Every character of the log is shown as it
    is (control characters escaped); nothing in a log is read as formatting. The content of an erased session
    shows as [erased]; its structure (seqs, types, ids, usage, digests) as logged. --json prints the events as
    the log holds them (an erased event's content sealed).
    """
    session_ids(session)
    config = config_for(data_dir, backend)
    with stores_for(config, read_only=True) as stores:
        log = stores.log
        head = log.head(session)
        if head == 0:
            raise SessionNotFound(session)
        out = sys.stdout
        notes = _StepNotes(session, load_price_table(config.prices)) if not json else None
        if not json:
            console.print(line(("session ", "bold"), (session, "bold"), f" — {head:,} events"))
            first = log.read(session, 0, 1)
            if first and isinstance(first[0].data, SessionParent):
                up = first[0].data
                console.print(literal(f"sub-agent of {up.parent_id} (call {up.call_id}, tool {up.tool})"))
        width = len(str(head - 1))
        children: list[ChildLink] = []
        with _progress(head, "events", beside_output=False) as advance:
            for start in range(0, head, _PAGE):
                page = log.read(session, start, min(start + _PAGE, head))
                if json:
                    out.write(json_safe("".join(encode_event(e).decode() + "\n" for e in page)))
                elif console.is_terminal:
                    assert notes is not None
                    costs = notes.feed(page)
                    text = Text()
                    for e in page:
                        style = "bold magenta" if isinstance(e.data, RequestHeader) else ""
                        summary = _summary(erased_view(e).data, costs.get(e.seq, ""))
                        text.append_text(literal(f"{e.seq:>{width}}  {e.type:<22} {summary}", style))
                        text.append("\n")
                    console.print(text, end="")
                else:
                    assert notes is not None
                    costs = notes.feed(page)
                    out.write(
                        "".join(
                            literal(
                                f"{e.seq:>{width}}  {e.type:<22} {_summary(erased_view(e).data, costs.get(e.seq, ''))}"
                            ).plain
                            + "\n"
                            for e in page
                        )
                    )
                if any(isinstance(e.data, SessionEndSeed) for e in page):
                    children = []  # what came before is a fork's copy of its parent's prefix
                children += [link for link in child_links(page) if link.child_id not in {c.child_id for c in children}]
                advance(len(page))
        out.flush()
        if not json and children:
            console.print(literal(f"sub-agents: {', '.join(f'{c.child_id} (call {c.call_id})' for c in children)}"))


# ------------------------------------------------------------------ export / import


@contextlib.contextmanager
def _atomic_output(path: Path) -> Iterator[BinaryIO]:
    """A file at ``path`` that appears only if the block succeeds (temp file + rename)."""
    target = path.resolve()
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as fp:
            yield fp
            fp.flush()
            os.fsync(fp.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _bundle(path: Path, *, read_only: bool) -> Any:
    from ..adapters.fs_attachments import FilesystemAttachmentStore

    if path.exists() and not path.is_dir():
        raise InputError(f"--attachments {path} is a file; name a directory")
    if read_only and not path.is_dir():
        raise InputError(f"--attachments {path} does not exist; name the directory the export copied them to")
    return FilesystemAttachmentStore(path, read_only=read_only)


def _attachment_note(summary: ExportSummary, bundle: Path | None, *, exported: bool) -> Text | None:
    """What to tell about the session's attachment objects (``None``: it references none)."""
    n = len(summary.attachments)
    if not n:
        return None
    size = f"{n} attachment object(s), {summary.attachment_bytes:,} bytes"
    if summary.missing:
        where = "the store" if exported else ("the bundle" if bundle is not None else "this data directory's store")
        fix = (
            " — verify reports the steps that need them as unreconstructable; pass --attachments DIR with a copy"
            if not exported
            else ""
        )
        return line(("warning:", "yellow"), f" {len(summary.missing)} of the {size} are not in {where}{fix}")
    if bundle is not None:
        verb = "copied to" if exported else "taken from"
        return literal(f"{size}: {summary.copied} {verb} {bundle} (the others were there already)")
    if exported:
        return line(
            ("note:", "yellow"),
            f" the session references {size} that the export file does not carry; pass --attachments DIR to copy "
            "them, and import --attachments DIR to take them",
        )
    return None


def _summary_json(summary: ExportSummary, **extra: Any) -> dict[str, Any]:
    return {
        "session": summary.session_id,
        "events": summary.events,
        "digest": summary.digest,
        "attachments": list(summary.attachments),
        "missingAttachments": list(summary.missing),
        "copiedAttachments": summary.copied,
        **extra,
    }


def export_cmd(
    session: Annotated[str, typer.Argument(help="The session id to export.", show_default=False)],
    out: Annotated[
        Path,
        typer.Option("--out", "-o", help="File to write (JSON Lines); '-' writes to stdout.", show_default=False),
    ],
    attachments: AttachmentsOpt = None,
    data_dir: DataDirOpt = None,
    backend: BackendOpt = None,
    json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON (on stderr with --out -).")] = False,
) -> None:
    """Write one session as JSON Lines: a header line, then one canonical event per line (docs/FORMAT.md).

    The session's attachment objects (images) are not in the file: they are named, and with
    ``--attachments DIR`` copied (verified) into DIR, for ``import --attachments DIR`` to take. The file is
    noted in the key store, so that erasing the session removes it too (while it is still this export); an
    erased session's file holds its structure and no content (its events as the log holds them, sealed).
    """
    from ..export import export_session

    session_ids(session)
    to_stdout = str(out) == "-"
    config = config_for(data_dir, backend)
    with stores_for(config, read_only=True) as stores:
        bundle = _bundle(attachments, read_only=False) if attachments is not None else None
        source = stores.attachments if bundle is not None else None
        if to_stdout:
            summary = export_session(stores.log, session, sys.stdout.buffer, attachments=source, bundle=bundle)
            sys.stdout.buffer.flush()
        else:
            try:
                with _atomic_output(out) as fp:
                    summary = export_session(stores.log, session, fp, attachments=source, bundle=bundle)
            except OSError as exc:
                raise InputError(f"cannot write {out}: {exc.strerror or exc}") from exc
    tracked = None if to_stdout else _track_export(config, summary, out)
    report = err_console if to_stdout else console
    if json:
        extra: dict[str, Any] = {"out": str(out), "erased": summary.erased}
        if tracked is not None:
            extra["tracked"] = tracked == ""
        write_json(_summary_json(summary, **extra), stderr=to_stdout, canonical=True)
        return
    where = "" if to_stdout else f" to {out}"
    report.print(literal(f"exported {summary.events:,} events of {summary.session_id!r}{where} ({summary.digest})"))
    if summary.erased:
        err_console.print(
            line(
                ("erased:", "cyan"),
                f" the session's content was erased: its {summary.erased:,} content event(s) are written sealed "
                "(structure only, no content)",
            )
        )
    if tracked:
        err_console.print(
            line(
                ("note:", "yellow"),
                f" the export was not noted in the key store ({tracked}): "
                "erasing the session will not remove this file",
            )
        )
    note = _attachment_note(summary, attachments, exported=True)
    if note is not None:
        err_console.print(note)


def _track_export(config: Any, summary: ExportSummary, out: Path) -> str:
    """Note the export file in the key store (so an erasure removes it); ``""`` when noted, else why not."""
    import socket
    import time

    from ..config.factories import key_store
    from ..errors import FoldlineError
    from ..ports.key_store import TrackedExport

    export = TrackedExport(
        summary.session_id, socket.gethostname(), str(out.resolve()), summary.digest, time.time_ns() // 1_000_000
    )
    try:
        keys = key_store(config)
        try:
            keys.track_export(export)
        finally:
            keys.close()
    except FoldlineError as exc:
        return f"{type(exc).__name__}: {exc}"
    return ""


class _CountingReader:
    """A binary file whose ``readline`` reports the bytes read (for the progress bar), a MiB at a time."""

    _EVERY = 1 << 20

    def __init__(self, fp: BinaryIO, advance: Callable[[int], None]) -> None:
        self._fp, self._advance = fp, advance
        self._pending = 0

    def readline(self, size: int = -1, /) -> bytes:
        raw = self._fp.readline(size)
        self._pending += len(raw)
        if self._pending >= self._EVERY or not raw:
            self._advance(self._pending)
            self._pending = 0
        return raw


def import_cmd(
    file: Annotated[Path, typer.Argument(help="An export file; '-' reads stdin.", show_default=False)],
    as_id: Annotated[
        str | None, typer.Option("--as", help="Import under this new session id instead of the file's.")
    ] = None,
    attachments: AttachmentsOpt = None,
    subject: Annotated[
        str | None,
        typer.Option(
            "--subject",
            help="Put the session in this subject's erasure scope: `foldline erase --subject ID` erases it too.",
            show_default=False,
        ),
    ] = None,
    data_dir: DataDirOpt = None,
    backend: BackendOpt = None,
    json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """Validate an export completely while it streams in, then commit it as one new session — or write nothing.

    ``--attachments DIR`` takes the session's attachment objects from DIR (as ``export --attachments``
    wrote it), each verified against the log's reference. Its content is stored sealed under a key of its own
    (when encryption is on: FOLDLINE_ENCRYPTION), so that `foldline erase` can destroy it.
    """
    from ..export import import_session

    if as_id is not None and as_id:
        session_ids(as_id)
    from_stdin = str(file) == "-"
    if not from_stdin:
        if file.is_dir():
            raise InputError(f"cannot read {file}: it is a directory; import takes an export file (or '-' for stdin)")
        try:
            fp: BinaryIO = file.open("rb")
        except OSError as exc:
            raise InputError(f"cannot read {file}: {exc.strerror or exc}") from exc
        total = file.stat().st_size
    else:
        fp, total = sys.stdin.buffer, 0
    with contextlib.closing(fp), stores_for(config_for(data_dir, backend)) as stores:
        bundle = _bundle(attachments, read_only=True) if attachments is not None else None
        with _progress(total, "importing", "bytes") as advance:
            reader = _CountingReader(fp, advance) if err_console.is_terminal else fp
            try:
                summary = import_session(
                    stores.log, reader, as_id, attachments=stores.attachments, bundle=bundle, subject=subject
                )
            except OSError as exc:
                raise InputError(f"cannot read {file}: {exc.strerror or exc}") from exc
    if json:
        write_json(_summary_json(summary), canonical=True)
        return
    console.print(literal(f"imported {summary.events:,} events as session {summary.session_id!r} ({summary.digest})"))
    note = _attachment_note(summary, attachments, exported=False)
    if note is not None:
        err_console.print(note)


# ------------------------------------------------------------------ fork / resume


def _model_option(model: str | None) -> None:
    if model is not None:
        problem = id_problem(model, 256) or (None if model.strip() else "it is blank")
        if problem is not None:
            raise ConfigError(f"--model {model[:40]!r} is not a model name: {problem}")


def _read_system_file(path: Path) -> str:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read --system-file {path}: {exc.strerror or exc}; pass a readable file") from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(
            f"--system-file {path} is not UTF-8 text (byte {exc.start} is {raw[exc.start]:#04x}); pass a text file"
        ) from None
    if "\x00" in text:
        raise InputError(f"--system-file {path} holds NUL characters: it looks like a binary file; pass a text file")
    return text


def fork(
    session: Annotated[str, typer.Argument(help="Parent session id.")],
    at: Annotated[int, typer.Option("--at", help="Keep the parent's events 0..SEQ (a step boundary).")],
    model: Annotated[str | None, typer.Option("--model", help="Model for the child from its first request.")] = None,
    system_file: Annotated[
        Path | None, typer.Option("--system-file", help="Override the system prompt with this file's text.")
    ] = None,
    as_id: Annotated[str | None, typer.Option("--as", help="Child id (default PARENT-fork-SEQ).")] = None,
    data_dir: DataDirOpt = None,
    backend: BackendOpt = None,
    json: JsonOpt = False,
) -> None:
    """Create a child session from a parent's prefix; overrides become a logged `resume` snapshot."""
    from ..loop.fork import fork_session
    from ..replay.verify import verify_events

    session_ids(session, as_id)
    _model_option(model)
    system = _read_system_file(system_file) if system_file is not None else None
    with stores_for(config_for(data_dir, backend)) as stores:
        result = fork_session(stores.log, session, at, as_id, model=model, system=system)
        report = verify_events(result.child_id, stores.log.read(result.child_id), stores.attachments)
    drift = [d for s, d in snapshot_diffs(result.events) if s.seq == result.override_seq]
    if json:
        out = {
            "child": result.child_id,
            "parent": result.parent_id,
            "seedLength": result.seed_length,
            "overrideSeq": result.override_seq,
            "drift": drift[0].to_json() if drift else None,
            "verify": report.to_json(),
        }
        write_json(out)
    else:
        console.print(
            line(
                "forked ",
                (session, "bold"),
                f" at seq {at} → ",
                (result.child_id, "bold"),
                f" (seed length {result.seed_length}, session/end-seed at seq {result.seed_length})",
            )
        )
        if drift:
            console.print(literal(f"override snapshot (reason resume) at seq {result.override_seq}:"))
            for text in diff_lines(drift[0]):
                console.print(line("  ", text))
        console.print(literal(f"the child verifies on its own: {report.matched}/{report.checked} requests match"))
    if not report.ok:
        raise typer.Exit(1)


def resume(
    session: Annotated[str, typer.Argument(help="Session id (e.g. a demo session).")],
    model: Annotated[str | None, typer.Option("--model", help="Reconfigure the model for this instance.")] = None,
    steps: Annotated[int, typer.Option("--steps", min=1, help="Loop steps to run (new turns).")] = 4,
    budget: Annotated[
        int | None, typer.Option("--budget", min=200, help="Token budget: trim / compact above it (default: off).")
    ] = None,
    on_crash: Annotated[
        str,
        typer.Option(
            "--on-crash", help="A turn a crash left open: end it, or continue it (the model sees what was interrupted)."
        ),
    ] = "end",
    data_dir: DataDirOpt = None,
    backend: BackendOpt = None,
    json: JsonOpt = False,
) -> None:
    """Continue a session with a new loop instance against the emulator (writes a `resume` snapshot).

    An open turn is continued first, and alone: a turn paused on approvals takes its decisions from the inbox
    (`foldline approve`) and goes on; a turn a crash left open mid-step is ended (each call without a result gets
    an error result saying it was interrupted) or, with --on-crash continue, continued. Otherwise new turns run
    for --steps steps. The session is read once (as the instance takes it over); afterwards only what the
    instance appended is read back, and its requests are verified (`foldline verify` rebuilds every request of
    a session).
    """
    from ..demo import PROMPTS, toolset_for
    from ..loop import Agent, AgentOptions
    from ..loop.agent import StepRecord, TurnResult
    from ..loop.pressure import PressurePolicy
    from ..providers.emulated import emulated_provider, wire_format_of
    from ..replay.verify import verify_events
    from ..tracing import traced_log
    from .demo_commands import emulator_only

    session_ids(session)
    _model_option(model)
    if on_crash not in ("end", "continue"):
        raise ConfigError(f"--on-crash must be end or continue, got {on_crash!r}")
    settings = config_for(data_dir, backend)
    emulator_only(settings, "foldline resume")
    with stores_for(settings) as stores:
        if stores.log.head(session) == 0:
            raise SessionNotFound(session)
        # the instance's lease and the session as its take-over found it: the one read of the whole session
        log = traced_log(stores.log)  # with tracing on, the tracer starts from the session as read here
        opened = log.acquire_and_read(session)
        events = opened[1]
        folded = fold_request_header(events)
        if folded is None:
            raise ConfigError(
                f"session {session!r} has no request/header yet, so there is no configuration to resume from; "
                "run a first request (e.g. with foldline demo) before resuming"
            )
        config = folded.config.with_overrides(model=model) if model else folded.config
        last = next((e.data.serializer for e in reversed(events) if isinstance(e.data, RequestDispatch)), None)
        provider = emulated_provider(wire_format_of(last, config.provider))
        policy = (
            PressurePolicy(budget, keep_recent_tokens=budget // 3, summary_max_tokens=max(64, budget // 4))
            if budget
            else None
        )
        options = AgentOptions(
            config=config,
            system=folded.system,
            tools=toolset_for(folded.tools),
            pressure=policy,
            outage_s=settings.outage_s,
            on_crash="continue" if on_crash == "continue" else "end",
        )
        agent = Agent(session, log, provider, options, attachments=stores.attachments, opened=opened)
        gc.freeze()  # the loaded session lives until the command ends: the collector need not walk it again
        records: list[StepRecord] = []
        agent.step_listeners.append(records.append)
        continued: list[TurnResult] = []

        async def run() -> None:
            try:
                if agent.turn_open:
                    continued.append(await agent.continue_turn())
                    return
                turn = 0
                while len(records) < steps:
                    agent.options.max_steps_per_turn = steps - len(records)
                    ended = await agent.run_turn(f"[{session}] {PROMPTS[turn % len(PROMPTS)]}")
                    if ended.failure is not None:
                        raise ended.failure
                    turn += 1
            finally:
                await provider.aclose()

        asyncio.run(run())
        after = [*events, *stores.log.read(session, len(events))]  # only what this instance appended is read
        report = verify_events(
            session,
            after,
            stores.attachments,
            from_seq=len(events),
            values_checked_before=True,
            read=stores.log.read,
        )
    if continued and continued[0].paused:
        waiting = continued[0].pending
        calls = ", ".join(p.call_id for p in waiting)
        raise TurnOpen(
            session,
            continued[0].turn,
            f"session {session!r} is paused: call(s) {calls} wait for approval decisions; decide each with "
            f"`foldline approve {session} CALL_ID --allow|--deny`, then resume again",
        )
    resume_snaps = [(s, d) for s, d in snapshot_diffs(after) if s.seq >= len(events) and s.reason == "resume"]
    snap, drift = resume_snaps[0] if resume_snaps else (None, None)
    if json:
        out: dict[str, Any] = {
            "session": session,
            "resumeSeq": snap.seq if snap is not None else None,
            "drift": drift.to_json() if drift is not None else None,
            "continued": (
                {"turn": continued[0].turn, "reason": continued[0].reason, "text": continued[0].text}
                if continued
                else None
            ),
            "steps": [
                {
                    "step": i,
                    "header": r.header_reason,
                    "prompt_tokens": r.usage.prompt_tokens,
                    "cache_read_tokens": r.usage.cache_read,
                    "cache_write_tokens": r.usage.cache_write,
                    "output_tokens": r.usage.output,
                }
                for i, r in enumerate(records)
            ],
            "verified": report.ok,
        }
        write_json(out)
    else:
        if snap is not None and drift is not None:
            console.print(line("resumed ", (session, "bold"), f": snapshot (reason resume) at seq {snap.seq}"))
            for text in diff_lines(drift):
                console.print(line("  ", text))
        if continued:
            done = continued[0]
            console.print(
                line("continued turn ", str(done.turn), " of ", (session, "bold"), f": it ended {done.reason}")
            )
        table = Table(title="steps of this loop instance")
        for col in ("step", "header", "prompt", "cache read", "ratio"):
            table.add_column(col, justify="right" if col != "header" else "left")
        for i, r in enumerate(records):
            u = r.usage
            ratio = u.cache_read / u.prompt_tokens if u.prompt_tokens else 0.0
            table.add_row(str(i), r.header_reason or "", str(u.prompt_tokens), str(u.cache_read), f"{ratio:.2f}")
        console.print(table)
        console.print(
            literal(
                "a new process starts with a cold emulator cache, so the first request reads nothing; "
                f"verify: {report.matched}/{report.checked} requests of this instance match"
            )
        )
    if not report.ok:
        raise typer.Exit(1)
