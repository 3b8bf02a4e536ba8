"""The console's pages over a real demo data directory, through the ASGI app (no browser: tests/console/test_browser.py
drives Chromium): every page serves, every figure is the commands' own, log text is escaped, the safety rules hold.
"""

from __future__ import annotations

import hashlib
import html
import json
import re
import shutil
import threading
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson
import pytest
from starlette.testclient import TestClient
from typer.testing import CliRunner

from foldline.adapters.sqlite_log import SqliteEventLog
from foldline.cli.cost_commands import figures_json, money
from foldline.cli.main import app as cli
from foldline.config import Config, open_stores
from foldline.config.prices import load_price_table
from foldline.console.app import CSP, ConsoleOptions, create_app
from foldline.console.data import ConsoleData
from foldline.console.index import ListQuery
from foldline.core.content import ImageBlock
from foldline.core.cost import CostFigures, PriceTable
from foldline.core.events import (
    CompactionStart,
    CompactionSummary,
    ReplaceOp,
    RequestDispatch,
    ToolResult,
    UserMessage,
)

from .logs import HOSTILE_ID, HOSTILE_SYSTEM, HOSTILE_TEXT, HOSTILE_TOOL_OUTPUT, TAMPERED_ID

runner = CliRunner()
LOCAL = "http://127.0.0.1:8765"


@pytest.fixture
def client(console_data: ConsoleData) -> Iterator[TestClient]:
    with TestClient(create_app(console_data), base_url=LOCAL) as c:
        yield c


def _cli_json(args: list[str], data: Path, code: int = 0) -> Any:
    res = runner.invoke(cli, [*args, "--data-dir", str(data), "--json"])
    assert res.exit_code == code, res.output
    return json.loads(res.stdout)


def _dispatches(data: Path, sid: str) -> list[int]:
    with SqliteEventLog(data, read_only=True) as log:
        return [e.seq for e in log.read(sid) if isinstance(e.data, RequestDispatch)]


def test_every_page_of_every_session_serves(client: TestClient, console_dir: Path) -> None:
    listed = client.get("/sessions", params={"per_page": 200})
    assert listed.status_code == 200
    with SqliteEventLog(console_dir, read_only=True) as log:
        ids = log.sessions()
    assert len(ids) >= 8
    for sid in ids:
        assert f'data-session="{_attr(sid)}"' in listed.text, sid
        page = client.get("/session", params={"id": sid})
        assert page.status_code == 200, (sid, page.text[:500])
        assert 'id="step-chart"' in page.text
        step = re.search(r'href="(/session/step\?[^"]+)"', page.text)
        assert step is not None, sid
        assert client.get(step.group(1).replace("&amp;", "&")).status_code == 200
    assert client.get("/fleet").status_code == 200
    assert client.get("/").status_code == 200  # redirected to the list
    assert client.get("/session", params={"id": "no-such-session"}).status_code == 404
    assert client.get("/session").status_code == 400
    assert client.get("/sessions", params={"sort": "nonsense"}).status_code == 400


def _attr(text: str) -> str:
    return (
        text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&#34;").replace("'", "&#39;")
    )


def test_every_answer_carries_the_security_headers_and_only_get_is_served(client: TestClient) -> None:
    for path in ("/sessions", "/session?id=demo-000", "/static/console.js", "/session?id=missing", "/fleet"):
        answer = client.get(path)
        assert answer.headers["content-security-policy"] == CSP, path
        assert answer.headers["x-content-type-options"] == "nosniff"
        assert answer.headers["x-frame-options"] == "DENY"
    assert "unsafe-inline" not in CSP
    assert "unsafe-eval" not in CSP
    assert "script-src 'self'" in CSP
    for method in ("POST", "PUT", "DELETE", "PATCH"):
        refused = client.request(method, "/session?id=demo-000")
        assert refused.status_code == 405, method
        assert "read-only" in refused.text
        assert refused.headers["content-security-policy"] == CSP


