"""The invariant companion: every loop request must equal its rebuild from the durable log — at O(new events).

The companion keeps, per session, its **own** fold of the log: a :class:`~foldline.core.Session` fed only
by events it read back from the store (the loop's cache and the dispatcher's fold never feed it). A check at
a boundary costs the events appended since the previous check:

1. **Catch up.** Read the events from the seq it last read to the boundary and fold them. Events the
   previous check folded *tentatively* (a step's opening, checked before it was written) must come back
   from the store byte-equal; if they do not, the fold is dropped and rebuilt from a full read.
2. **Fold the pending events tentatively** (the exact envelopes the loop is about to append with
   ``request/dispatch``); the next check confirms them against the store.
3. **Compare the requests** (:meth:`check`): header and message count always; the messages appended since
   the last check one by one (all of them after a surface replace); :class:`~foldline.errors.InvariantViolation`
   with a readable diff on any difference, before anything is written or sent.
4. **Compare the bytes** (:meth:`check_body`): the companion serializes its own request with its own
   incremental body cache and compares the digest with the digest of the body about to be sent. This is
   what ships, so it is checked on every step whatever the loop's request object holds. After a fresh
   rebuild the request is also serialized whole by the serializer and compared with the cached digest —
   unless the cache was empty (its first check of the session): that digest was of the body encoded whole.

A **fresh rebuild** — a new ``Session`` over a full read, serialized from scratch without any body cache —
also runs where it is rare or cheap: the first check of a session (its fold is built from a full read of the
log — by the check, or by :meth:`InvariantCompanion.load` from the events a loop instance's open read — and
that fold is the fresh rebuild: the request is serialized from scratch beside it), the
first check after the fold saw a surface replace (compaction, trim), and on a sample of steps: whenever
the session has grown by ``fresh_growth`` times since the last fresh rebuild (default 2: it doubled, so
the fresh rebuilds of a session cost at most as much as its incremental reads), and — when
``full_check_every`` is set — on every N-th check as well. docs/LOOP.md says what each check can and
cannot catch.

Loop requests only: one-shots (compaction's summarize call) are not marked and are not checked.
``on_violation`` (e.g. a metrics counter) hears of every violation.
"""

from __future__ import annotations

import difflib
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import orjson

from ..collector import collector_paused
from ..core import codec
from ..core.events import Envelope
from ..core.projection import MessageSequence, Session
from ..core.request import GenerateOptions, request_to_json
from ..errors import InvariantViolation, ValidationError
from ..ports.attachments import AttachmentStore
from ..ports.event_log import EventLog
from ..providers.base import Serializer
from ..providers.framing import IncrementalBody
from .registry import is_loop_request
from .step import session_request

__all__ = ["DEFAULT_FRESH_GROWTH", "DEFAULT_FULL_CHECK_EVERY", "InvariantCompanion", "request_diff"]

#: A fresh rebuild whenever the session has doubled since the last one (besides load and surface replaces);
#: amortized, the fresh rebuilds read no more events than the incremental checks do.
DEFAULT_FRESH_GROWTH = 2.0
#: A catch-up of more events than this folds with the cyclic collector paused (a load, a fresh rebuild)
_PAUSE_FROM = 1000
#: No fixed-cadence fresh rebuild by default (it costs O(history) per sampled step: O(history) on average).
DEFAULT_FULL_CHECK_EVERY = 0


def request_diff(expected: GenerateOptions, actual: GenerateOptions) -> str:
    """A unified diff of two requests' provider-neutral JSON (rebuilt first, about-to-send second)."""

    def lines(req: GenerateOptions) -> list[str]:
        return (
            orjson.dumps(
                request_to_json(req), default=codec.json_default, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS
            )
            .decode()
            .split("\n")
        )

    return "\n".join(
        difflib.unified_diff(lines(expected), lines(actual), "rebuilt-from-log", "about-to-send", lineterm="", n=2)
    )


@dataclass(slots=True)
class _Fold:
    """The companion's own fold of one session, and what its last check established."""

    session: Session
    read_to: int  # every event below this seq was read back from the store
    tentative: list[Envelope] = field(default_factory=list)  # folded before they were durable; confirmed next
    checks: int = 0
    fresh_at: int = 0  # the session's length at the last fresh rebuild
    generation: int = 0  # the surface generation the last check saw
    verified: int = 0  # messages of the live request verified equal at the last check...
    live_items: object = None  # ...in this live message list (MessageSequence backing list)
    own_items: object = None  # ...and this list of the companion's own
    bodies: dict[tuple[str, int], IncrementalBody] = field(default_factory=dict)
    request: GenerateOptions | None = None  # the companion's request at the last check
    live: GenerateOptions | None = None  # the request it was compared with
    boundary: int = -1
    fresh: bool = False  # the last check ran a fresh rebuild (its request needs no second one for the body)
    whole: bool = True  # built from a full read (by a check or by load) and not checked since: a fresh rebuild


