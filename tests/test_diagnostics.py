"""Where a process's coroutines wait: tasks grouped by stack, most common first, printed on SIGUSR1."""

from __future__ import annotations

import asyncio
import io
import os
import signal

import pytest

from foldline.diagnostics import dump_tasks_on_signal, task_stacks


async def _waits_for_the_gate(gate: asyncio.Event) -> None:
    await gate.wait()


async def _sleeps_alone() -> None:
    await _nested_sleep()


async def _nested_sleep() -> None:
    await asyncio.sleep(3600)


def test_tasks_are_grouped_by_where_they_wait_most_common_first() -> None:
    async def body() -> str:
        gate = asyncio.Event()
        many = [asyncio.create_task(_waits_for_the_gate(gate), name=f"gated-{i}") for i in range(3)]
        lone = asyncio.create_task(_sleeps_alone(), name="lone")
        await asyncio.sleep(0)  # every task reaches its wait
        try:
            return task_stacks()
        finally:
            gate.set()
            lone.cancel()
            await asyncio.gather(*many, lone, return_exceptions=True)

    text = asyncio.run(body())
    # four waiting tasks and this test's own body: three distinct stacks
    assert text.splitlines()[0] == "5 asyncio task(s) in 3 distinct stack(s), most common first:"
    gated, lone = text.index("3 task(s), e.g. 'gated-"), text.index("1 task(s), e.g. 'lone'")
    assert gated < lone  # the crowd first
    assert "_waits_for_the_gate (" in text[gated:lone]
    assert "_sleeps_alone (" in text[lone:]
    # the whole chain of coroutines, outermost first, down to what the innermost awaits
    chain = text[lone:]
    assert chain.index("_sleeps_alone (") < chain.index("_nested_sleep (") < chain.index("sleep (")
    assert "awaiting a Future" in chain
    assert __file__ in text  # each frame names its file and line


@pytest.mark.skipif(not hasattr(signal, "SIGUSR1"), reason="no SIGUSR1 on this platform")
def test_sigusr1_prints_the_tasks_and_the_process_goes_on() -> None:
    out = io.StringIO()

    async def body() -> None:
        loop = asyncio.get_running_loop()
        assert dump_tasks_on_signal(loop, out)
        waiting = asyncio.create_task(_sleeps_alone(), name="waiting")
        await asyncio.sleep(0)
        try:
            os.kill(os.getpid(), signal.SIGUSR1)
            for _ in range(200):  # the handler runs on the loop, soon after the signal
                if out.getvalue():
                    break
                await asyncio.sleep(0.01)
        finally:
            waiting.cancel()
            loop.remove_signal_handler(signal.SIGUSR1)

    asyncio.run(body())
    assert "asyncio task(s)" in out.getvalue()
    assert "_sleeps_alone (" in out.getvalue()