def test_without_a_token_only_a_loopback_host_is_served(console_data: ConsoleData) -> None:
    with TestClient(create_app(console_data), base_url="http://evil.example") as c:
        answer = c.get("/sessions")
        assert answer.status_code == 421
        assert "loopback" in answer.text
    for host in ("127.0.0.1", "localhost:8765", "[::1]:8765"):
        with TestClient(create_app(console_data), base_url=f"http://{host}") as c:
            assert c.get("/healthz").status_code == 200, host


def test_with_a_token_every_request_must_carry_it(console_data: ConsoleData) -> None:
    token = "s3cret-console-token"
    with TestClient(create_app(console_data, ConsoleOptions(token=token)), base_url="http://10.9.8.7") as c:
        assert c.get("/sessions").status_code == 401
        assert c.get("/sessions", headers={"authorization": "Bearer wrong"}).status_code == 401
        assert c.get("/sessions", headers={"authorization": f"Bearer {token}"}).status_code == 200
        assert c.get("/session", params={"id": "demo-000", "token": "nope"}).status_code == 401
        link = c.get("/session", params={"id": "demo-000", "token": token}, follow_redirects=False)
        assert link.status_code == 303
        assert link.headers["location"] == "/session?id=demo-000"  # the token leaves the address bar
        cookie = link.headers["set-cookie"]
        assert "HttpOnly" in cookie
        assert "SameSite=strict" in cookie
        assert c.get("/session", params={"id": "demo-000"}).status_code == 200  # the cookie now carries it
        assert c.post("/sessions", headers={"authorization": f"Bearer {token}"}).status_code == 405


def test_log_text_is_shown_literally_and_never_as_markup(client: TestClient, console_dir: Path) -> None:
    pages = [
        client.get("/sessions", params={"q": "onerror"}),
        client.get("/session", params={"id": HOSTILE_ID}),
        client.get("/fleet"),
    ]
    steps = re.findall(r'href="(/session/step\?[^"]+)"', pages[1].text)
    assert steps
    pages += [client.get(s.replace("&amp;", "&")) for s in steps]
    seqs = _dispatches(console_dir, HOSTILE_ID)
    pages += [client.get("/session/request", params={"id": HOSTILE_ID, "seq": seq}) for seq in seqs]
    assert all(p.status_code == 200 for p in pages), [p.status_code for p in pages]
    html = "".join(p.text for p in pages)
    for raw in ("<script>window.__pwned", "<img src=x onerror", 'href="javascript:', "<style>body", "\u202e", "\x1b"):
        assert raw not in html, raw
    assert "&lt;script&gt;window.__pwned=&#39;message&#39;&lt;/script&gt;" in html
    assert "&lt;img src=x onerror=&#34;window.__pwned=&#39;id&#39;&#34;&gt;" in html  # the session id
    assert "javascript:alert(1)" in html  # shown as text, never a link
    assert "\\u202eevil-rtl\\u202c" in html
    assert "\\x1b[31mred" in html
    assert "\\u2028next" in html
    assert "{{ 7*7 }}" in html  # never a template
    assert "&lt;/script&gt;&lt;script&gt;window.__pwned=&#39;system&#39;" in html  # the system prompt
    assert "&lt;img src=x onerror=&#34;window.__pwned=&#39;tool&#39;&#34;&gt;" in html  # a tool's result
    assert "<script>" not in html.replace('<script src="/static/', "")  # no inline script at all
    assert " style=" not in html  # no inline style at all
    assert "<style" not in html
    for text in (HOSTILE_TEXT, HOSTILE_SYSTEM, HOSTILE_TOOL_OUTPUT):
        assert text  # the fixture's strings (imported in the session above)


def test_a_tampered_session_shows_its_mismatch_where_verify_finds_it(client: TestClient, console_dir: Path) -> None:
    verdict = _cli_json(["verify", TAMPERED_ID], console_dir, code=1)
    [first, *_] = verdict["mismatched"]
    fragment = client.get("/session/verify", params={"id": TAMPERED_ID})
    assert 'id="verify-status" class="verify verify-mismatched"' in fragment.text
    assert f"seq {first['seq']}" in fragment.text
    proof = client.get(
        "/session/request", params={"id": TAMPERED_ID, "seq": first["seq"]}, headers={"hx-request": "true"}
    )
    assert 'id="proof-status">mismatched<' in proof.text
    assert f'id="recorded-digest">{first["recorded"]}<' in proof.text
    assert f'id="rebuilt-digest">{first["rebuilt"]}<' in proof.text
    offset = re.search(r'id="diff-offset">([\d,]+)<', proof.text)
    assert offset is not None
    assert int(offset.group(1).replace(",", "")) == first["firstDiffOffset"]
    assert "What does this chart show" in proof.text  # the byte sent, and the byte rebuilt
    assert "Which does this chart show" in proof.text
    untouched = client.get("/session/verify", params={"id": "demo-001"})
    assert "verify-verified" in untouched.text