class InvariantCompanion:
    """Checks loop requests against the companion's own fold of the durable log (see the module docstring).

    ``checked`` counts checks that ran, ``full_rebuilds`` the fresh rebuilds among them. ``max_sessions``
    folds are kept (least recently checked first out); an evicted session is reloaded on its next check.
    ``attachments`` resolves images when the companion serializes its own request.
    """

    def __init__(
        self,
        log: EventLog,
        *,
        attachments: AttachmentStore | None = None,
        on_violation: Callable[[], None] | None = None,
        full_check_every: int = DEFAULT_FULL_CHECK_EVERY,
        fresh_growth: float = DEFAULT_FRESH_GROWTH,
        max_sessions: int = 1024,
    ) -> None:
        if full_check_every < 0 or max_sessions < 1 or not (fresh_growth == 0 or fresh_growth > 1):
            raise ValueError("full_check_every must be >= 0, fresh_growth 0 (off) or > 1, and max_sessions >= 1")
        self.log = log
        self.attachments = attachments
        self.on_violation = on_violation
        self.full_check_every = full_check_every
        self.fresh_growth = fresh_growth
        self.max_sessions = max_sessions
        self.checked = 0
        self.full_rebuilds = 0
        self._folds: OrderedDict[str, _Fold] = OrderedDict()

    # ------------------------------------------------------------------ the checks

    async def check(
        self, session_id: str, boundary: int, request: GenerateOptions, pending: Sequence[Envelope] = ()
    ) -> None:
        """Compare a loop request with the companion's rebuild of the log prefix ``[0, boundary)``.

        ``pending`` are the envelopes at the end of that prefix that are not in the log yet (the step's
        opening, appended together with ``request/dispatch`` only if the checks pass).
        """
        if not is_loop_request(request):
            return  # one-shots (e.g. compaction's summarize call) are outside the invariant
        fold = await self._advance(session_id, boundary, pending)
        rebuilt = session_request(fold.session)
        fold.boundary, fold.request, fold.live = boundary, rebuilt, request
        fold.checks += 1
        self.checked += 1
        replaced = fold.session.surface_generation != fold.generation
        sample = (self.full_check_every > 0 and fold.checks % self.full_check_every == 0) or (
            self.fresh_growth > 0 and boundary >= self.fresh_growth * fold.fresh_at
        )
        fold.fresh = fold.checks == 1 or replaced or sample
        if fold.fresh and fold.whole:  # the fold itself was just built from a full read: it is the fresh rebuild
            self.full_rebuilds += 1
            fold.fresh_at = boundary
        elif fold.fresh:
            self.full_rebuilds += 1
            fold.fresh_at = boundary
            fresh = await self._fresh(session_id, boundary, pending)
            if not fresh.same_as(rebuilt):  # the companion's own incremental fold went wrong
                self._fail(
                    session_id,
                    f"session {session_id!r}: at seq {boundary} the invariant companion's incremental fold differs "
                    "from a fresh rebuild of the log",
                    fresh,
                    rebuilt,
                )
        if not self._same(fold, rebuilt, request, whole=fold.fresh):
            self._fail(
                session_id,
                f"session {session_id!r}: the request at seq {boundary} differs from its rebuild from the log; "
                "it was not sent",
                await self._fresh(session_id, boundary, pending),
                request,
            )
        fold.generation = fold.session.surface_generation
        fold.whole = False

    def load(self, session_id: str, events: Sequence[Envelope]) -> None:
        """Fold ``events`` — a session's first events as a read of the log returned them (a loop instance's
        open, whose own load checked their values) — as the companion's own fold of it (a
        :class:`~foldline.core.Session` of its own, every rule of the session checked again): the next check
        reads only what follows them, and counts this fold as its fresh rebuild."""
        session = Session(session_id)
        with collector_paused():
            session.extend(events, values_checked=True)
        self._folds[session_id] = _Fold(session, session.next_seq)
        self._folds.move_to_end(session_id)
        while len(self._folds) > self.max_sessions:
            self._folds.popitem(last=False)

    def check_body(self, session_id: str, boundary: int, digest: str, serializer: Serializer) -> None:
        """Compare the digest of the body about to be sent with the companion's own serialization.

        Call after :meth:`check` for the same boundary (a boundary it did not check raises).
        """
        fold = self._folds.get(session_id)
        if fold is None or fold.boundary != boundary or fold.request is None or fold.live is None:
            raise InvariantViolation(
                f"session {session_id!r}: the body at seq {boundary} was not preceded by a request check; "
                "check the request first",
                "",
            )
        key = (serializer.name, serializer.version)
        body = fold.bodies.get(key)
        cached = body is not None  # else the digest below is of a body encoded whole, with no cache yet
        if body is None:
            body = fold.bodies[key] = IncrementalBody(serializer, verify_cached_images=False)
        own, _ = body.digest(fold.request, self.attachments)
        if fold.fresh and cached:  # a fresh rebuild ran: serialize it from scratch too (no body cache vouches)
            full = codec.digest_bytes(serializer.serialize(fold.request, self.attachments))
            if full != own:
                self._fail(
                    session_id,
                    f"session {session_id!r}: at seq {boundary} the companion's incremental body ({own}) differs "
                    f"from a full serialization ({full})",
                    fold.request,
                    fold.live,
                )
        if own != digest:
            self._fail(
                session_id,
                f"session {session_id!r}: the body about to be sent at seq {boundary} has digest {digest}, but the "
                f"rebuild from the log serializes to {own}; it was not sent",
                fold.request,
                fold.live,
            )

    def forget(self, session_id: str) -> None:
        """Drop a session's fold (its next check reloads it from a full read)."""
        self._folds.pop(session_id, None)

    async def rebuild(self, session_id: str, upto_seq: int, pending: Sequence[Envelope] = ()) -> GenerateOptions:
        """A fresh rebuild of the request of ``[0, upto_seq)`` (durable events, then ``pending``), no fold kept."""
        return await self._fresh(session_id, upto_seq, pending)

    # ------------------------------------------------------------------ the fold

    async def _advance(self, session_id: str, boundary: int, pending: Sequence[Envelope]) -> _Fold:
        """The session's fold at ``boundary``: caught up from the store, then ``pending`` folded tentatively."""
        durable_to = pending[0].seq if pending else boundary
        fold = self._folds.get(session_id)
        if fold is not None and fold.read_to > durable_to:
            fold = None  # a check of an earlier boundary than the last one read: start over
        if fold is None:
            fold = _Fold(Session(session_id), 0)  # read whole below: a fresh rebuild
        else:
            self._folds.move_to_end(session_id)
        self._folds[session_id] = fold
        while len(self._folds) > self.max_sessions:
            self._folds.popitem(last=False)
        read = await self.log.read_async(session_id, fold.read_to, durable_to)
        if fold.tentative:
            confirmed = read[: len(fold.tentative)]
            if confirmed != fold.tentative:
                # The store does not hold what was folded tentatively (that step was never written, or the
                # store's read differs): this fold is no longer the log's. Start over from a full read.
                fold = self._folds[session_id] = _Fold(Session(session_id), 0)
                read = await self.log.read_async(session_id, 0, durable_to)
            else:
                read = read[len(fold.tentative) :]
                fold.tentative = []
        try:
            if len(read) > _PAUSE_FROM:
                with collector_paused():
                    fold.session.extend(read)
            else:
                fold.session.extend(read)
            fold.read_to = fold.session.next_seq
            if fold.read_to != durable_to:
                self.forget(session_id)
                self._violated()
                raise InvariantViolation(
                    f"session {session_id!r}: the log holds events up to seq {fold.read_to - 1}, not up to the "
                    f"boundary {boundary}",
                    "",
                )
            if pending:
                # Their values (a function of each event alone) are checked by the log before anything of the
                # step is written or sent; every rule that depends on the session is checked here.
                fold.session.extend(pending, values_checked=True)
                fold.tentative = list(pending)
        except ValidationError as exc:
            self.forget(session_id)
            self._violated()
            raise InvariantViolation(
                f"session {session_id!r}: the log prefix up to seq {boundary} does not fold: {exc}", ""
            ) from exc
        if fold.session.next_seq != boundary:
            self.forget(session_id)
            self._violated()
            raise InvariantViolation(
                f"session {session_id!r}: the rebuild reached seq {fold.session.next_seq}, not the boundary {boundary}",
                "",
            )
        return fold

    async def _fresh(self, session_id: str, boundary: int, pending: Sequence[Envelope]) -> GenerateOptions:
        durable_to = pending[0].seq if pending else boundary
        events = [*await self.log.read_async(session_id, 0, durable_to), *pending]
        with collector_paused():
            fresh = Session(session_id, events)
        if fresh.next_seq != boundary:
            self._violated()
            raise InvariantViolation(
                f"session {session_id!r}: the rebuild reached seq {fresh.next_seq}, not the boundary {boundary}", ""
            )
        return session_request(fresh)

    @staticmethod
    def _same(fold: _Fold, rebuilt: GenerateOptions, request: GenerateOptions, *, whole: bool) -> bool:
        """Header, count, and the messages since the last check — all of them when ``whole`` or when either
        message list is not the one the last check compared (a surface replace, another loop instance)."""
        if rebuilt.header != request.header or len(rebuilt.messages) != len(request.messages):
            return False
        live, own = request.messages, rebuilt.messages
        live_items = live.backing_list() if isinstance(live, MessageSequence) else None
        own_items = own.backing_list() if isinstance(own, MessageSequence) else None
        start = 0
        if not whole and live_items is not None and live_items is fold.live_items and own_items is fold.own_items:
            start = min(fold.verified, len(live))
        for i in range(start, len(live)):
            if live[i] != own[i]:
                return False
        fold.verified, fold.live_items, fold.own_items = len(live), live_items, own_items
        return True

    def _fail(self, session_id: str, message: str, expected: GenerateOptions, actual: GenerateOptions) -> None:
        self.forget(session_id)
        self._violated()
        raise InvariantViolation(message, request_diff(expected, actual))

    def _violated(self) -> None:
        if self.on_violation is not None:
            self.on_violation()
