"""Money from logged usage (foldline.core.usage, foldline.core.cost, foldline.config.prices), checked against
figures computed by hand for each provider's rules."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest

from foldline.config.prices import builtin_price_table, load_price_table, read_price_rows
from foldline.core.content import TextBlock, Usage
from foldline.core.cost import (
    PriceRow,
    PriceTable,
    PriceTableError,
    cost_groups,
    day_of,
    drop_cost,
    figures_of,
    session_cost,
    step_cost,
)
from foldline.core.drops import classify_session
from foldline.core.events import AssistantMessage, Envelope, RequestDispatch, RequestHeader, UserMessage
from foldline.core.header import CallConfig, EpochHeader
from foldline.core.usage import normalize_usage
from foldline.errors import ConfigError

JAN_2026 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
SRC = "https://example.com/pricing"


def rows(provider: str, model: str, effective: str = "2025-01-01", over: int = 0, **prices: str) -> list[PriceRow]:
    return [
        PriceRow(provider, model, cls.replace("_", "-"), Decimal(p), "USD", effective, SRC, over)
        for cls, p in prices.items()
    ]


SONNET = rows("anthropic", "claude-sonnet-*", input="3", cache_write_5m="3.75", cache_write_1h="6", cache_read="0.30",
              output="15")  # fmt: skip
GPT5 = rows("openai", "gpt-5", input="1.25", cache_read="0.125", output="10", reasoning="10")
DEEPSEEK = [
    *rows("deepseek", "deepseek-chat", "2025-02-08", input="0.27", cache_read="0.07", output="1.10"),
    *rows("deepseek", "deepseek-chat", "2025-09-29", input="0.28", cache_read="0.028", output="0.42"),
]
GEMINI = [
    *rows("gemini", "gemini-2.5-pro*", input="1.25", cache_read="0.125", output="10"),
    *rows("gemini", "gemini-2.5-pro*", over=200_000, input="2.50", cache_read="0.25", output="15"),
]
TABLE = PriceTable([*SONNET, *GPT5, *DEEPSEEK, *GEMINI], checked="2026-01-01")


def prices(provider: str, model: str, time_ms: int = JAN_2026, prompt: int = 0):  # type: ignore[no-untyped-def]
    found = TABLE.prices_for(provider, model, time_ms, prompt)
    assert found is not None
    return found


# ---------------------------------------------------------------------------- normalization


def test_usage_is_normalized_into_disjoint_classes_with_the_1h_writes_apart() -> None:
    u = normalize_usage(Usage(input=100, output=50, cache_read=10_000, cache_write=2_000, cache_write_1h=500))
    assert (u.input, u.cache_read, u.cache_write_5m, u.cache_write_1h, u.output, u.reasoning) == (
        100, 10_000, 1_500, 500, 50, 0,
    )  # fmt: skip
    assert u.prompt == 12_100  # OpenTelemetry's input_tokens: cache tokens included
    # no breakdown logged: the request's logged cacheTtl says which TTL the writes had
    assert normalize_usage(Usage(1, 2, 3, 4)).cache_write_5m == 4
    assert normalize_usage(Usage(1, 2, 3, 4), "1h").cache_write_1h == 4
    # reasoning is a part of the output
    r = normalize_usage(Usage(952, 900, 2048, 0, reasoning_tokens=800))
    assert (r.output, r.reasoning, r.completion) == (100, 800, 900)


# ---------------------------------------------------------------------------- each provider's rules, by hand


def test_anthropic_5m_and_1h_writes_are_priced_apart() -> None:
    u = normalize_usage(Usage(input=100, output=50, cache_read=10_000, cache_write=2_000, cache_write_1h=500))
    cost = step_cost(u, prices("anthropic", "claude-sonnet-4-5"))
    # 100*3 + 10000*0.30 + 1500*3.75 + 500*6 + 50*15 = 300 + 3000 + 5625 + 3000 + 750 = 12675 per million
    assert cost.spend == Decimal("0.012675")
    # every prompt token at 3, the output as spent: 12100*3 + 750 = 37050
    assert cost.no_cache == Decimal("0.03705")
    assert cost.saved == Decimal("0.024375")
    assert cost.by_class["cache-write-1h"] == Decimal("0.003")
    # the same writes without a breakdown, sent with cacheTtl 1h: all 2000 at 6 → 300 + 3000 + 12000 + 750
    one_hour = normalize_usage(Usage(100, 50, 10_000, 2_000), "1h")
    assert step_cost(one_hour, prices("anthropic", "claude-sonnet-4")).spend == Decimal("0.01605")


def test_openai_cached_input_is_discounted_writes_cost_the_input_price_and_reasoning_the_output_price() -> None:
    # Chat Completions: prompt 3000 of which 2048 cached, completion 900 of which 800 reasoning
    u = normalize_usage(Usage(952, 900, 2048, 0, reasoning_tokens=800))
    cost = step_cost(u, prices("openai", "gpt-5"))
    # 952*1.25 + 2048*0.125 + 100*10 + 800*10 = 1190 + 256 + 1000 + 8000 = 10446
    assert cost.spend == Decimal("0.010446")
    assert cost.no_cache == Decimal("0.01275")  # 3000*1.25 + 900*10
    # 896 of the uncached tokens written to the cache: OpenAI charges them as input, so the spend is the same
    written = normalize_usage(Usage(56, 900, 2048, 896, reasoning_tokens=800))
    assert step_cost(written, prices("openai", "gpt-5")).spend == cost.spend


def test_deepseek_hits_and_misses_at_the_price_in_force_on_the_day() -> None:
    u = normalize_usage(Usage(120, 30, 1280, 0, reasoning_tokens=12))
    # V3.2 prices (from 2025-09-29): 120*0.28 + 1280*0.028 + 30*0.42 = 33.6 + 35.84 + 12.6 = 82.04
    assert step_cost(u, prices("deepseek", "deepseek-chat")).spend == Decimal("0.00008204")
    # a request of 2025-03-01 gets the earlier prices: 120*0.27 + 1280*0.07 + 30*1.10 = 32.4 + 89.6 + 33 = 155
    march = 1_740_787_200_000
    assert day_of(march) == "2025-03-01"
    assert step_cost(u, prices("deepseek", "deepseek-chat", march)).spend == Decimal("0.000155")
    # before any row took effect there is no price
    assert TABLE.prices_for("deepseek", "deepseek-chat", 1_700_000_000_000) is None


def test_gemini_cached_input_and_the_long_prompt_tier() -> None:
    short = normalize_usage(Usage(50_000, 1_000, 100_000, 0))
    # prompt 150,000 ≤ 200,000: 50000*1.25 + 100000*0.125 + 1000*10 = 62500 + 12500 + 10000
    assert step_cost(short, prices("gemini", "gemini-2.5-pro", prompt=short.prompt)).spend == Decimal("0.085")
    long = normalize_usage(Usage(100_000, 1_000, 200_000, 0))
    # prompt 300,000 > 200,000: every token at the higher tier: 250000 + 50000 + 15000
    assert step_cost(long, prices("gemini", "gemini-2.5-pro", prompt=long.prompt)).spend == Decimal("0.315")


def test_a_looked_up_price_is_remembered_per_model_day_and_tier_and_is_the_one_a_fresh_table_finds() -> None:
    tiered = [
        *rows("p", "m*", input="1", output="2"),
        *rows("p", "m*", over=100, input="5", output="6"),
        *rows("p", "m*", "2026-01-02", input="3", output="4"),
    ]
    table = PriceTable(tiered)
    day2 = JAN_2026 + 86_400_000
    asks = [(JAN_2026, 0), (JAN_2026, 100), (JAN_2026, 101), (JAN_2026, 5), (day2, 50), (day2, 1_000), (JAN_2026, 100)]
    for _ in range(2):  # the second round answers from what the first remembered
        for when, prompt in asks:
            seen = table.prices_for("p", "m1", when, prompt)
            fresh = PriceTable(tiered).prices_for("p", "m1", when, prompt)
            assert seen is not None
            assert fresh is not None
            assert dict(seen.prices) == dict(fresh.prices), (when, prompt)

    def rate(when: int, prompt: int) -> Decimal:
        found = table.prices_for("p", "m1", when, prompt)
        assert found is not None
        return found.rate("input")

    assert rate(JAN_2026, 100) == Decimal(1)  # at the threshold: the lower tier
    assert rate(JAN_2026, 101) == Decimal(5)  # above it: the higher
    assert rate(day2, 1_000) == Decimal(3)  # a later effective date wins over an earlier tier
    assert table.prices_for("p", "other", JAN_2026, 0) is None


def test_a_drop_costs_the_lost_tokens_at_their_class_instead_of_the_read_price() -> None:
    u = normalize_usage(Usage(input=100, output=50, cache_read=10_000, cache_write=2_000, cache_write_1h=500))
    sonnet = prices("anthropic", "claude-sonnet-4-5")
    # 1800 lost: the 500 1-hour writes first (6 - 0.30), then 1300 of the 5-minute writes (3.75 - 0.30)
    assert drop_cost(1_800, u, sonnet) == Decimal("0.007335")  # 2850 + 4485
    # more lost than the request did not read (a compaction shrank the prompt): only the 2100 it sent count
    assert drop_cost(50_000, u, sonnet) == Decimal("0.008295")  # 2850 + 1500*3.45 + 100*2.70
    assert drop_cost(0, u, sonnet) == 0


# ---------------------------------------------------------------------------- the lookup


def test_the_most_specific_pattern_wins_and_a_model_without_a_price_has_none() -> None:
    table = PriceTable([
        *rows("openai", "gpt-*", input="9", output="9"),
        *rows("openai", "gpt-5*", input="2", output="20"),
        *rows("openai", "gpt-5", input="1", output="10"),
    ])  # fmt: skip
    assert table.pattern_for("openai", "gpt-5") == "gpt-5"
    assert table.pattern_for("openai", "gpt-5-mini") == "gpt-5*"
    assert table.pattern_for("openai", "gpt-4o") == "gpt-*"
    assert table.prices_for("openai", "o3", JAN_2026) is None
    assert table.prices_for("anthropic", "gpt-5", JAN_2026) is None  # another provider's price is not this one's


def test_a_row_needs_input_and_output_and_missing_classes_fall_back() -> None:
    only_input = PriceTable(rows("p", "m", input="1"))
    assert only_input.prices_for("p", "m", JAN_2026) is None
    table = PriceTable(rows("p", "m", input="1", output="2", cache_write_5m="1.5"))
    found = table.prices_for("p", "m", JAN_2026)
    assert found is not None
    assert dict(found.prices) == {
        "input": 1, "output": 2, "cache-write-5m": Decimal("1.5"), "cache-read": 1, "cache-write-1h": Decimal("1.5"),
        "reasoning": 2,
    }  # fmt: skip


def test_bad_rows_and_mixed_currencies_are_refused() -> None:
    with pytest.raises(PriceTableError, match="token class 'cached'"):
        PriceRow("p", "m", "cached", Decimal(1), "USD", "2025-01-01", SRC)
    with pytest.raises(PriceTableError, match="not a calendar date"):
        PriceRow("p", "m", "input", Decimal(1), "USD", "2025-02-30", SRC)
    with pytest.raises(PriceTableError, match="price -1"):
        PriceRow("p", "m", "input", Decimal(-1), "USD", "2025-01-01", SRC)
    eur = PriceRow("p", "m", "output", Decimal(1), "EUR", "2025-01-01", SRC)
    with pytest.raises(PriceTableError, match="mixes currencies EUR, USD"):
        PriceTable([*rows("p", "m", input="1"), eur])


# ---------------------------------------------------------------------------- the files


def test_the_shipped_table_is_dated_sourced_and_prices_the_models_it_names() -> None:
    table = builtin_price_table()
    assert table.checked is not None
    assert day_of(0) == "1970-01-01"
    assert table.currency == "USD"
    assert all(r.source.startswith("https://") for r in table.rows)
    now = JAN_2026
    sonnet = table.prices_for("anthropic", "claude-sonnet-4-5-20250929", now)
    assert sonnet is not None
    assert [sonnet.rate(c) for c in ("input", "cache-write-5m", "cache-write-1h", "cache-read", "output")] == [
        Decimal("3"), Decimal("3.75"), Decimal("6"), Decimal("0.30"), Decimal("15"),
    ]  # fmt: skip
    # Anthropic's multipliers: 5-minute writes 1.25x, 1-hour writes 2x the input price (Claude Haiku 3's
    # published 5-minute write price is 1.2x)
    for row in table.rows:
        if row.provider == "anthropic" and row.token_class == "input" and row.model != "claude-3-haiku*":
            p = table.prices_for("anthropic", row.model.replace("*", "x"), 1_800_000_000_000)
            assert p is not None
            assert p.rate("cache-write-5m") == p.rate("input") * Decimal("1.25")
            assert p.rate("cache-write-1h") == p.rate("input") * 2
    gpt5 = table.prices_for("openai", "gpt-5", now)
    assert gpt5 is not None
    assert gpt5.rate("cache-read") == Decimal("0.125")
    deepseek = table.prices_for("deepseek", "deepseek-reasoner", now)
    assert deepseek is not None
    assert (deepseek.rate("input"), deepseek.rate("cache-read")) == (
        Decimal("0.28"),
        Decimal("0.028"),
    )
    gemini = table.prices_for("gemini", "gemini-2.5-flash", now)
    assert gemini is not None
    assert gemini.rate("cache-read") == Decimal("0.03")
    assert table.prices_for("anthropic", "claude-emulated", now) is not None  # the demo's models are priced
    assert table.prices_for("openai", "gpt-reasoning-emulated", now) is not None


def test_a_user_table_overrides_and_extends_the_shipped_one(tmp_path: Path) -> None:
    user = tmp_path / "prices.csv"
    user.write_text(
        "provider,model,token_class,price_per_mtok,currency,effective,source\n"
        "# ours: a negotiated rate and a private model\n"
        f"openai,gpt-5,input,1.00,USD,2025-08-07,{SRC}\n"
        f"vllm,llama-*,input,0.10,USD,2025-01-01,{SRC}\n"
        f"vllm,llama-*,output,0.20,USD,2025-01-01,{SRC}\n"
    )
    table = load_price_table(user)
    gpt5 = table.prices_for("openai", "gpt-5", JAN_2026)
    assert gpt5 is not None
    assert gpt5.rate("input") == Decimal("1.00")
    assert gpt5.rate("output") == 10
    assert table.prices_for("vllm", "llama-3-70b", JAN_2026) is not None
    assert len(table.rows) == len(builtin_price_table().rows) + 2


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("provider,model\n", "prices.csv:1: the price table's header has no column"),
        (
            "provider,model,token_class,price_per_mtok,currency,effective,source\np,m,input,x,USD,2025-01-01,s\n",
            "prices.csv:2: not a price row",
        ),
        (
            "provider,model,token_class,price_per_mtok,currency,effective,source\np,m,input,1,USD,2025-13-01,s\n",
            "prices.csv:2: not a price row .effective date '2025-13-01'",
        ),
        (
            "provider,model,token_class,price_per_mtok,currency,effective,source\np,m,input,1,USD\n",
            "prices.csv:2: 5 cells for the header's 7 columns",
        ),
    ],
)
def test_a_bad_user_table_is_a_config_error_naming_the_line(tmp_path: Path, text: str, match: str) -> None:
    user = tmp_path / "prices.csv"
    user.write_text(text)
    with pytest.raises(ConfigError, match=match):
        load_price_table(user)
    with pytest.raises(ConfigError, match="cannot be read"):
        load_price_table(tmp_path / "missing.csv")
    header = "provider,model,token_class,price_per_mtok,currency,effective,source\n"
    assert read_price_rows("# checked: 2026-01-01\n" + header, "x") == ([], "2026-01-01")


# ---------------------------------------------------------------------------- sessions and the fleet


def _session(sid: str, usages: list[Usage], model: str = "claude-sonnet-4-5", gap_ms: int = 1000) -> list[Envelope]:
    config = CallConfig("anthropic", model, max_tokens=100)
    events: list[Envelope] = [Envelope(0, JAN_2026, RequestHeader(EpochHeader(config), "initial"))]
    for i, usage in enumerate(usages):
        t = JAN_2026 + i * gap_ms
        n = len(events)
        events += [
            Envelope(n, t, UserMessage(f"u{n}", (TextBlock("q"),))),
            Envelope(n + 1, t, RequestDispatch(i, 0, "anthropic-messages", 1, "sha256:" + "0" * 64, 1)),
            Envelope(n + 2, t, AssistantMessage(f"a{n + 2}", (TextBlock("a"),), usage, "end_turn")),
        ]
    return events


def test_sessions_add_up_to_the_fleet_and_drops_are_costed_by_cause() -> None:
    a = _session("a", [Usage(100, 10, 0, 2000), Usage(50, 10, 2000, 100), Usage(2150, 10, 0, 0)])  # unexplained
    b = _session("b", [Usage(10, 5, 0, 1500), Usage(1520, 5, 0, 0)], gap_ms=400_000)  # past the 5-minute TTL
    verdicts = [*classify_session("a", a), *classify_session("b", b)]
    groups, fleet = cost_groups(verdicts, TABLE, "session")
    assert [g.key for g in groups] == ["a", "b"]
    total = figures_of(groups)
    assert (total.spend, total.no_cache, total.drop_cost, total.steps) == (
        fleet.spend, fleet.no_cache, fleet.drop_cost, fleet.steps,
    )  # fmt: skip
    assert fleet.known
    assert fleet.steps == 5
    a_fig = groups[0].figures
    # a's third step lost the 2100 tokens it should have read; they were uncached input: 2100 * (3 - 0.30)
    assert a_fig.by_cause["unexplained"] == Decimal("0.00567")
    # the cold first request lost its whole prompt: 2000 written * (3.75 - 0.30) + 100 uncached * (3 - 0.30)
    assert a_fig.by_cause["first-request"] == Decimal("0.00717")
    # b's second step: 400 s after the first, past the 5-minute TTL: the 1500 written tokens lost
    b_fig = groups[1].figures
    assert b_fig.drops_by_cause == {"first-request": 1, "cache-ttl": 1}
    assert b_fig.by_cause["cache-ttl"] == Decimal("0.00405")  # 1500 * (3 - 0.30)
    by_cause, _ = cost_groups(verdicts, TABLE, "cause")
    assert sum((g.figures.drop_cost for g in by_cause), Decimal(0)) == fleet.drop_cost
    by_model, _ = cost_groups(verdicts, TABLE, "model")
    assert [g.key for g in by_model] == ["anthropic/claude-sonnet-4-5"]
    by_day, _ = cost_groups(verdicts, TABLE, "day")
    assert [g.key for g in by_day] == ["2026-01-01"]


def test_an_unpriced_model_makes_every_sum_that_holds_it_unknown_and_names_it() -> None:
    known = _session("a", [Usage(100, 10, 0, 0)])
    unknown = _session("b", [Usage(100, 10, 0, 0)], model="claude-private")
    verdicts = [*classify_session("a", known), *classify_session("b", unknown)]
    groups, fleet = cost_groups(verdicts, TABLE)
    assert groups[0].figures.known
    assert not groups[1].figures.known
    assert groups[1].figures.unpriced == {"anthropic/claude-private": 1}
    assert not fleet.known
    assert fleet.unpriced == {"anthropic/claude-private": 1}


def test_a_sessions_cost_in_one_call_is_its_group_in_the_fleet() -> None:
    a = _session("a", [Usage(100, 10, 0, 2000), Usage(50, 10, 2000, 100), Usage(2150, 10, 0, 0)])
    b = _session("b", [Usage(10, 5, 0, 1500)])
    groups, _ = cost_groups([*classify_session("a", a), *classify_session("b", b)], TABLE, "session")
    alone = session_cost("a", a, TABLE)
    grouped = groups[0].figures
    assert (alone.steps, alone.spend, alone.no_cache, alone.saved, alone.drop_cost) == (
        grouped.steps, grouped.spend, grouped.no_cache, grouped.saved, grouped.drop_cost,
    )  # fmt: skip
    assert alone.by_cause == {"first-request": Decimal("0.00717"), "unexplained": Decimal("0.00567")}