def test_the_request_body_is_the_one_foldline_requests_rebuilds(client: TestClient, console_dir: Path) -> None:
    res = runner.invoke(cli, ["requests", "demo-002", "--data-dir", str(console_dir), "--json"])
    assert res.exit_code == 0
    rows = [json.loads(line) for line in res.stdout.splitlines()]
    for row in rows[:3] + rows[-2:]:
        proof = client.get("/session/request", params={"id": "demo-002", "seq": row["seq"]})
        assert 'id="proof-status">verified<' in proof.text
        assert f'id="rebuilt-digest">{row["digest"]}<' in proof.text
        assert f'id="recorded-digest">{row["recordedDigest"]}<' in proof.text
        body = re.search(r'<pre class="json" id="request-body">(.*?)</pre>', proof.text, re.S)
        assert body is not None
        assert json.loads(html.unescape(body.group(1))) == row["body"]


def _exact(figures: CostFigures) -> Any:
    """``figures`` as ``foldline cost --json`` writes them, read back with exact amounts."""
    return json.loads(orjson.dumps(figures_json(figures)), parse_float=Decimal)


def test_the_money_is_foldline_cost_s_per_session_and_in_total(
    console_data: ConsoleData, console_dir: Path, client: TestClient
) -> None:
    res = runner.invoke(cli, ["cost", "--data-dir", str(console_dir), "--json"])
    assert res.exit_code == 0, res.output
    cost = json.loads(res.stdout, parse_float=Decimal)
    by_session = {g["session"]: {k: v for k, v in g.items() if k != "session"} for g in cost["groups"]}
    ids = console_data.stores.log.sessions()
    assert sorted(by_session) == sorted(ids)
    priced = 0
    for sid in ids:
        summary = console_data.index.get(sid)
        assert summary is not None
        assert _exact(summary.figures) == by_session[sid], sid  # the list's figures: the session index's
        page = console_data.page(sid)
        assert _exact(page.summary.figures) == by_session[sid], sid  # the session page's, fed step by step
        steps = [r.priced for r in page.steps if r.priced is not None]
        assert len(steps) == by_session[sid]["steps"]
        spend = by_session[sid]["spend"]
        if spend is None:
            assert any(p.cost is None for p in steps), sid
            assert 'id="spend">unknown<' in client.get("/session", params={"id": sid}).text
            continue
        priced += 1
        assert sum((p.cost.spend for p in steps if p.cost is not None), Decimal(0)) == spend, sid
        drops = [r.drop.cost for r in page.steps if r.drop is not None]
        assert sum((c for c in drops if c is not None), Decimal(0)) == by_session[sid]["dropCost"], sid
        shown = client.get("/session", params={"id": sid}).text
        assert f'id="spend">{money(spend, cost["currency"])}<' in shown, sid
    assert priced >= 4  # the demo's sessions are priced: the comparison is of amounts, not of nulls
    fleet = console_data.index.fleet()
    assert _exact(fleet.figures) == {k: v for k, v in cost["fleet"].items() if k != "sessions"}
    assert fleet.sessions == cost["fleet"]["sessions"]
    hours = sum((b.spend for _, b in fleet.buckets), Decimal(0))
    assert hours == fleet.figures.spend  # the spend over time adds up to the fleet's, priced steps only
    top = fleet.top_by_drop_cost
    ranked = sorted(
        ((sid, g["dropCost"]) for sid, g in by_session.items() if g["drops"] and g["dropCost"] is not None),
        key=lambda kv: (kv[1], kv[0]),
        reverse=True,
    )
    assert [(s.session_id, s.drop_cost) for s in top] == ranked[: len(top)]
    assert fleet.unranked == sum(1 for g in by_session.values() if g["drops"] and g["dropCost"] is None)


