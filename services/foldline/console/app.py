"""The console's ASGI application (Starlette): server-rendered pages, htmx fragments, server-sent events.

Pages: ``/sessions`` (the list; its table is also a fragment for htmx), ``/session?id=`` (one session),
``/session/step?id=&turn=&step=`` (one step: its events, tool calls and results, images, its request),
``/session/request?id=&seq=`` (the rebuilt request body and its proof), ``/session/verify?id=`` (the session's
verify status, a fragment), ``/session/live?id=&head=`` (server-sent events while the session grows),
``/session/image?id=&attachment=`` (an image the log references), ``/fleet``; ``/static/…`` holds every file a page
loads (nothing comes from another origin). Session ids travel in query strings, so no id needs path escaping.

Safety (docs: README "Console"): every template is autoescaped and log text is also shown with its control
characters escaped (:func:`shown`); each answer carries a Content-Security-Policy with no ``unsafe-inline`` and
no ``unsafe-eval``, so nothing a log holds can run; only GET and HEAD are served; with a token every request must
carry it (a header or the cookie a ``?token=`` visit sets), compared in constant time; without one, a request must
name a loopback host (a page on another site cannot reach the console through DNS rebinding).
"""

from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from importlib import resources
from typing import Any, Final
from urllib.parse import urlencode

import anyio.to_thread
import jinja2
import orjson
from markupsafe import Markup, escape
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from ..cli.cost_commands import money
from ..cli.output import escape_controls
from ..core.drops import DROP_CAUSES
from ..core.events import ToolCall, ToolResult
from ..errors import AttachmentError, FoldlineError, SessionNotFound
from .data import SAFE_IMAGE_TYPES, ConsoleData
from .index import PAGE_SIZES, SORTS, ListQuery
from .model import SessionPage, StepRow

__all__ = ["CSP", "ConsoleOptions", "create_app", "shown"]

CSP: Final = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "font-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
SECURITY_HEADERS: Final = {
    "content-security-policy": CSP,
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "x-frame-options": "DENY",
    "cross-origin-resource-policy": "same-origin",
}
TOKEN_COOKIE: Final = "foldline_console_token"
LOOPBACK_HOSTS: Final = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})
STEPS_PER_PAGE: Final = 200


@dataclass(frozen=True, slots=True)
class ConsoleOptions:
    """How the app serves: ``token`` (None: loopback only), the live pages' poll interval."""

    token: str | None = None
    poll_s: float = 0.5
    live_timeout_s: float = 3600.0  # a live stream ends after this (the browser reconnects)


def shown(value: object) -> Markup:
    """Log text as HTML: escaped, with every control, format (bidi) and separator character written as an
    escape (``\\u202e``) — newlines kept as line breaks — so it reads exactly as logged and acts on nothing."""
    text = str(value)
    lines = [escape_controls(part) for part in text.split("\n")]
    return Markup("\n").join(escape(line) for line in lines)


def _href(path: str, **params: object) -> str:
    return path + ("?" + urlencode({k: v for k, v in params.items() if v is not None}) if params else "")


