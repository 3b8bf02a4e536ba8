"""Process-local identity of loop requests.

The loop marks each request it builds; observers (the invariant companion, metrics) ask
:func:`is_loop_request` to tell conversation work from one-shots such as compaction's summarize
call, whatever their shape or session. Identity, not equality: a one-shot that happens to look like a
loop request is still a one-shot.
"""

from __future__ import annotations

import weakref

from ..core.request import GenerateOptions

__all__ = ["is_loop_request", "mark_loop_request"]

_LOOP_REQUESTS: weakref.WeakValueDictionary[int, GenerateOptions] = weakref.WeakValueDictionary()


def mark_loop_request(request: GenerateOptions) -> GenerateOptions:
    _LOOP_REQUESTS[id(request)] = request
    return request


def is_loop_request(request: GenerateOptions) -> bool:
    return _LOOP_REQUESTS.get(id(request)) is request