def test_the_drops_are_the_ones_foldline_drops_reports(console_data: ConsoleData, console_dir: Path) -> None:
    drops = _cli_json(["drops"], console_dir)
    by_step = {(d["session"], d["seq"]): d for d in drops["drops"]}
    seen = 0
    for sid in console_data.stores.log.sessions():
        for row in console_data.page(sid).steps:
            if row.drop is None:
                continue
            seen += 1
            d = by_step[(sid, row.drop.dispatch_seq)]
            assert (row.drop.cause, list(row.drop.causes), row.drop.lost) == (d["cause"], d["causes"], d["lost_tokens"])
            assert (row.drop.cache_read, row.drop.baseline) == (d["cache_read_tokens"], d["baseline_tokens"])
    assert seen == len(drops["drops"])
    fleet = console_data.index.fleet()
    assert fleet.figures.drops == len(drops["drops"])
    assert len(fleet.unexplained) == drops["counts"]["unexplained"]


def test_cost_filters_and_sorts_the_list_and_a_model_without_a_price_is_unknown(console_dir: Path) -> None:
    with_prices = ConsoleData(open_stores(Config(data_dir=console_dir), read_only=True), load_price_table())
    try:
        every = with_prices.index.summaries()
        known = sorted((s.spend, s.session_id) for s in every if s.spend is not None)
        assert len(known) >= 4
        low, high = known[1][0], known[-2][0]
        q = ListQuery(min_cost=low, max_cost=high, sort="cost", per_page=200)
        rows = with_prices.index.query(q).rows
        wanted = [(spend, sid) for spend, sid in known if low <= spend <= high]
        assert sorted((s.spend, s.session_id) for s in rows) == wanted  # the range, ends included
        assert [s.spend for s in rows] == sorted((spend for spend, _ in wanted), reverse=True)  # the most first
        assert len(wanted) < len(every)
        with TestClient(create_app(with_prices), base_url=LOCAL) as c:
            page = c.get("/sessions", params={"min_cost": str(low), "max_cost": str(high), "sort": "cost"})
            assert page.status_code == 200
            shown = [html.unescape(x) for x in re.findall(r'data-session="([^"]+)"', page.text)]  # ids as escaped
            assert shown == [s.session_id for s in rows]
            assert c.get("/sessions", params={"min_cost": "a lot"}).status_code == 400
    finally:
        with_prices.close()
    nothing = ConsoleData(open_stores(Config(data_dir=console_dir), read_only=True), PriceTable([]))
    try:
        with TestClient(create_app(nothing), base_url=LOCAL) as c:
            pages = [
                c.get("/sessions", params={"sort": "cost"}).text,
                c.get("/session", params={"id": "demo-000"}).text,
                c.get("/fleet").text,
            ]
            assert c.get("/sessions", params={"min_cost": "0"}).text.count('data-session="') == 0
        for text in pages:
            assert "unknown" in text
            assert "$0.000000" not in text  # never 0 for a model without a price
        assert "no price for " in pages[1]
        assert 'id="fleet-spend">unknown<' in pages[2]
        assert 'id="unranked">' in pages[2]  # the sessions whose drops cost an unknown amount, counted, not ranked
    finally:
        nothing.close()


def test_header_snapshots_and_lineage_are_diff_s(client: TestClient, console_dir: Path) -> None:
    diff = _cli_json(["diff", "demo-003"], console_dir)
    page = client.get("/session", params={"id": "demo-003"}).text
    for snap in diff["snapshots"]:
        assert f'id="header-{snap["seq"]}"' in page
    parent = diff["lineage"]["parentId"]
    assert f'fork of <a href="/session?id={parent}">{parent}</a>' in page
    assert "children: " in client.get("/session", params={"id": parent}).text


