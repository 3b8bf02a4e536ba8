"""The /metrics, /healthz and /readyz server and the projector/dispatcher recorders, over real HTTP."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from foldline.core.content import Usage
from foldline.errors import MetricsServerError, ProviderError
from foldline.metrics import DispatcherMetrics, LoopMetrics, ProjectorMetrics, new_registry
from foldline.metrics_server import serve


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return int(resp.status), resp.read().decode()
    except urllib.error.HTTPError as exc:
        body = exc.read().decode()
        exc.close()
        return exc.code, body


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def test_probes_follow_their_checks() -> None:
    state: dict[str, bool | None] = {"ready": False, "live": True}

    def ready() -> bool:
        if state["ready"] is None:
            raise ConnectionError("redis unreachable")
        return bool(state["ready"])

    with serve(0, new_registry(), ready=ready, live=lambda: bool(state["live"]), host="127.0.0.1") as server:
        base = server.url
        assert get(base + "/healthz") == (200, "ok\n")
        assert get(base + "/readyz") == (503, "not ready\n")
        state["ready"] = True
        assert get(base + "/readyz") == (200, "ok\n")
        state["ready"] = None
        assert get(base + "/readyz") == (503, "ConnectionError: redis unreachable\n")
        state["live"] = False
        assert get(base + "/healthz")[0] == 503
        status, body = get(base + "/nope")
        assert status == 404
        assert "/metrics" in body
        status, body = get(base + "/metrics?name[]=x")
        assert status == 200
        assert "process_resident_memory_bytes" in body


def test_readyz_names_each_dependency_that_is_not_ready() -> None:
    up = {"redis": True, "s3": True}

    def s3() -> bool:
        if not up["s3"]:
            raise ConnectionError("S3 endpoint http://127.0.0.1:1 did not answer\n(connection refused)")
        return True

    checks = {"worker": lambda: True, "redis": lambda: up["redis"], "s3": s3}
    with serve(0, new_registry(process=False), ready=checks, host="127.0.0.1") as server:
        assert get(server.url + "/readyz") == (200, "ok\n")
        up["s3"] = False
        assert get(server.url + "/readyz") == (
            503,
            "s3: ConnectionError: S3 endpoint http://127.0.0.1:1 did not answer (connection refused)\n",
        )
        up["redis"] = False
        assert get(server.url + "/readyz") == (
            503,
            "redis: not ready\ns3: ConnectionError: S3 endpoint "
            "http://127.0.0.1:1 did not answer (connection refused)\n",
        )


def test_a_taken_port_is_a_clear_error() -> None:
    server = serve(0, new_registry(process=False), host="127.0.0.1")
    try:
        with pytest.raises(MetricsServerError, match=f"127.0.0.1:{server.port}.*--metrics-port"):
            serve(server.port, new_registry(process=False), host="127.0.0.1")
    finally:
        server.close()


def test_projector_dispatcher_and_loop_recorders_over_http() -> None:
    registry = new_registry(process=False)
    projector = ProjectorMetrics(registry)
    dispatcher = DispatcherMetrics(registry)
    loop = LoopMetrics(registry)
    projector.projector_applied(120, 0.004)
    projector.projector_applied(30, 0.002)
    projector.set_lag(events=7, seconds=0.25, partition="3")
    projector.seq_gap()
    projector.fenced_write()
    projector.duplicate(4)
    projector.fold_rebuilt()
    dispatcher.dispatch_latency("anthropic", "claude", 0.8)
    dispatcher.fold_wait(0.01)
    dispatcher.dispatch_error(ProviderError("503 from upstream"))
    dispatcher.dispatch_error("FoldTimeout")
    loop.append_fenced("s-1")
    loop.attachment_error("AttachmentNotFound")
    loop.invariant_violation()
    loop.observe_step("anthropic", "claude", Usage(input=10, output=5, cache_read=900, cache_write=90))
    with serve(0, registry, host="127.0.0.1") as server:
        status, text = get(server.url + "/metrics")
    assert status == 200
    got = samples(text)
    assert got[("foldline_projector_events_applied_total", ())] == 150
    assert got[("foldline_projector_batches_applied_total", ())] == 2
    assert got[("foldline_projector_apply_duration_seconds_count", ())] == 2
    assert got[("foldline_projector_lag_events", (("partition", "3"),))] == 7
    assert got[("foldline_projector_lag_seconds", (("partition", "3"),))] == 0.25
    for name in ("seq_gaps", "fenced_writes", "fold_rebuilds"):
        assert got[(f"foldline_projector_{name}_total", ())] == 1, name
    assert got[("foldline_projector_duplicate_events_total", ())] == 4
    pm = (("model", "claude"), ("provider", "anthropic"))
    assert got[("foldline_dispatch_duration_seconds_sum", pm)] == 0.8
    assert got[("foldline_dispatcher_fold_wait_seconds_count", ())] == 1
    assert got[("foldline_dispatch_errors_total", (("kind", "ProviderError"),))] == 1
    assert got[("foldline_dispatch_errors_total", (("kind", "FoldTimeout"),))] == 1
    assert got[("foldline_loop_fenced_writes_total", ())] == 1
    assert got[("foldline_attachment_errors_total", (("kind", "AttachmentNotFound"),))] == 1
    assert got[("foldline_attachment_errors_total", (("kind", "AttachmentCorrupt"),))] == 0
    assert got[("foldline_invariant_violations_total", ())] == 1
    assert got[("foldline_step_cache_read_tokens_total", pm)] == 900
    assert got[("foldline_step_cache_read_ratio_bucket", (("le", "0.85"), *pm))] == 0
    assert got[("foldline_step_cache_read_ratio_bucket", (("le", "0.9"), *pm))] == 1  # 900 / 1000
    assert got[("foldline_cache_read_drops_total", (("cause", "unexplained"),))] == 0
    assert not any(name.endswith("_created") for name, _ in got)
