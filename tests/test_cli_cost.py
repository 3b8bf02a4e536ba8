"""`foldline cost` over the embedded log, and the cost of each step and drop in `show` and `drops`."""

from __future__ import annotations

import json
import shutil
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from foldline.adapters.sqlite_log import SqliteEventLog
from foldline.cli.main import app
from foldline.core.content import TextBlock, Usage
from foldline.core.drops import DROP_CAUSES
from foldline.core.events import AssistantMessage, Envelope, RequestDispatch, RequestHeader, UserMessage
from foldline.core.header import CallConfig, EpochHeader
from tests.golden_logs.layout import jsonl_path

runner = CliRunner()


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A demo's data directory: four sessions (a compaction, an image, a fork) and the two reasoning sessions."""
    data = tmp_path_factory.mktemp("cost-demo")
    res = runner.invoke(app, ["demo", "--sessions", "4", "--steps", "24", "--data-dir", str(data), "--json"])
    assert res.exit_code == 0, res.output
    return data


def _cost(*args: str) -> dict[str, Any]:
    res = runner.invoke(app, ["cost", "--json", *args])
    assert res.exit_code == 0, res.output
    out: dict[str, Any] = json.loads(res.stdout, parse_float=Decimal)
    return out


def test_every_session_of_the_demo_has_spend_saved_and_drop_cost_by_cause_adding_up_to_the_fleet(
    demo_dir: Path,
) -> None:
    out = _cost("--data-dir", str(demo_dir))
    groups = out["groups"]
    assert isinstance(groups, list)
    fleet = out["fleet"]
    assert isinstance(fleet, dict)
    ids = [g["session"] for g in groups]
    assert ids == [
        "demo-000",
        "demo-001",
        "demo-002",
        "demo-003",
        "demo-approval",
        "demo-responses",
        "demo-structured",
        "demo-think",
    ]
    for g in groups:
        assert g["spend"] > 0, g
        assert g["saved"] > 0, g  # the demo keeps its prefix cached
        assert g["noCache"] == g["spend"] + g["saved"]
        assert set(DROP_CAUSES) <= set(g["dropCostByCause"])
        assert sum(g["dropCostByCause"].values()) == g["dropCost"]
        assert g["unpriced"] == {}
    for figure in ("spend", "noCache", "saved", "dropCost", "steps", "drops"):
        assert sum(g[figure] for g in groups) == fleet[figure], figure
    for cause in fleet["dropCostByCause"]:
        assert sum(g["dropCostByCause"].get(cause, 0) for g in groups) == fleet["dropCostByCause"][cause]
    # demo-000 compacts under its token budget
    assert groups[0]["dropCostByCause"]["compaction"] > 0
    assert out["currency"] == "USD"
    assert out["prices"]["checked"]

    by_cause = _cost("--data-dir", str(demo_dir), "--by", "cause")
    assert sum(g["dropCost"] for g in by_cause["groups"]) == fleet["dropCost"]
    by_model = _cost("--data-dir", str(demo_dir), "--by", "model")
    assert {g["model"] for g in by_model["groups"]} == {
        "anthropic/claude-emulated",
        "anthropic/claude-thinking-emulated",
        "openai/gpt-reasoning-emulated",
    }
    assert sum(g["spend"] for g in by_model["groups"]) == fleet["spend"]
    by_day = _cost("--data-dir", str(demo_dir), "--by", "day")
    assert sum(g["spend"] for g in by_day["groups"]) == fleet["spend"]


def test_the_figures_of_a_golden_log_are_the_hand_computed_ones(tmp_path: Path) -> None:
    """golden-usage: Anthropic (claude-emulated, priced as Claude Sonnet 4.5) with every write a 1-hour write, then
    OpenAI Chat and Responses on gpt-reasoning-emulated (priced as GPT-5)."""
    res = runner.invoke(app, ["import", str(jsonl_path("golden-usage")), "--data-dir", str(tmp_path)])
    assert res.exit_code == 0, res.output
    out = _cost("golden-usage", "--data-dir", str(tmp_path))
    (g,) = out["groups"]
    # Anthropic: write 1210 (1h) out 28 | read 1210 write 93 (1h) out 13 | read 1303 write 37 (1h) out 15
    anthropic = (
        (1210 * 6 + 28 * 15) + (1210 * Decimal("0.30") + 93 * 6 + 13 * 15) + (1303 * Decimal("0.30") + 37 * 6 + 15 * 15)
    )
    # Chat: input 104 write 1280 (no surcharge) out 38 | input 62 read 1280 write 128 out 37;
    # Responses: input 103 write 1408 out 32 (reasoning at the output price)
    openai = (
        (104 + 1280) * Decimal("1.25")
        + 38 * 10
        + (62 + 128) * Decimal("1.25")
        + 1280 * Decimal("0.125")
        + 37 * 10
        + (103 + 1408) * Decimal("1.25")
        + 32 * 10
    )
    assert g["spend"] == (anthropic + openai) / 1_000_000
    assert g["tokens"]["cache-write-1h"] == 1210 + 93 + 37
    assert g["tokens"]["reasoning"] == 19 + 22 + 18