def _when(ms: int | None) -> str:
    if ms is None:
        return ""
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _ago(ms: int | None) -> str:
    if ms is None:
        return ""
    s = max(0, time.time() - ms / 1000)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{int(s // size)}{unit} ago"
    return f"{int(s)}s ago"


def _json_attr(value: Any) -> str:
    return orjson.dumps(value, default=_default).decode()


def _default(value: object) -> object:
    if isinstance(value, Decimal):
        return float(value)
    raise TypeError(type(value).__name__)


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("foldline.console", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["shown"] = shown
    env.filters["when"] = _when
    env.filters["ago"] = _ago
    env.filters["thousands"] = lambda n: "" if n is None else f"{n:,}"
    env.filters["ratio"] = lambda r: "" if r is None else f"{r:.1%}"
    env.globals["href"] = _href
    env.globals["DROP_CAUSES"] = DROP_CAUSES
    return env


class _Security:
    """Every answer gets the security headers; only GET and HEAD pass; the token or a loopback Host is checked."""

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app = app
        self.token = token.encode() if token is not None else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)

        async def with_headers(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers += [(k.encode(), v.encode()) for k, v in SECURITY_HEADERS.items()]
                message = {**message, "headers": headers}
            await send(message)

        if request.method not in ("GET", "HEAD"):
            await PlainTextResponse("the console is read-only: only GET and HEAD are served", 405)(
                scope, receive, with_headers
            )
            return
        if self.token is None:
            if _host_name(request.headers.get("host") or "") not in LOOPBACK_HOSTS:
                await PlainTextResponse(
                    "this console serves loopback addresses only (Host must be 127.0.0.1, localhost or [::1])", 421
                )(scope, receive, with_headers)
                return
        else:
            given = request.query_params.get("token")
            if given is not None and hmac.compare_digest(given.encode(), self.token):
                # the token from a link: set the cookie, then show the same URL without it
                params = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
                target = request.url.path + ("?" + urlencode(params) if params else "")
                response = RedirectResponse(target, 303)
                response.set_cookie(TOKEN_COOKIE, given, httponly=True, samesite="strict", path="/")
                await response(scope, receive, with_headers)
                return
            offered = request.cookies.get(TOKEN_COOKIE, "")
            auth = request.headers.get("authorization", "")
            if auth.lower().startswith("bearer "):
                offered = auth[7:].strip()
            if not hmac.compare_digest(offered.encode(), self.token):
                await PlainTextResponse(
                    "this console needs its token: open it once with ?token=<FOLDLINE_CONSOLE_TOKEN>, or send "
                    "Authorization: Bearer <token>",
                    401,
                )(scope, receive, with_headers)
                return
        await self.app(scope, receive, with_headers)


def create_app(data: ConsoleData, options: ConsoleOptions | None = None) -> ASGIApp:
    """The console over ``data`` (see the module docstring)."""
    opts = options or ConsoleOptions()
    env = _environment()
    currency = data.table.currency
    env.filters["money"] = lambda v: money(v, currency)

    def render(name: str, status_code: int = 200, **context: Any) -> HTMLResponse:
        return HTMLResponse(env.get_template(name).render(**context), status_code)

    def not_found(what: str) -> HTMLResponse:
        return render("error.html", 404, title="not found", message=what)

    def handler(fn: Callable[[Request], Response]) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            try:
                return await anyio.to_thread.run_sync(fn, request)
            except SessionNotFound as exc:
                return not_found(str(exc))
            except (ValueError, KeyError) as exc:
                return render("error.html", 400, title="bad request", message=f"{type(exc).__name__}: {exc}")
            except FoldlineError as exc:
                return render("error.html", 503, title=type(exc).__name__, message=str(exc))

        return endpoint

    # ------------------------------------------------------------------ the sessions list

    def list_query(request: Request) -> ListQuery:
        p = request.query_params

        def dec(name: str) -> Decimal | None:
            raw = (p.get(name) or "").strip()
            if not raw:
                return None
            try:
                amount = Decimal(raw)
            except ArithmeticError as exc:
                raise ValueError(f"{name}={raw!r} is not an amount (e.g. 0.25, in the price table's currency)") from exc
            if not amount.is_finite():
                raise ValueError(f"{name}={raw!r} is not an amount (e.g. 0.25, in the price table's currency)")
            return amount

        sort = p.get("sort") or "activity"
        if sort not in SORTS:
            raise ValueError(f"sort={sort!r}: expected one of {', '.join(SORTS)}")
        per_page = int(p.get("per_page") or 50)
        if per_page not in PAGE_SIZES:
            raise ValueError(f"per_page={per_page}: expected one of {', '.join(map(str, PAGE_SIZES))}")
        return ListQuery(
            model=p.get("model") or None,
            status=p.get("status") or None,
            unexplained=p.get("unexplained") in ("1", "on", "true"),
            min_cost=dec("min_cost"),
            max_cost=dec("max_cost"),
            text=p.get("q") or None,
            sort=sort,  # type: ignore[arg-type]
            descending=p.get("order", "desc") != "asc",
            page=int(p.get("page") or 1),
            per_page=per_page,
        )

    def sessions(request: Request) -> Response:
        q = list_query(request)
        every = data.index.summaries()  # one refresh for the whole page
        result = data.index.query(q, every)
        context: dict[str, Any] = {
            "q": q,
            "result": result,
            "models": data.index.models(every),
            "statuses": data.index.statuses(every),
            "sorts": SORTS,
            "currency": currency,
            "page_sizes": PAGE_SIZES,
            "children": data.index.children,
            "params": {k: v for k, v in request.query_params.items() if k != "page"},
        }
        if request.headers.get("hx-request") == "true":
            return render("sessions_table.html", **context)
        return render("sessions.html", title="sessions", **context)

    # ------------------------------------------------------------------ one session

    def session_id(request: Request) -> str:
        sid = request.query_params.get("id")
        if not sid:
            raise ValueError("id: which session? (/session?id=<session id>)")
        return sid

    def session(request: Request) -> Response:
        sid = session_id(request)
        page = data.page(sid)
        pages = max(1, -(-len(page.steps) // STEPS_PER_PAGE))
        at = int(request.query_params.get("steps_page") or pages)  # the newest steps first shown
        at = min(max(1, at), pages)
        rows = page.steps[(at - 1) * STEPS_PER_PAGE : at * STEPS_PER_PAGE]
        return render(
            "session.html",
            title=sid,
            sid=sid,
            page=page,
            summary=page.summary,
            rows=rows,
            steps_page=at,
            steps_pages=pages,
            live_tail=at == pages,
            turns={t.first_step: t for t in page.turns},
            children=data.children(sid),
            fold=data.fold_status(sid),
            chart=_json_attr(page.chart()),
            drops=[r.drop for r in page.steps if r.drop is not None],
        )

    def verify(request: Request) -> Response:
        sid = session_id(request)
        report = data.verify(sid)
        return render("verify.html", sid=sid, report=report)

    def step(request: Request) -> Response:
        sid = session_id(request)
        turn, number = int(request.query_params["turn"]), int(request.query_params["step"])
        page = data.page(sid)
        row = next((r for r in page.steps if r.turn == turn and r.step == number), None)
        if row is None:
            raise SessionNotFound(f"{sid} has no step {turn}.{number}")
        events = data.step_events(sid, turn, number)
        results = {e.data.call_id: e for e in events if isinstance(e.data, ToolResult)}
        calls = {e.data.call_id for e in events if isinstance(e.data, ToolCall)}
        return render(
            "step.html",
            title=f"{sid} step {turn}.{number}",
            sid=sid,
            row=row,
            events=events,
            results=results,
            calls=calls,
            page=page,
        )

    def request_body(request: Request) -> Response:
        sid = session_id(request)
        seq = int(request.query_params["seq"])
        proof = data.request(sid, seq)
        if request.headers.get("hx-request") == "true":
            return render("request.html", proof=proof, sid=sid)
        return render("request_page.html", title=f"{sid} request at seq {seq}", proof=proof, sid=sid)

    def image(request: Request) -> Response:
        sid = session_id(request)
        attachment = request.query_params.get("attachment") or ""
        try:
            ref, body = data.image(sid, attachment)
        except AttachmentError as exc:
            return PlainTextResponse(f"{type(exc).__name__}: {exc}", 502)
        if ref.media_type not in SAFE_IMAGE_TYPES:
            return PlainTextResponse(
                f"{ref.media_type} is not served as an image (only {', '.join(sorted(SAFE_IMAGE_TYPES))})", 415
            )
        return Response(
            body,
            media_type=ref.media_type,
            headers={"cache-control": "private, max-age=31536000, immutable", "x-attachment-digest": ref.attachment_id},
        )

    def step_rows_html(page: SessionPage, rows: list[StepRow]) -> str:
        turns = {t.first_step: t for t in page.turns}
        return env.get_template("step_rows.html").render(sid=page.session_id, rows=rows, turns=turns, page=page)

    async def live(request: Request) -> Response:
        sid = request.query_params.get("id") or ""
        try:
            since = int(request.query_params.get("head") or 0)
        except ValueError:
            return PlainTextResponse("head must be a seq", 400)

        async def stream() -> AsyncIterator[bytes]:
            nonlocal since
            yield b"retry: 2000\n\n"
            deadline = time.monotonic() + opts.live_timeout_s
            quiet = 0.0
            while time.monotonic() < deadline:
                if await request.is_disconnected():
                    return
                head = await anyio.to_thread.run_sync(data.head, sid)
                if head > since:
                    page = await anyio.to_thread.run_sync(data.page, sid)
                    changed = [r for r in page.steps if _touched_since(r, since)]
                    summary = page.summary
                    payload = {
                        "head": page.head,
                        "status": summary.status,
                        "steps": len(page.steps),
                        "points": [r.chart_point() for r in changed],
                        "drops": [
                            {"x": r.index, "cause": r.drop.cause, "explained": r.drop.explained}
                            for r in changed
                            if r.drop is not None
                        ],
                        "rows": step_rows_html(page, changed),
                        "stats": env.get_template("session_stats.html").render(
                            summary=summary, page=page, sid=sid, fold=None
                        ),
                    }
                    since = page.head
                    yield b"event: update\ndata: " + orjson.dumps(payload, default=_default) + b"\n\n"
                    quiet = 0.0
                else:
                    quiet += opts.poll_s
                    if quiet >= 15:
                        yield b": keep-alive\n\n"
                        quiet = 0.0
                await asyncio.sleep(opts.poll_s)

        return StreamingResponse(
            stream(), media_type="text/event-stream", headers={"cache-control": "no-store", "x-accel-buffering": "no"}
        )

    # ------------------------------------------------------------------ the fleet

    def fleet(request: Request) -> Response:
        f = data.index.fleet()
        hours: list[float] = [t / 1000 for t, _ in f.buckets]
        # an hour that holds a step without a price has no spend (a gap), never a partial sum
        spend: list[float | None] = [float(b.spend) if not b.unpriced else None for _, b in f.buckets]
        ratio: list[float | None] = [(b.cache_read / b.prompt) if b.prompt else None for _, b in f.buckets]
        if hours:  # an empty hour either side: the time axis spans hours, not the years uPlot pads a lone point with
            hours, spend, ratio = (
                [hours[0] - 3600, *hours, hours[-1] + 3600],
                [None, *spend, None],
                [None, *ratio, None],
            )
        chart = {"columns": [hours, spend, ratio], "currency": currency}
        alert = request.query_params.get("alert")
        return render("fleet.html", title="fleet", fleet=f, chart=_json_attr(chart), alert=alert)

    def home(request: Request) -> Response:
        return RedirectResponse("/sessions", 302)

    async def healthz(request: Request) -> Response:
        return PlainTextResponse("ok")

    static = resources.files("foldline.console").joinpath("static")
    routes = [
        Route("/", handler(home)),
        Route("/sessions", handler(sessions)),
        Route("/session", handler(session)),
        Route("/session/verify", handler(verify)),
        Route("/session/step", handler(step)),
        Route("/session/request", handler(request_body)),
        Route("/session/image", handler(image)),
        Route("/session/live", live),
        Route("/fleet", handler(fleet)),
        Route("/healthz", healthz),
        Mount("/static", StaticFiles(directory=str(static)), name="static"),
    ]
    app = Starlette(routes=routes)
    return _Security(app, opts.token)


def _host_name(host: str) -> str:
    """The name in a Host header, without its port (``[::1]:8765`` → ``[::1]``)."""
    if host.startswith("["):
        return host.split("]", 1)[0] + "]"
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _touched_since(row: StepRow, since: int) -> bool:
    """A step row changed by events at or after ``since``: opened, dispatched, answered or closed there."""
    seqs = [row.start_seq, row.dispatch_seq, row.end_seq]
    if row.priced is not None:
        seqs.append(row.priced.verdict.step.response_seq)
    return any(s is not None and s >= since for s in seqs)
