"""Running the tool calls of one answer: concurrently, each within its time limit, results in call order.

The calls of an answer run at the same time, at most ``concurrency`` at once (``AgentOptions.max_parallel_tools``),
except a tool that must run alone (``exclusive``): it waits for the calls before it and the calls after it wait
for it, so the answer runs as groups — a run of ordinary calls together, then the exclusive one by itself, and so
on — each group in the answer's order. Whatever order the calls finish in, their ``tool/result`` events are
built in the order of the calls in the answer, so the log and the next request are the same for any timing.

Each call runs within its tool's time limit (its own ``timeout_s``, else the agent's ``tool_timeout_s``); a call
that overruns is cancelled and answered with an error result naming the limit. When the turn is cancelled while
calls run, :meth:`ToolRun.run` cancels them, waits until they have stopped, and raises; :meth:`ToolRun.results`
then answers every call — a finished one with its result, every other one as interrupted — for the loop to log.

This module knows nothing of the loop: it takes the calls, the toolset and the settings, and gives back
``tool/result`` events and additional contexts. The loop appends them (loop/agent.py, ``_close_step``). What the
loop must decide first — which calls wait for approval, which a denial or a recovery answers without running them,
which run with an approver's changed arguments — it decides before: a :class:`ToolRun` runs exactly the calls it
is given. ``enter`` (optional) wraps each call's run in a context of the loop's (the call's ``CURRENT_CALL``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..core.content import TextBlock, ToolCallBlock
from ..core.events import ToolResult
from ..ports.attachments import AttachmentStore
from .tools import ToolOutput, Toolset, fit_result, resolve_images

__all__ = ["CANCELLED_RESULT", "ToolRun", "ToolRunSettings", "timeout_result"]

#: The text of the result of a call the turn's cancellation stopped.
CANCELLED_RESULT = (
    "interrupted: the turn was cancelled while this tool call ran; the call was stopped before it finished "
    "and its effects, if any, are unknown"
)


@dataclass(frozen=True, slots=True)
class ToolRunSettings:
    """What the agent allows its tool calls: how many run at once, the default time limit (``None``: none), the
    largest result text (bytes as escaped in the log; more is cut, kept whole in ``attachments``)."""

    concurrency: int = 8
    timeout_s: float | None = 300.0
    max_result_bytes: int = 1024 * 1024


def timeout_result(name: str, limit: float) -> ToolOutput:
    """The error result of a call that ran past its limit."""
    return ToolOutput(
        f"timeout: {name} did not finish within its limit of {limit:g} s and was cancelled; its effects, if any, "
        "are unknown. Try a smaller request, or another way.",
        is_error=True,
    )


@dataclass(frozen=True, slots=True)
class _Done:
    result: ToolResult
    context: str | None


class ToolRun:
    """The calls of one answer, run as the module docstring says. One instance per answer."""

    def __init__(
        self,
        calls: Sequence[ToolCallBlock],
        tools: Toolset,
        settings: ToolRunSettings,
        attachments: AttachmentStore | None,
        *,
        enter: Callable[[ToolCallBlock], contextlib.AbstractContextManager[None]] | None = None,
    ) -> None:
        self.calls = tuple(calls)
        self.enter = enter
        self.tools = tools
        self.settings = settings
        self.attachments = attachments
        self._done: list[_Done | None] = [None] * len(self.calls)
        #: seconds each call took, in call order (None: not finished)
        self.seconds: list[float | None] = [None] * len(self.calls)

    async def run(self) -> list[tuple[ToolResult, str | None]]:
        """Run every call; each call's ``tool/result`` and additional context, in call order."""
        limit = asyncio.Semaphore(max(1, self.settings.concurrency))
        for group in self._groups():
            if len(group) == 1:
                await self._one(group[0], limit)
                continue
            tasks = [asyncio.ensure_future(self._one(i, limit)) for i in group]
            try:
                await asyncio.gather(*tasks)
            except BaseException:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)  # stopped before the loop logs them
                raise
        return [(d.result, d.context) for d in self._done if d is not None]

    def results(self) -> list[ToolResult]:
        """Every call's ``tool/result`` in call order: its own where it finished, else an interrupted one."""
        out: list[ToolResult] = []
        for call, done in zip(self.calls, self._done, strict=True):
            if done is not None:
                out.append(done.result)
            else:
                out.append(ToolResult(call.id, call.name, (TextBlock(CANCELLED_RESULT),), is_error=True))
        return out

    def _groups(self) -> list[list[int]]:
        """Call indices in the groups they run in: runs of ordinary calls, each exclusive call alone."""
        groups: list[list[int]] = []
        run: list[int] = []
        for i, call in enumerate(self.calls):
            if self.tools.settings(call.name).exclusive:
                if run:
                    groups.append(run)
                    run = []
                groups.append([i])
            else:
                run.append(i)
        if run:
            groups.append(run)
        return groups

    async def _one(self, i: int, limit: asyncio.Semaphore) -> None:
        call = self.calls[i]
        timeout = self.tools.settings(call.name).timeout_s or self.settings.timeout_s
        async with limit:
            began = time.monotonic()
            try:
                with self.enter(call) if self.enter is not None else contextlib.nullcontext():
                    async with asyncio.timeout(timeout):
                        output = await self.tools.call(call.name, call.arguments)
            except TimeoutError:
                assert timeout is not None
                output = timeout_result(call.name, timeout)
            self.seconds[i] = time.monotonic() - began
        parts = resolve_images(output.parts(), self.attachments)
        parts = fit_result(parts, self.settings.max_result_bytes, self.attachments)
        result = ToolResult(call.id, call.name, parts, output.is_error, child_session_id=output.child_session)
        self._done[i] = _Done(result, output.additional_context)