def test_compactions_and_trims_are_where_the_log_has_them(client: TestClient, console_dir: Path) -> None:
    with SqliteEventLog(console_dir, read_only=True) as log:
        events = log.read("golden-anthropic")
    [start] = [e for e in events if isinstance(e.data, CompactionStart)]
    [summary] = [e.data for e in events if isinstance(e.data, CompactionSummary)]
    trims = [e for e in events if isinstance(e.data, ToolResult) and isinstance(e.data.surface_op, ReplaceOp)]
    assert isinstance(start.data, CompactionStart)
    assert trims
    page = client.get("/session", params={"id": "golden-anthropic"}).text
    section = page[page.index('id="compactions"') :]
    assert f"compaction at seq {start.seq}: messages {start.data.start}..{start.data.end}" in section
    assert html.escape(summary.summary.splitlines()[0], quote=False) in section
    for t in trims:
        assert f"trim at seq {t.seq}:" in section
    assert "verify-verified" in client.get("/session/verify", params={"id": "golden-anthropic"}).text


def test_images_are_served_with_their_type_and_verified(client: TestClient, console_dir: Path, tmp_path: Path) -> None:
    with SqliteEventLog(console_dir, read_only=True) as log:
        first = next(e.data for e in log.read("demo-001") if isinstance(e.data, UserMessage))
    image = next(b.image for b in first.content if isinstance(b, ImageBlock))
    step = client.get("/session/step", params={"id": "demo-001", "turn": 0, "step": 0}).text
    assert f"attachment={image.attachment_id.replace(':', '%3A')}" in step
    answer = client.get("/session/image", params={"id": "demo-001", "attachment": image.attachment_id})
    assert answer.status_code == 200
    assert answer.headers["content-type"] == image.media_type
    assert "sha256:" + hashlib.sha256(answer.content).hexdigest() == image.attachment_id
    missing = client.get("/session/image", params={"id": "demo-001", "attachment": "sha256:" + "0" * 64})
    assert missing.status_code == 404  # only images the session's log references

    copy = tmp_path / "copy"
    shutil.copytree(console_dir, copy)
    digest = image.attachment_id.removeprefix("sha256:")
    stored = copy / "attachments" / "objects" / digest[:2] / digest
    stored.write_bytes(b"\x89PNG not the logged image")
    data = ConsoleData(open_stores(Config(data_dir=copy), read_only=True), load_price_table())
    try:
        with TestClient(create_app(data), base_url=LOCAL) as c:
            corrupt = c.get("/session/image", params={"id": "demo-001", "attachment": image.attachment_id})
        assert corrupt.status_code == 502
        assert "Corrupt" in corrupt.text or "corrupt" in corrupt.text
    finally:
        data.close()


def test_a_live_page_receives_each_new_step(console_dir: Path, tmp_path: Path) -> None:
    copy = tmp_path / "live"
    shutil.copytree(console_dir, copy)
    data = ConsoleData(open_stores(Config(data_dir=copy), read_only=True), load_price_table())
    head = data.head("demo-002")
    steps = len(data.page("demo-002").steps)
    received: list[dict[str, Any]] = []

    def resume() -> None:
        time.sleep(0.5)
        res = runner.invoke(cli, ["resume", "demo-002", "--steps", "2", "--data-dir", str(copy)])
        assert res.exit_code == 0, res.output

    writer = threading.Thread(target=resume)
    try:
        with TestClient(create_app(data, ConsoleOptions(poll_s=0.05, live_timeout_s=20)), base_url=LOCAL) as c:
            writer.start()
            with c.stream("GET", "/session/live", params={"id": "demo-002", "head": head}) as stream:
                assert stream.headers["content-type"].startswith("text/event-stream")
                for line in stream.iter_lines():
                    if line.startswith("data: "):
                        received.append(json.loads(line[6:]))
                        if received[-1]["steps"] >= steps + 2 and 'class="step' in received[-1]["rows"]:
                            answered = [p for p in received[-1]["points"] if p[1] is not None]
                            if answered and received[-1]["points"][-1][1] is not None:
                                break
    finally:
        writer.join()
        data.close()
    assert received, "no update arrived"
    assert received[-1]["head"] > head
    assert f'data-index="{steps}"' in "".join(u["rows"] for u in received)  # the first new step's row
    assert any(p[0] == steps + 1 for u in received for p in u["points"])
