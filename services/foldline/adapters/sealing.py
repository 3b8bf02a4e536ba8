"""Sealing and opening session content with AES-256-GCM, under per-session data keys from a key store.

The pure part — which fields are content, the associated data, the walk — is ``core/sealing.py``; this module
holds what the core may not: the cipher (``cryptography``'s ``AESGCM``), the randomness (nonces, key ids, keys)
and the key store with a per-process cache.

**Tokens.** A sealed value is ``base64url(nonce || ciphertext || tag)`` without padding: a fresh random 96-bit
nonce (``os.urandom``), the AES-256-GCM ciphertext of the value's bytes, the 16-byte tag; the associated data is
:func:`~foldline.core.sealing.associated_data`. Random nonces, not nonces derived from the seq: an append
retried after an unknown outcome seals the same seq again, possibly another value (a new answer) — a derived
nonce would then be reused with another plaintext, which breaks GCM (the XOR of the plaintexts leaks and tags
can be forged). A random nonce never depends on what is retried. With one key per session, the chance of a
repeated nonce stays below 2^-32 (NIST SP 800-38D) up to 2^32 sealed values in one session.

**Cache.** :class:`ContentSealer` keeps each session's key for at most ``cache_ttl_s`` seconds after it read
it; after that it asks the store again. So a process that held a key stops being able to read or write a
session at most ``cache_ttl_s`` after an erasure destroyed it (writers are stopped at once: the erasure takes
the session's writer lease). A destroyed key is remembered as destroyed (it cannot come back).

**Key wrapping.** A store given a key-encryption key (``FOLDLINE_KEY_ENCRYPTION_KEY``, 32 bytes) keeps each data
key wrapped: AES-256-GCM under that key, bound to the session id and key id (:func:`wrap_key`). Destroying a
wrapped key destroys it as surely; the wrapping keeps the keys unreadable to anyone who can read the store but
does not hold the key-encryption key.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from ..core import codec
from ..core.events import Envelope
from ..core.inbox import InboxEntry
from ..core.sealing import has_content, open_entry, open_event, seal_entry, seal_event
from ..errors import ConfigError, ContentErased, KeyMissing
from ..ports.key_store import KEY_BYTES, KeyStore, SessionKey, subject_digest

__all__ = [
    "NONCE_BYTES",
    "ContentSealer",
    "b64url",
    "unb64url",
    "SubjectConflict",
    "decrypt_token",
    "encrypt_token",
    "kek_from_text",
    "new_key",
    "unwrap_key",
    "wrap_key",
]

NONCE_BYTES = 12
TAG_BYTES = 16
#: threads of one sealer that make new sessions' keys ahead of their first write
#: (:meth:`ContentSealer.make_ahead`).
#: A key-store request mostly waits on the store, so a pool of its own serves a burst of new sessions without
#: taking the log's worker threads, and bounds how many threads take the interpreter lock in turn with the event
#: loop. 32, measured with 1,000 sessions arriving in 2 s (docs/DISPATCHER.md): with 8 the first writes waited
#: for their keys (step p99 4.7 s), 16, 32 and 64 were alike within the runs' spread (3.2 to 3.7 s).
WARM_THREADS = 32


def b64url(raw: bytes) -> str:
    """base64url of ``raw`` without padding."""
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


_FROM_URLSAFE = bytes.maketrans(b"-_", b"+/")


def unb64url(text: str) -> bytes | None:
    """The bytes of base64url text (padding optional); ``None`` when it is not base64url."""
    if "+" in text or "/" in text:  # the standard alphabet's letters: not base64url
        return None
    try:
        raw = text.encode("ascii").translate(_FROM_URLSAFE) + b"=" * (-len(text) % 4)
        return binascii.a2b_base64(raw, strict_mode=True)
    except (binascii.Error, ValueError):
        return None


def encrypt_token(cipher: AESGCM, plaintext: bytes, aad: bytes) -> str:
    """The token of ``plaintext``: base64url (no padding) of a random nonce, the ciphertext and the tag."""
    nonce = os.urandom(NONCE_BYTES)
    return b64url(nonce + cipher.encrypt(nonce, plaintext, aad))


def decrypt_token(cipher: AESGCM, token: str, aad: bytes) -> bytes | None:
    """The plaintext of ``token``, or ``None`` when it is not one (bad text, or it does not authenticate)."""
    raw = unb64url(token)
    if raw is None or len(raw) < NONCE_BYTES + TAG_BYTES:
        return None
    try:
        return cipher.decrypt(raw[:NONCE_BYTES], raw[NONCE_BYTES:], aad)
    except InvalidTag:
        return None


def new_key(session_id: str, now_ms: int, subject: str | None = None) -> SessionKey:
    """A fresh data key for ``session_id``: a random 128-bit id and 32 random bytes."""
    return SessionKey(session_id, secrets.token_hex(16), AESGCM.generate_key(bit_length=256), now_ms, subject)


def kek_from_text(text: str) -> bytes:
    """The key-encryption key of ``FOLDLINE_KEY_ENCRYPTION_KEY``: 32 bytes as base64 (standard or url-safe) or
    64 hex digits; ConfigError otherwise."""
    text = text.strip()
    raw: bytes | None = None
    if len(text) == 64 and all(c in "0123456789abcdefABCDEF" for c in text):
        raw = bytes.fromhex(text)
    else:
        raw = unb64url(text.replace("+", "-").replace("/", "_").rstrip("="))
    if raw is None or len(raw) != KEY_BYTES:
        raise ConfigError(
            "FOLDLINE_KEY_ENCRYPTION_KEY must be 32 random bytes, as base64 or 64 hex digits "
            '(e.g. `python -c "import secrets; print(secrets.token_hex(32))"`)'
        )
    return raw


def _wrap_aad(session_id: str, kid: str) -> bytes:
    return codec.canonical_json(["foldline-key", 1, session_id, kid])


def wrap_key(kek: bytes, key: SessionKey) -> str:
    """``key``'s bytes wrapped with the key-encryption key (a token as above, bound to session and key id)."""
    assert key.material is not None
    return encrypt_token(AESGCM(kek), key.material, _wrap_aad(key.session_id, key.kid))


