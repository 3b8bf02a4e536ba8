"""Removing a refused turn before the next one, where the provider asks for it.

After a turn the model refused, a provider whose documentation asks for the refused turn to be removed
before continuing (Anthropic) gets it removed: the next step opens with a ``user/message`` (source
``refusal-reset``) that replaces the refused turn's entries on the surface — logged, so every later request
is still rebuilt from the log.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..core.content import TextBlock
from ..core.events import Envelope, ReplaceOp, TurnEnd, TurnStart, UserMessage
from ..core.projection import Session

__all__ = ["REFUSAL_RESET_TEXT", "RESET_AFTER_REFUSAL", "refusal_reset", "refused_turn"]

#: The text that stands in for a refused turn once it is removed (see docs/TRANSPORT.md).
REFUSAL_RESET_TEXT = "[An earlier turn was removed here because the model declined to answer it.]"
#: Providers whose documentation asks for a refused turn to be removed or rephrased before continuing.
RESET_AFTER_REFUSAL = frozenset({"anthropic"})


def refusal_reset(session: Session, refused: tuple[int, int], seq: int) -> UserMessage | None:
    """The ``user/message`` (to be appended at ``seq``, right after the next ``step/start``) that hides the
    surface entries of the refused turn ``refused`` (its first and last seq), where the session's provider
    asks for it; ``None`` where it does not, or nothing of that turn is on the surface."""
    folded = session.header()
    if folded is None or folded.config.provider not in RESET_AFTER_REFUSAL:
        return None
    first, last = refused
    surface = session.rules.surface
    hidden = [pos for pos, node in enumerate(surface) if first <= node.seq <= last]
    if not hidden:
        return None
    start, end = hidden[0], hidden[-1]
    seqs = tuple(node.seq for node in surface[start : end + 1])
    return UserMessage(f"u{seq}", (TextBlock(REFUSAL_RESET_TEXT),), "refusal-reset", ReplaceOp(start, end), seqs)


def refused_turn(events: Sequence[Envelope]) -> tuple[int, int] | None:
    """The seqs (turn/start .. turn/end) of the log's last turn when it ended in a refusal not removed since."""
    end: int | None = None
    for e in reversed(events):
        data = e.data
        if isinstance(data, UserMessage) and data.source == "refusal-reset":
            return None
        if isinstance(data, TurnEnd):
            if end is not None:
                return None
            if data.reason != "refusal":
                return None
            end = e.seq
        elif isinstance(data, TurnStart) and end is not None:
            return (e.seq, end)
    return None
