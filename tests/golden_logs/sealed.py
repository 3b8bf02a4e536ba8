"""Write the golden sealed logs of ``tests/fixtures/golden-logs/sealed/`` — once, then commit them.

    .venv/bin/python -m tests.golden_logs.sealed            # refuses when the fixtures exist
    .venv/bin/python -m tests.golden_logs.sealed --force    # rewrite them (a reviewed change only)

From the committed v0 logs, through the real code (the embedded log with its key store, ``foldline erase``):

* ``golden-anthropic.stored.jsonl`` — golden-anthropic as the embedded log stores it with encryption on: one
  canonical event per line, the content of each sealed (docs/FORMAT.md, "Sealed content") under the data key
  ``keys.json`` holds (a fixed key, so the file can be opened by anyone reading this);
* ``golden-anthropic.sealed.records`` — the same stored events as Kafka record values of the current Avro schema
  (length-prefixed, as ``v0/avro-*/``);
* ``golden-openai.erased.jsonl`` — the export of golden-openai after ``foldline erase`` destroyed its key: its
  structure, every content field a token of a destroyed key, and its ``session/erased`` event.

Sealing draws random nonces, so a rewrite gives other bytes: the tests read these files, they never compare them
with a new run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path

from foldline.adapters.avro import AvroCodec
from foldline.adapters.sealing import ContentSealer
from foldline.adapters.sqlite_keys import KEYS_NAME, SqliteKeyStore
from foldline.adapters.sqlite_log import SqliteEventLog
from foldline.config import Config, open_stores
from foldline.core.wire import decode_event, encode_event
from foldline.erasure import erase_sessions
from foldline.export import export_session
from foldline.ports.key_store import SessionKey

from .layout import GOLDEN_DIR, frame_records, jsonl_path

SEALED_DIR = GOLDEN_DIR.parent / "sealed"
STORED = SEALED_DIR / "golden-anthropic.stored.jsonl"
RECORDS = SEALED_DIR / "golden-anthropic.sealed.records"
ERASED = SEALED_DIR / "golden-openai.erased.jsonl"
KEYS = SEALED_DIR / "keys.json"
#: The fixed data key of golden-anthropic's stored form (a fixture: anyone may open it).
KEY = hashlib.sha256(b"foldline golden sealed key").digest()
KID = hashlib.sha256(b"foldline golden sealed kid").hexdigest()[:32]


def _events(session: str) -> list[bytes]:
    return jsonl_path(session).read_bytes().split(b"\n")[1:-1]


def generate() -> None:
    SEALED_DIR.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp)
        keys = SqliteKeyStore(data / KEYS_NAME)
        keys.create(SessionKey("golden-anthropic", KID, KEY, 0))
        sealer = ContentSealer(keys)
        log = SqliteEventLog(data, sealer=sealer)
        try:
            log.create("golden-anthropic", (decode_event(line) for line in _events("golden-anthropic")))
            stored = log.read_stored("golden-anthropic")
        finally:
            log.close()
            sealer.close()
        STORED.write_bytes(b"".join(encode_event(e) + b"\n" for e in stored))
        codec = AvroCodec()
        RECORDS.write_bytes(frame_records(codec.encode(e) for e in stored))
        KEYS.write_text(json.dumps({"golden-anthropic": {"kid": KID, "key": KEY.hex()}}, indent=2) + "\n")

        config = Config(data_dir=data / "erased")
        stores = open_stores(config)
        try:
            stores.log.create("golden-openai", (decode_event(line) for line in _events("golden-openai")))
            erase_sessions(stores, session="golden-openai", by="golden@generator", reason="a golden erased session")
            with ERASED.open("wb") as fp:
                export_session(stores.log, "golden-openai", fp)
        finally:
            stores.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--force", action="store_true", help="rewrite fixtures that exist")
    args = parser.parse_args(argv)
    if any(p.exists() for p in (STORED, RECORDS, ERASED, KEYS)) and not args.force:
        print(f"{SEALED_DIR} holds the golden sealed logs already; --force rewrites them", file=sys.stderr)
        return 1
    generate()
    print(f"wrote {SEALED_DIR}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