def unwrap_key(kek: bytes, session_id: str, kid: str, wrapped: str, where: str) -> bytes:
    """The bytes of a wrapped key; ConfigError when the key-encryption key is not the one it was wrapped with."""
    raw = decrypt_token(AESGCM(kek), wrapped, _wrap_aad(session_id, kid))
    if raw is None or len(raw) != KEY_BYTES:
        raise ConfigError(
            f"{where}: the data key of session {session_id!r} does not unwrap with the configured "
            "FOLDLINE_KEY_ENCRYPTION_KEY; set the key-encryption key the store was written with"
        )
    return raw


class SubjectConflict(ValueError):
    """A session bound to one subject was asked to belong to another (raised as ConfigError by callers)."""


class _Held:
    __slots__ = ("cipher", "fetched", "key")

    def __init__(self, key: SessionKey, fetched: float) -> None:
        self.key = key
        self.fetched = fetched
        self.cipher = AESGCM(key.material) if key.material is not None else None


class ContentSealer:
    """Seals the content of a session's events on the way into a log and opens it on the way out.

    ``seal_new=False`` (encryption off) writes new events as they are, and still opens sealed ones. Keys are
    created on a session's first sealed event, cached for ``cache_ttl_s`` (see the module docstring).
    Thread-safe.
    """

    def __init__(
        self,
        keys: KeyStore,
        *,
        seal_new: bool = True,
        cache_ttl_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        wall_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
    ) -> None:
        self.keys = keys
        self.seal_new = seal_new
        self.cache_ttl_s = cache_ttl_s
        self._clock = clock
        self._wall_ms = wall_ms
        self._lock = threading.Lock()
        self._held: dict[str, _Held] = {}
        self._making: dict[str, Future[None]] = {}  # keys being made ahead of a first write (make_ahead)
        self._warmer: ThreadPoolExecutor | None = None
        self._closed = False

    # -------------------------------------------------------------- keys

    def _key(self, session_id: str, *, create: bool, first: bool = False) -> _Held | None:
        """The session's key, from the cache or the store; ``create``: made when the store has none. ``first``:
        the events to seal open the session, so its key is most likely not there yet — the store is asked to
        create one outright (one create-only write, not a read then the write); a key that is there already (the
        session bound to a subject, an append retried) is what the create answers. A key being made
        (:meth:`make_ahead`) is waited for first; if making it failed, the store is asked again here, and what is
        wrong is raised from here."""
        with self._lock:
            making = self._making.get(session_id)
        if making is not None:
            with contextlib.suppress(Exception):  # a failure: asked again below, which raises the store's error
                making.result()
        return self._lookup(session_id, create=create, first=first)

    def _lookup(self, session_id: str, *, create: bool, first: bool) -> _Held | None:
        now = self._clock()
        with self._lock:
            held = self._held.get(session_id)
        if held is not None and (held.cipher is None or now - held.fetched < self.cache_ttl_s):
            return held
        key = None if create and first else self.keys.get(session_id)
        if key is None and create:
            key = self.keys.create(new_key(session_id, self._wall_ms()))
        if key is None:
            with self._lock:
                self._held.pop(session_id, None)
            return None
        held = _Held(key, now)
        with self._lock:
            self._held[session_id] = held
            if len(self._held) > 100_000:  # bounded: the oldest entries go (they are re-read when needed)
                for sid in list(self._held)[:10_000]:
                    del self._held[sid]
        return held

    def make_ahead(self, session_id: str) -> None:
        """Start making a new session's key now, on one of this sealer's threads (:data:`WARM_THREADS`), so that
        the session's first sealed write finds it made: the key store's request then overlaps what the session
        does before that write (its first request's hand-over) instead of delaying the write. Call it once the
        session's subject, if any, is bound (:meth:`bind`): the key is made as :meth:`seal` would make it.

        Nothing happens when encryption is off, when the key is held or being made already, or after
        :meth:`close`. A failure is not raised here: the first write asks the store itself and raises what is
        wrong."""
        if not self.seal_new:
            return
        with self._lock:
            if self._closed or session_id in self._making or self._fresh(self._held.get(session_id)):
                return
            if self._warmer is None:
                self._warmer = ThreadPoolExecutor(WARM_THREADS, thread_name_prefix="foldline-keys")
            future: Future[None] = self._warmer.submit(self._make, session_id)
            self._making[session_id] = future
        future.add_done_callback(lambda done: self._made(session_id, done))

    def making(self, session_id: str) -> Future[None] | None:
        """The making of the session's key that :meth:`make_ahead` started, while it is under way (``None``
        otherwise): an asyncio caller awaits it (``asyncio.wrap_future``) rather than hold a thread while it waits."""
        with self._lock:
            return self._making.get(session_id)

    def _make(self, session_id: str) -> None:
        self._lookup(session_id, create=True, first=True)

    def _made(self, session_id: str, future: Future[None]) -> None:
        with self._lock:
            if self._making.get(session_id) is future:
                del self._making[session_id]

    def _fresh(self, held: _Held | None) -> bool:
        return held is not None and (held.cipher is None or self._clock() - held.fetched < self.cache_ttl_s)

    def bind(self, session_id: str, subject: str) -> None:
        """Make ``session_id``'s content part of ``subject``'s erasure scope: its key is created now, naming the
        subject. ConfigError when the session already has a key of another (or no) subject."""
        digest = subject_digest(subject)
        key = self.keys.get(session_id) or self.keys.create(new_key(session_id, self._wall_ms(), digest))
        if key.subject != digest:
            raise ConfigError(
                f"session {session_id!r} already has a data key "
                f"{'of another subject' if key.subject else 'of its own (no subject)'}; a session belongs to the "
                "subject it was bound to when its first event was sealed"
            )
        if key.erased:
            raise ContentErased(session_id)

    def inherit(self, child_id: str, parent_id: str) -> None:
        """Put a fork child in its parent's subject (when the parent has one): erasing the subject erases both."""
        parent = self.keys.get(parent_id)
        if parent is None or parent.subject is None:
            return
        key = self.keys.get(child_id) or self.keys.create(new_key(child_id, self._wall_ms(), parent.subject))
        if key.subject != parent.subject:
            raise ConfigError(f"session {child_id!r} already has a data key outside its parent's subject")

    def erased(self, session_id: str) -> bool:
        """Whether the session's key was destroyed, asked of the store now (not the cache)."""
        key = self.keys.get(session_id)
        if key is not None and key.erased:
            with self._lock:
                self._held[session_id] = _Held(key, self._clock())
            return True
        return False

    def cached(self, session_id: str) -> bool:
        """Whether this process holds the session's key (or knows it destroyed), fresh: no store request needed."""
        with self._lock:
            held = self._held.get(session_id)
        return self._fresh(held)

    def forget(self, session_id: str) -> None:
        """Drop the session's key from this process's cache (the erasing process, at once)."""
        with self._lock:
            self._held.pop(session_id, None)

    # -------------------------------------------------------------- seal / open

    def seal(self, session_id: str, events: Sequence[Envelope], *, always: bool = False) -> list[Envelope]:
        """``events`` with their content sealed under the session's key (created on first use); as they are when
        encryption is off (``always``: sealed even then). :class:`~foldline.errors.ContentErased` when the
        session was erased."""
        if not (self.seal_new or always) or not any(e.sealed is None and has_content(type(e.data)) for e in events):
            return list(events)  # nothing to seal: no key is needed (structure-only events, an erasure's mark)
        held = self._key(session_id, create=True, first=events[0].seq == 0)
        assert held is not None
        cipher = held.cipher
        if cipher is None:
            raise ContentErased(session_id, "nothing more can be appended to it")
        kid = held.key.kid

        def encrypt(plaintext: bytes, aad: bytes) -> str:
            return encrypt_token(cipher, plaintext, aad)

        # an event sealed already (an archived one, restored) is stored as it is
        return [e if e.sealed is not None else seal_event(e, session_id, kid, encrypt) for e in events]

    def open(self, session_id: str, events: Iterable[Envelope]) -> list[Envelope]:
        """``events`` with their content opened. An event whose key was destroyed stays sealed (its
        ``sealed`` marker set: structure only); a key that is not there, or not the one an event names, is
        :class:`~foldline.errors.KeyMissing`; content that does not authenticate is ContentCorrupt."""
        out = list(events)
        held: _Held | None = None
        for i, env in enumerate(out):
            seal = env.sealed
            if seal is None:
                continue
            if held is None:
                held = self._key(session_id, create=False)
                if held is None:
                    raise KeyMissing(seal.kid, f"session {session_id!r} event seq {env.seq}")
            if held.key.kid != seal.kid:
                raise KeyMissing(
                    seal.kid, f"session {session_id!r} event seq {env.seq} (the store's key is {held.key.kid})"
                )
            cipher = held.cipher
            if cipher is None:
                continue  # erased: the event keeps its tokens

            def decrypt(token: str, aad: bytes, cipher: AESGCM = cipher) -> bytes | None:
                return decrypt_token(cipher, token, aad)

            out[i] = open_event(env, session_id, decrypt)
        return out

    def seal_entry(self, session_id: str, entry: InboxEntry) -> InboxEntry:
        """``entry`` with its content sealed under the session's key (created on first use), for a session's
        inbox; as it is when encryption is off. :class:`~foldline.errors.ContentErased` when the session was
        erased, encryption on or off: nothing more may be entered into it."""
        if not self.seal_new:
            if self.erased(session_id):
                raise ContentErased(session_id, "nothing can be entered into its inbox")
            return entry
        held = self._key(session_id, create=True)
        assert held is not None
        cipher = held.cipher
        if cipher is None:
            raise ContentErased(session_id, "nothing can be entered into its inbox")

        def encrypt(plaintext: bytes, aad: bytes) -> str:
            return encrypt_token(cipher, plaintext, aad)

        return entry if entry.sealed is not None else seal_entry(entry, session_id, held.key.kid, encrypt)

    def open_entries(self, session_id: str, entries: Iterable[InboxEntry]) -> list[InboxEntry]:
        """Inbox ``entries`` with their content opened. A sealed entry of an erased session is
        :class:`~foldline.errors.ContentErased` (an entry is only ever read to be taken into the log); a key
        that is not there, or not the one the entry names, :class:`~foldline.errors.KeyMissing`."""
        out = list(entries)
        for i, entry in enumerate(out):
            seal = entry.sealed
            if seal is None:
                continue
            where = f"session {session_id!r} inbox entry {entry.id!r}"
            held = self._key(session_id, create=False)
            if held is None:
                raise KeyMissing(seal.kid, where)
            if held.key.kid != seal.kid:
                raise KeyMissing(seal.kid, f"{where} (the store's key is {held.key.kid})")
            cipher = held.cipher
            if cipher is None:
                raise ContentErased(session_id, f"its inbox entry {entry.id!r} cannot be taken")

            def decrypt(token: str, aad: bytes, cipher: AESGCM = cipher) -> bytes | None:
                return decrypt_token(cipher, token, aad)

            out[i] = open_entry(entry, session_id, decrypt)
        return out

    def close(self) -> None:
        """Stop making keys ahead (what is under way finishes) and close the key store (once; the sealer's owner
        calls it)."""
        with self._lock:
            closed, self._closed = self._closed, True
            warmer, self._warmer = self._warmer, None
        if closed:
            return
        if warmer is not None:
            warmer.shutdown(wait=True, cancel_futures=True)
        self.keys.close()
