"""The money families of the loop metrics: spend by token class, saved, drop cost by cause, unpriced steps —
the same figures `foldline cost` computes from the log, with bounded labels."""

from __future__ import annotations

from decimal import Decimal

import pytest
from prometheus_client import CollectorRegistry

from foldline.adapters.memory_log import MemoryEventLog
from foldline.adapters.metered_log import MeteredEventLog
from foldline.core.cost import PriceRow, PriceTable, cost_groups
from foldline.core.drops import classify_session
from foldline.metrics import LoopMetrics
from tests.test_drops import StepLog


def _table() -> PriceTable:
    """Claude Sonnet-class prices in force since 2000 (the test logs' clock starts early)."""
    prices = {"input": "3", "cache-write-5m": "3.75", "cache-write-1h": "6", "cache-read": "0.30", "output": "15"}
    return PriceTable(
        PriceRow("anthropic", "claude-emulated", c, Decimal(p), "USD", "2000-01-01", "https://example.com")
        for c, p in prices.items()
    )


def _total(registry: CollectorRegistry, name: str) -> float:
    return sum(
        s.value for metric in registry.collect() for s in metric.samples if s.name == name and s.value is not None
    )


def test_the_counters_hold_the_figures_of_the_log() -> None:
    registry = CollectorRegistry()
    table = _table()
    log = MeteredEventLog(MemoryEventLog(), LoopMetrics(registry, prices=table))
    events = (
        StepLog()
        .step(0, 1100, tool=True)
        .step(1100, 60)
        .step(0, 1200, after_s=400)  # past the 5-minute TTL
        .header("change", "A new system prompt.")
        .step(5, 1300)
        .valid()
    )
    for i in range(0, len(events), 4):
        log.append("s", i, events[i : i + 4])
    _, fleet = cost_groups(classify_session("s", events), table)
    assert fleet.known
    assert _total(registry, "foldline_spend_total") == pytest.approx(float(fleet.spend))
    assert _total(registry, "foldline_saved_total") - _total(registry, "foldline_cache_overspend_total") == (
        pytest.approx(float(fleet.saved))
    )
    assert _total(registry, "foldline_drop_cost_total") == pytest.approx(float(fleet.drop_cost))
    pm = {"provider": "anthropic", "model": "claude-emulated", "currency": "USD"}
    # by the classifier's cause (bounded); `foldline cost` names a header change's fields too
    for cause, key in (("first-request",) * 2, ("cache-ttl",) * 2, ("header-change", "header-change:system")):
        value = registry.get_sample_value("foldline_drop_cost_total", {**pm, "cause": cause})
        assert value == pytest.approx(float(fleet.by_cause[key])), cause
    write = registry.get_sample_value("foldline_spend_total", {**pm, "token_class": "cache-write-5m"})
    assert write == pytest.approx(float(fleet.by_class["cache-write-5m"]))
    # labels are bounded: no session id anywhere
    labels = {k for metric in registry.collect() for s in metric.samples for k in s.labels}
    assert labels <= {"provider", "model", "token_class", "cause", "currency", "reason", "kind", "le"}


def test_a_step_without_a_price_is_counted_as_unpriced_never_as_zero_spend() -> None:
    registry = CollectorRegistry()
    log = MeteredEventLog(MemoryEventLog(), LoopMetrics(registry, prices=_table()))
    events = StepLog(model="claude-private").step(0, 1100).step(1100, 60).valid()
    log.append("s", 0, events)
    assert (
        registry.get_sample_value("foldline_unpriced_steps_total", {"provider": "anthropic", "model": "claude-private"})
        == 2
    )
    assert _total(registry, "foldline_spend_total") == 0
    assert not [
        s
        for metric in registry.collect()
        for s in metric.samples
        if s.labels.get("model") == "claude-private" and s.name == "foldline_spend_total"
    ]
