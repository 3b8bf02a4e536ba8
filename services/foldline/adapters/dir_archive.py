"""The archive store in a directory (the embedded backend's backup, or any mounted filesystem).

Keys are paths under the root. Every write goes to a temporary file in the target's directory, is
fsynced, and is then put in place; the directory is fsynced after it, so a crash leaves the old object,
the new one, or (for a create) none — never a partial file under a key.

* :meth:`DirectoryArchiveStore.create` links the temporary file to the key (``link`` fails if the key
  exists: create-only, atomically, between processes too);
* :meth:`DirectoryArchiveStore.replace` holds an exclusive ``flock`` on ``<key>.lock`` while it compares
  the current version (the sha256 of the bytes) with the expected one and renames the new file in.

Temporary and lock files start with a dot and are never listed. OS errors are translated here: a
full disk, missing permissions, a vanished directory are :class:`~foldline.errors.StoreUnavailable`.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from ..errors import ArchiveConflict, StoreUnavailable
from ..ports.archive import ArchiveStore, StoredObject

__all__ = ["DirectoryArchiveStore"]


def _version(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class DirectoryArchiveStore(ArchiveStore):
    """The archive under ``root``, which is created when missing — unless ``create`` is false (a check of the
    archive, which must find it where it is configured): a missing root is then StoreUnavailable."""

    def __init__(self, root: str | Path, *, create: bool = True) -> None:
        self.root = Path(root)
        if not create:
            if not self.root.is_dir():
                what = "is not a directory" if self.root.exists() else "does not exist"
                raise StoreUnavailable(
                    f"archive directory {self.root} {what}: nothing has been archived there; check "
                    "FOLDLINE_ARCHIVE_DIR (an archiver creates it when it starts)"
                )
            return
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreUnavailable(f"archive directory {self.root} cannot be created: {exc}") from exc

    def where(self, key: str) -> str:
        return str(self.root.joinpath(*(part for part in key.split("/") if part)))

    def ping(self) -> None:
        if not self.root.is_dir():
            raise StoreUnavailable(f"archive directory {self.root} is gone (unmounted, deleted or renamed)")

    def _path(self, key: str) -> Path:
        parts = key.split("/")
        if not key or any(p in ("", ".", "..") or p.startswith(".") for p in parts):
            raise ValueError(f"not an archive key: {key!r}")
        return self.root.joinpath(*parts)

    # -------------------------------------------------------------- writes

    def create(self, key: str, data: bytes) -> bool:
        path = self._path(key)
        try:
            tmp = self._write_temp(path, data)
            try:
                os.link(tmp, path)
            except FileExistsError:
                return False
            finally:
                os.unlink(tmp)
            _fsync_dir(path.parent)
            return True
        except OSError as exc:
            raise StoreUnavailable(f"archive {path}: writing failed: {exc}") from exc

    def replace(self, key: str, data: bytes, expected: str | None) -> str:
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path.parent / f".{path.name}.lock", "a+b") as lock:
                fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
                try:
                    current = _version(path.read_bytes()) if path.exists() else None
                    if current != expected:
                        raise ArchiveConflict(str(path), "another writer changed it since it was read")
                    tmp = self._write_temp(path, data)
                    os.replace(tmp, path)
                    _fsync_dir(path.parent)
                finally:
                    fcntl.flock(lock.fileno(), fcntl.LOCK_UN)
        except OSError as exc:
            raise StoreUnavailable(f"archive {path}: writing failed: {exc}") from exc
        return _version(data)

    def _write_temp(self, path: Path, data: bytes) -> str:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return tmp

    def delete(self, key: str) -> None:
        path = self._path(key)
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            raise StoreUnavailable(f"archive {path}: deleting failed: {exc}") from exc

    # -------------------------------------------------------------- reads

    def read(self, key: str) -> StoredObject | None:
        path = self._path(key)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StoreUnavailable(f"archive {path}: reading failed: {exc}") from exc
        return StoredObject(data, _version(data))

    def keys(self, prefix: str = "", start_after: str = "") -> Iterator[str]:
        found: list[str] = []
        try:
            for dirpath, dirnames, filenames in os.walk(self.root):
                dirnames[:] = [d for d in dirnames if not d.startswith(".")]
                rel = Path(dirpath).relative_to(self.root).as_posix()
                base = "" if rel == "." else rel + "/"
                if not (base.startswith(prefix) or prefix.startswith(base)):
                    dirnames.clear()
                    continue
                found.extend(
                    key
                    for name in filenames
                    if not name.startswith(".") and (key := base + name).startswith(prefix) and key > start_after
                )
        except OSError as exc:
            raise StoreUnavailable(f"archive directory {self.root}: listing failed: {exc}") from exc
        yield from sorted(found)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