def test_a_model_without_a_price_is_unknown_and_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with SqliteEventLog(tmp_path) as log:
        log.append("private", 0, _session("claude-private", [Usage(100, 10, 0, 1200), Usage(20, 10, 1200, 30)]))
    out = _cost("--data-dir", str(tmp_path))
    (g,) = out["groups"]
    assert (g["spend"], g["saved"], g["dropCost"]) == (None, None, None)
    assert g["unpriced"] == {"anthropic/claude-private": 2}
    assert out["fleet"]["spend"] is None
    res = runner.invoke(app, ["cost", "--data-dir", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert "unknown: no price for anthropic/claude-private (2 step(s))" in res.stdout
    res = runner.invoke(app, ["show", "private", "--data-dir", str(tmp_path)])
    assert "cost unknown (no price for anthropic/claude-private)" in res.stdout
    # a user table prices it (and keeps every shipped row)
    prices = tmp_path / "prices.csv"
    prices.write_text(
        "provider,model,token_class,price_per_mtok,currency,effective,source\n"
        "anthropic,claude-private,input,2,USD,2025-01-01,https://example.com/contract\n"
        "anthropic,claude-private,output,10,USD,2025-01-01,https://example.com/contract\n"
    )
    monkeypatch.setenv("FOLDLINE_PRICES", str(prices))
    (g,) = _cost("--data-dir", str(tmp_path))["groups"]
    # no cache prices given: reads and writes at the input price; 1300*2 + 10*10 + 1250*2 + 10*10
    assert g["spend"] == Decimal("0.0053")
    assert g["saved"] == 0
    monkeypatch.setenv("FOLDLINE_PRICES", str(tmp_path / "missing.csv"))
    res = runner.invoke(app, ["cost", "--data-dir", str(tmp_path)])
    assert res.exit_code == 2
    assert "FOLDLINE_PRICES" in res.output


def _session(model: str, usages: list[Usage]) -> list[Envelope]:
    config = CallConfig("anthropic", model, max_tokens=100)
    t = 1_767_225_600_000
    events: list[Envelope] = [Envelope(0, t, RequestHeader(EpochHeader(config), "initial"))]
    for i, usage in enumerate(usages):
        n = len(events)
        events += [
            Envelope(n, t, UserMessage(f"u{n}", (TextBlock("q"),))),
            Envelope(n + 1, t, RequestDispatch(i, 0, "anthropic-messages", 1, "sha256:" + "0" * 64, 1)),
            Envelope(n + 2, t, AssistantMessage(f"a{n + 2}", (TextBlock("a"),), usage, "end_turn")),
        ]
    return events


def test_show_and_drops_give_each_step_and_drop_its_cost(demo_dir: Path, tmp_path: Path) -> None:
    res = runner.invoke(app, ["show", "demo-000", "--data-dir", str(demo_dir)])
    assert res.exit_code == 0, res.output
    answers = [ln for ln in res.stdout.splitlines() if "assistant/message" in ln]
    assert answers
    assert all("[cost $" in ln and " saved " in ln for ln in answers)
    assert "(compaction)" in res.stdout
    res = runner.invoke(app, ["drops", "demo-000", "--data-dir", str(demo_dir), "--json"])
    assert res.exit_code == 0, res.output
    drops = json.loads(res.stdout, parse_float=Decimal)["drops"]
    assert drops
    assert all(d["cost"] > 0 and d["currency"] == "USD" for d in drops)
    per_cause = _cost("demo-000", "--data-dir", str(demo_dir))["groups"][0]["dropCostByCause"]
    for cause in {d["cost_cause"] for d in drops}:
        assert sum(d["cost"] for d in drops if d["cost_cause"] == cause) == per_cause[cause]
    res = runner.invoke(app, ["drops", "demo-000", "--data-dir", str(demo_dir)])
    assert "$0." in res.stdout


def test_a_header_change_is_costed_by_the_fields_it_changed(tmp_path: Path) -> None:
    shutil.copy(jsonl_path("golden-anthropic"), tmp_path / "g.jsonl")
    res = runner.invoke(app, ["import", str(tmp_path / "g.jsonl"), "--data-dir", str(tmp_path)])
    assert res.exit_code == 0, res.output
    out = _cost("golden-anthropic", "--data-dir", str(tmp_path), "--by", "cause")
    keys = {g["cause"] for g in out["groups"]}
    assert any(k.startswith("header-change:") for k in keys), keys
    assert "header-change:system" in keys or any("system" in k for k in keys)


def test_bad_options_are_one_line_errors(demo_dir: Path) -> None:
    res = runner.invoke(app, ["cost", "--by", "week", "--data-dir", str(demo_dir)])
    assert res.exit_code == 2
    res = runner.invoke(app, ["cost", "nobody", "--data-dir", str(demo_dir)])
    assert res.exit_code == 2
    assert "SessionNotFound" in res.output
