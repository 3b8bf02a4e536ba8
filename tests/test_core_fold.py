"""The pure fold: a delta-applied fold equals the full fold of the same prefix, and messages round-trip."""

from __future__ import annotations

from foldline.adapters.memory_folds import MemoryFoldStore
from foldline.core.fold import decode_message, encode_message, fold_delta, fold_state
from foldline.core.projection import Session

from .factories import simple_log


def test_delta_applied_fold_equals_full_fold_at_every_split() -> None:
    log = simple_log(turns=3, steps=3)
    for split in range(1, len(log)):
        store = MemoryFoldStore()
        for part in (log[:split], log[split:]):
            delta = fold_delta(part, epoch=1)
            assert delta is not None
            assert store.apply("s", delta).status == "applied"
        assert store.get("s") == fold_state(Session("s", log), epoch=1)


def test_messages_round_trip_through_bytes() -> None:
    session = Session("s", simple_log(turns=2, steps=2))
    for message in session.derive_messages():
        assert decode_message(encode_message(message)) == message


def test_redelivery_and_gap_change_nothing() -> None:
    log = simple_log(turns=2, steps=2)
    store = MemoryFoldStore()
    first = fold_delta(log[:5], epoch=1)
    assert first is not None
    store.apply("s", first)
    before = store.get("s")
    assert store.apply("s", first).status == "duplicate"
    late = fold_delta(log[7:], epoch=1)
    assert late is not None
    result = store.apply("s", late)
    assert (result.status, result.expected_seq) == ("gap", 5)
    assert store.get("s") == before
