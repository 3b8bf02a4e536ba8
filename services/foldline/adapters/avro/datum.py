"""Envelope <-> fastavro datum: the record each event is in the event schema, and the envelope of a decoded datum.

Both directions follow the Avro layout derived from the record definitions (:mod:`.layout`). A decoded
datum goes back to the logged JSON form and through :func:`foldline.core.wire.envelope_from_json`, so every
rule of the core is checked on decode.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...core import codec
from ...core.events import ALWAYS_IGNORABLE, Envelope, UnknownEvent
from ...core.wire import data_to_json, envelope_from_json
from ...errors import AvroDecodeError
from .layout import NAMESPACE, datum_encoder, datum_to_json

__all__ = ["avro_to_envelope", "envelope_to_avro"]

_UNKNOWN = NAMESPACE + "UnknownEvent"


def envelope_to_avro(env: Envelope) -> dict[str, Any]:
    """The Avro datum of an envelope (fastavro tuple notation selects each union branch)."""
    data = env.data
    if isinstance(data, UnknownEvent) or data.TYPE in ALWAYS_IGNORABLE:
        # always ignorable (docs/SCHEMAS.md rule 4): they travel as UnknownEvent, and readers that know
        # the type decode its JSON data into the event again
        branch: tuple[str, dict[str, Any]] = (_UNKNOWN, {"json": codec.canonical_json(data_to_json(data)).decode()})
    else:
        branch = datum_encoder(type(data))(data)
    seal = env.sealed
    return {
        "type": env.type,
        "seq": env.seq,
        "time": env.time,
        "ignorable": env.ignorable,
        "data": branch,
        "sealed": None if seal is None else {"kid": seal.kid, "v": seal.v},
    }


def avro_to_envelope(datum: Mapping[str, Any]) -> Envelope:
    """Rebuild the envelope from a decoded datum (``return_record_name`` form); every core rule applies."""
    seq = datum.get("seq")
    try:
        etype = datum["type"]
        name, data = datum["data"]
        try:
            value_data = datum_to_json(etype, name, data)
        except TypeError as exc:
            raise AvroDecodeError(str(exc), seq=seq if isinstance(seq, int) else None) from exc
        value: dict[str, Any] = {"type": etype, "seq": datum["seq"], "time": datum["time"], "data": value_data}
    except (KeyError, ValueError) as exc:
        raise AvroDecodeError(f"malformed event datum: {exc!r}", seq=seq if isinstance(seq, int) else None) from exc
    if datum.get("ignorable"):
        value["ignorable"] = True
    seal = datum.get("sealed")
    if seal is not None:
        value["sealed"] = {"kid": seal.get("kid"), "v": seal.get("v")} if isinstance(seal, Mapping) else seal
    return envelope_from_json(value)
