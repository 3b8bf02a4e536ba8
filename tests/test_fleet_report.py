"""A fleet's report: the added latency of each session's first step apart from its later ones, in the JSON and
in the printed table."""

from __future__ import annotations

import pytest

from foldline.cli import fleet_commands
from foldline.core.content import Usage
from foldline.fleet import FleetResult, SessionOutcome
from foldline.loop.options import StepRecord


def _step(i: int, total_s: float, send_s: float) -> StepRecord:
    return StepRecord(0, i, 2 * i + 3, "sha256:" + "0" * 64, Usage(), None, {"total": total_s, "send": send_s})


def _result() -> FleetResult:
    # two sessions of three steps: each first step added 100 ms (its session's start), the later ones 10 ms
    sessions = [
        SessionOutcome(f"s-{n}", steps=[_step(0, 2.1, 2.0), _step(1, 2.01, 2.0), _step(2, 2.01, 2.0)]) for n in range(2)
    ]
    return FleetResult(sessions, 3, open_s=0.0, run_s=6.5, verify_s=0.1, ramp_s=2.0)


def test_the_added_latency_is_split_by_the_steps_place_in_its_session() -> None:
    places = _result().to_json()["overhead_by_place_ms"]
    assert isinstance(places, dict)
    first, later = places["first"], places["later"]
    assert first == {"steps": 2, "p50": pytest.approx(100.0), "p99": pytest.approx(100.0), "mean": pytest.approx(100.0)}
    assert later == {"steps": 4, "p50": pytest.approx(10.0), "p99": pytest.approx(10.0), "mean": pytest.approx(10.0)}


def test_the_printed_table_has_a_row_for_first_steps_and_one_for_later_steps(
    capsys: pytest.CaptureFixture[str],
) -> None:
    fleet_commands.print_fleet(_result())
    out = capsys.readouterr().out
    first = next(line for line in out.splitlines() if "overhead, first steps" in line)
    later = next(line for line in out.splitlines() if "overhead, later steps" in line)
    assert "100.0 ms" in first
    assert "10.0 ms" in later
