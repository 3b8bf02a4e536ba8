"""Replay: test a change to an agent against recorded sessions before it ships (docs/REPLAY.md).

The recorded session's inputs go through a real :class:`~foldline.loop.Agent` built with the change — the loop's
own code, as Temporal's replayer runs a workflow's own code — while a provider answers from the recording for
as long as each request the changed agent builds is byte-identical to the recorded one. The first request
that differs is the report: what differs (header fields, or the message and its first differing field), the
byte where the bodies part, and what the change costs in prompt cache there. Then the replay stops, or goes
on ``live`` against a provider as a fork child of the recorded session.

    from foldline import Change, Config, open_stores, replay_sessions

    stores = open_stores(Config.from_env(), read_only=True)
    report = replay_sessions(["demo-000", Path("sessions/checkout.jsonl")], Change(system=new_prompt), stores=stores)
    report.assert_identical()       # or report.exit_code, report.to_json(), report.junit_xml()

Not to be confused with :mod:`foldline.replay`, the rebuild layer (``verify``, the invariant companion) this
package stands on.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path

from ..config import Stores
from ..errors import ConfigError, NothingToReplay
from .change import Change, load_tools, read_config_file
from .cost import ChangeCost, CostSummary, cache_write_money
from .engine import Found, run_once
from .live import Live, ProviderFactory, continue_live, emulated_provider_for
from .recording import Recording, script_of
from .report import Divergence, LiveResult, ReplayReport, SessionReplay, divergence_of, unstable_fields

__all__ = [
    "Change",
    "ChangeCost",
    "CostSummary",
    "Divergence",
    "Live",
    "LiveResult",
    "ProviderFactory",
    "Recording",
    "ReplayReport",
    "SessionReplay",
    "Source",
    "cache_write_money",
    "emulated_provider_for",
    "load_tools",
    "read_config_file",
    "replay_recording",
    "replay_sessions",
    "resolve_sources",
]

#: A session to replay: a :class:`Recording`, a session id in the stores given, or an export file's path.
Source = Recording | str | Path


def resolve_sources(
    sources: Iterable[Source], *, stores: Stores | None = None, attachments_dir: Path | None = None
) -> list[Recording]:
    """Every source as a :class:`Recording`: ids read from ``stores``, export files checked as an import."""
    out: list[Recording] = []
    for source in sources:
        if isinstance(source, Recording):
            out.append(source)
        elif isinstance(source, Path):
            out.append(Recording.from_export(source, attachments_dir=attachments_dir))
        else:
            if stores is None:
                raise ConfigError(f"session {source!r} is named by id, but no stores were given to read it from")
            out.append(Recording.from_log(stores.log, source, stores.attachments))
    return out


async def replay_recording(
    recording: Recording,
    change: Change | None = None,
    *,
    check_determinism: bool = True,
    live: Live | None = None,
    on_request: Callable[[], None] | None = None,
) -> SessionReplay:
    """Replay one recorded session through the agent with ``change`` (see the package docstring).

    ``check_determinism``: on a divergence, run the same agent over the session a second time; if the two runs
    build different requests, the divergence's cause is ``nondeterministic`` and ``unstable`` names the fields
    that changed between them. ``live``: go on past the divergence as a fork child. ``on_request`` hears of each
    recorded request found identical (progress).
    """
    change = change if change is not None else Change()
    began = time.monotonic()
    script = script_of(recording.session_id, recording.events)
    parent = script.parent
    parent_id = parent.parent_id if parent is not None else None
    first = await run_once(recording, script, change, on_request)
    if first.found is None:
        return SessionReplay(
            recording.session_id,
            recording.origin,
            "identical",
            script.requests,
            first.compared,
            time.monotonic() - began,
            parent_id,
        )
    divergence = divergence_of(first.found, recording)
    if check_determinism:
        second = await run_once(recording, script, change)
        if second.found is None:  # the second run built the recorded requests: the first run's were unstable
            divergence = replace(divergence, cause="nondeterministic", unstable=divergence.fields)
        elif _same_call(first.found, second.found):
            unstable = unstable_fields(first.found, second.found)
            if unstable:
                divergence = replace(divergence, cause="nondeterministic", unstable=unstable)
        else:  # the runs parted from the recording at different calls: the earlier one names what moved
            earlier = divergence_of(second.found, recording) if second.compared < first.compared else divergence
            divergence = replace(divergence, cause="nondeterministic", unstable=earlier.fields)
    result: LiveResult | None = None
    if live is not None:
        run = await continue_live(recording, script, first.found, change, live)
        result = LiveResult(
            run.child,
            recording.session_id,
            run.seed_length,
            live.log is not None,
            run.turns,
            len(run.steps),
            run.usage,
            run.verified,
            run.checked,
        )
    return SessionReplay(
        recording.session_id,
        recording.origin,
        "diverged",
        script.requests,
        first.compared,
        time.monotonic() - began,
        parent_id,
        divergence,
        result,
    )


def _same_call(a: Found, b: Found) -> bool:
    """Whether two runs diverged at the same recorded call, the same way."""
    if a.call is None or b.call is None:
        return a.call is None and b.call is None and a.sent == b.sent
    return a.call.seq == b.call.seq and a.sent == b.sent and a.note == b.note


def replay_sessions(
    sources: Iterable[Source],
    change: Change | None = None,
    *,
    stores: Stores | None = None,
    attachments_dir: Path | None = None,
    check_determinism: bool = True,
    live: Live | None = None,
    skip_empty: bool = False,
    on_request: Callable[[], None] | None = None,
) -> ReplayReport:
    """Replay every source (ids in ``stores``, export files, :class:`Recording` objects) and report.

    ``skip_empty``: a session with nothing to replay (no ``request/dispatch``) is reported ``skipped`` instead
    of raising :class:`~foldline.errors.NothingToReplay`. For asyncio callers: :func:`replay_recording`.
    """
    change = change if change is not None else Change()
    recordings = resolve_sources(sources, stores=stores, attachments_dir=attachments_dir)
    if live is not None and live.child_id is not None and len(recordings) > 1:
        raise ConfigError("a live child's id names one session; replay one session, or let each child be named")

    async def main() -> list[SessionReplay]:
        out: list[SessionReplay] = []
        for recording in recordings:
            try:
                out.append(
                    await replay_recording(
                        recording, change, check_determinism=check_determinism, live=live, on_request=on_request
                    )
                )
            except NothingToReplay as exc:
                if not skip_empty:
                    raise
                reason = str(exc).split(": ", 1)[-1]
                out.append(SessionReplay(recording.session_id, recording.origin, "skipped", 0, 0, 0.0, skipped=reason))
        return out

    return ReplayReport(tuple(asyncio.run(main())), change)
