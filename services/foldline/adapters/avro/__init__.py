"""Session events as Avro: the schemas in ``schemas/``, and Envelope <-> self-describing Avro bytes.

==============  =========================================================================================
module          holds
==============  =========================================================================================
``layout``      the Avro layout derived from the record definitions: the schema, datum encoders, datum -> JSON
``schemas``     the ``.avsc`` files, CRC-64-AVRO fingerprints, every writer schema this process can read
``datum``       Envelope <-> fastavro datum (the record of each event, and the envelope of a decoded one)
``direct``      the text of the binary decoder of the current schema, generated from the layout
``decoding``    that decoder: its compiled build when it is of the current definitions, else its text
``codec``       :class:`AvroCodec`: single-object encoding, or Confluent framing with a schema registry
==============  =========================================================================================

Two framings, both self-describing:

* **Avro single-object encoding** (default): ``C3 01`` + the 8-byte little-endian CRC-64-AVRO
  fingerprint of the writer schema's parsing canonical form + the Avro binary body.
* **Confluent wire framing** (when a schema registry is configured): ``00`` + the 4-byte big-endian
  schema id the registry assigned + the body.

Both directions follow the layout derived from the record definitions, and a decoded datum goes back through
:func:`foldline.core.wire.envelope_from_json`, so the Avro form carries exactly the logged field names and
every shape rule of the core is checked on decode; encoding first holds the event to the
values every backend can hold (:func:`foldline.core.validation.check_values`). Every failure is typed:
:class:`~foldline.errors.AvroDecodeError` (bytes that are not a record of ours) and
:class:`~foldline.errors.UnknownSchemaError` (a fingerprint / schema id we have no writer schema for),
both :class:`~foldline.errors.FormatError`.

Schemas are files. In a wheel they ship as ``foldline/_schemas``; in a source checkout (editable
install) they are read from the repository's ``schemas/``. Superseded versions of a schema are kept in
``schemas/previous/`` so records written with them stay decodable (see docs/SCHEMAS.md).
"""

from __future__ import annotations

from .codec import AvroCodec, SchemaRegistry
from .datum import avro_to_envelope, envelope_to_avro
from .schemas import (
    CONFLUENT_MAGIC,
    EVENT_SCHEMA_NAME,
    SINGLE_OBJECT_MAGIC,
    crc64_avro,
    load_schema_json,
    schema_dir,
    writer_schema_documents,
    writer_schemas,
)

__all__ = [
    "CONFLUENT_MAGIC",
    "EVENT_SCHEMA_NAME",
    "SINGLE_OBJECT_MAGIC",
    "AvroCodec",
    "SchemaRegistry",
    "avro_to_envelope",
    "crc64_avro",
    "envelope_to_avro",
    "load_schema_json",
    "schema_dir",
    "writer_schema_documents",
    "writer_schemas",
]
