"""One of two loops resuming one session at once: ``python -m tests.chaos.resume_race SESSION STEPS GO_FILE``.

The process opens SESSION as a new loop instance (it becomes the session's writer, fencing any older
instance), prints ``opened``, waits until GO_FILE exists, then runs STEPS steps of the demo's scripted agent
through the configured ``foldline dispatcher`` processes, as ``foldline fleet`` does. It prints
``completed N`` and exits 0, or prints its typed error on one line (``FencedError: ...``) and exits 3 for a
:class:`~foldline.errors.FencedError`, 1 for any other error.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from foldline.config import Config, open_stores
from foldline.core.content import TextBlock
from foldline.core.projection import fold_request_header
from foldline.demo import PROMPTS, demo_toolset
from foldline.dispatcher.factory import step_client
from foldline.errors import FencedError, FoldlineError
from foldline.loop import Agent, AgentOptions
from foldline.providers.emulated import emulated_provider_factory
from foldline.providers.retry import RetryingSender


async def race(session: str, steps: int, go: Path) -> int:
    config = Config.from_env()
    stores = open_stores(config, writer=True)
    dispatcher = step_client(config)
    try:
        header = fold_request_header(stores.log.read(session))
        assert header is not None, f"session {session!r} has no request/header to resume from"
        options = AgentOptions(
            config=header.config,
            system=header.system,
            tools=demo_toolset(),
            archive_requests=True,
            dispatcher=dispatcher,
            sender=RetryingSender(settings=config.transport),
            outage_s=config.outage_s,
        )
        provider = emulated_provider_factory()()
        agent = await Agent.open(session, stores.log, provider, options, attachments=stores.attachments)
        print("opened", flush=True)
        while not go.exists():
            await asyncio.sleep(0.02)
        done = 0

        def count(_record: object) -> None:
            nonlocal done
            done += 1

        agent.step_listeners.append(count)
        try:
            turn = 0
            while done < steps:
                agent.options.max_steps_per_turn = steps - done
                await agent.run_turn([TextBlock(f"[{session}] {PROMPTS[turn % len(PROMPTS)]}")])
                turn += 1
        except FoldlineError as exc:
            print(f"{type(exc).__name__}: {exc}".splitlines()[0], flush=True)
            return 3 if isinstance(exc, FencedError) else 1
        finally:
            await provider.aclose()
        print(f"completed {done}", flush=True)
        return 0
    finally:
        await dispatcher.aclose()
        stores.close()


if __name__ == "__main__":
    sys.exit(asyncio.run(race(sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]))))
