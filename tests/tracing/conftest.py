"""A real trace backend for the tracing tests: Arize Phoenix, installed and started by deploy/local/phoenix.sh.

``phoenix`` starts it once per test process (installing it on first use; ``make test`` starts that install in the
background first, see the Makefile's tools-prefetch) and leaves it running: the suite's other processes (pytest-xdist)
may still be sending to it; ``deploy/local/down.sh`` stops it with the other local servers (``make test`` does). Each
test sends its spans to a project of its own (the ``openinference.project.name`` resource attribute, set through the
standard ``OTEL_RESOURCE_ATTRIBUTES``) and reads them back through Phoenix's REST API.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "deploy" / "local" / "phoenix.sh"


def _script(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, check=False, cwd=REPO
    )


@dataclass(frozen=True)
class Phoenix:
    url: str  # the UI, REST API and OTLP/HTTP endpoint
    grpc: str  # the OTLP/gRPC endpoint

    def spans(self, project: str) -> list[dict[str, Any]]:
        """Every span of ``project`` (all pages); none for a project that has received nothing."""
        out: list[dict[str, Any]] = []
        cursor: str | None = None
        while True:
            query = f"?limit=1000{'&cursor=' + cursor if cursor else ''}"
            try:
                with urllib.request.urlopen(f"{self.url}/v1/projects/{project}/spans{query}", timeout=10) as reply:
                    page = json.loads(reply.read())
            except urllib.error.HTTPError as exc:
                if exc.code == 404:  # the project does not exist (yet)
                    return []
                raise
            out.extend(page["data"])
            cursor = page.get("next_cursor")
            if not cursor:
                return out

    def wait_for(
        self,
        project: str,
        count: int,
        timeout_s: float = 60.0,
        until: Callable[[list[dict[str, Any]]], bool] | None = None,
    ) -> list[dict[str, Any]]:
        """The project's spans once there are at least ``count`` (they arrive in batches) and ``until`` holds of
        them; what there is at the deadline otherwise (the caller's assertions then say what is missing)."""
        deadline = time.monotonic() + timeout_s
        while True:
            found = self.spans(project)
            if (len(found) >= count and (until is None or until(found))) or time.monotonic() > deadline:
                return found
            time.sleep(0.5)


@pytest.fixture(scope="session")
def phoenix() -> Phoenix:
    done = _script("start")  # under the script's lock: a second process finds it running
    if done.returncode != 0:
        pytest.fail(f"`deploy/local/phoenix.sh start` failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    env = dict(line.removeprefix("export ").split("=", 1) for line in _script("env", timeout=30).stdout.splitlines())
    return Phoenix(env["FOLDLINE_LOCAL_PHOENIX_URL"], env["FOLDLINE_LOCAL_PHOENIX_GRPC"])
