"""An in-process key store: the reference behaviour of the port, for fast tests and in-memory logs."""

from __future__ import annotations

import threading

from ..ports.key_store import ErasureRecord, KeyStore, SessionKey, TrackedExport

__all__ = ["MemoryKeyStore"]


class MemoryKeyStore(KeyStore):
    where = "the in-process key store"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._keys: dict[str, SessionKey] = {}
        self._erasures: dict[str, ErasureRecord] = {}
        self._exports: dict[str, list[TrackedExport]] = {}

    def create(self, key: SessionKey) -> SessionKey:
        with self._lock:
            return self._keys.setdefault(key.session_id, key)

    def get(self, session_id: str) -> SessionKey | None:
        with self._lock:
            return self._keys.get(session_id)

    def destroy(self, session_id: str, erasure: str, now_ms: int) -> SessionKey | None:
        with self._lock:
            key = self._keys.get(session_id)
            if key is None:
                return None
            if not key.erased:
                key = self._keys[session_id] = key.destroyed(erasure, now_ms)
            return key

    def sessions_of_subject(self, subject: str) -> list[str]:
        with self._lock:
            return sorted(sid for sid, k in self._keys.items() if k.subject == subject)

    def put_erasure(self, record: ErasureRecord) -> None:
        with self._lock:
            self._erasures[record.erasure_id] = record

    def erasures(self) -> list[ErasureRecord]:
        with self._lock:
            return sorted(self._erasures.values(), key=lambda r: (r.requested_ms, r.erasure_id))

    def track_export(self, export: TrackedExport) -> None:
        with self._lock:
            found = self._exports.setdefault(export.session_id, [])
            found[:] = [e for e in found if (e.host, e.path) != (export.host, export.path)] + [export]

    def exports(self, session_id: str) -> list[TrackedExport]:
        with self._lock:
            return sorted(self._exports.get(session_id, ()), key=lambda e: (e.host, e.path))

    def forget_export(self, export: TrackedExport) -> None:
        with self._lock:
            found = self._exports.get(export.session_id, [])
            found[:] = [e for e in found if (e.host, e.path) != (export.host, export.path)]
