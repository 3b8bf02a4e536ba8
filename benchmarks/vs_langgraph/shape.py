"""The step both sides of the LangGraph comparison run: a ~200-character question, a ~400-character answer.

Standard library only: this module is imported by foldline's session worker and by the LangGraph side,
which runs in its own virtual environment without foldline installed.
"""

from __future__ import annotations

__all__ = ["ANSWER_CHARS", "DEFAULT_TAIL", "QUESTION_CHARS", "answer_text", "question_text"]

QUESTION_CHARS = 200
ANSWER_CHARS = 400
#: Per-step figures are the p50 of the last this-many steps before a given session length.
DEFAULT_TAIL = 40

_WORDS = (
    *("partition", "offset", "replica", "leader", "broker", "session", "header", "digest", "prefix", "cache"),
    *("fold", "event", "append", "replay", "verify", "request", "answer", "tool", "schema", "record", "commit"),
    *("epoch", "fence", "snapshot", "archive", "tail", "budget", "compaction"),
)


def _text(n: int, salt: int, chars: int) -> str:
    """Deterministic prose of exactly ``chars`` characters, different for every ``n`` (no two steps alike)."""
    words: list[str] = [f"#{n}:"]
    length = len(words[0])
    i = n * 7 + salt
    while length < chars:
        words.append(_WORDS[i % len(_WORDS)])
        length += len(words[-1]) + 1
        i = i * 1103515245 + 12345 & 0x7FFFFFFF
    return " ".join(words)[:chars]


def question_text(n: int) -> str:
    """The user message of step ``n`` (200 characters)."""
    return _text(n, 1, QUESTION_CHARS)


def answer_text(n: int) -> str:
    """The model's answer at step ``n`` (400 characters)."""
    return _text(n, 2, ANSWER_CHARS)
