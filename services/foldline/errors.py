"""The one error tree of foldline.

Every failure a caller can act on is a subclass of :class:`FoldlineError`, defined here and nowhere else
(a test holds this tree, the classes below and every ``raise`` in the package together). Adapters
translate driver exceptions (sqlite3, confluent-kafka, botocore, redis, httpx) at the edge with
``raise Mapped(...) from exc``; callers never see a vendor exception.

The first question a caller asks is whether to try again. :attr:`FoldlineError.transient` answers it: may
the same call succeed if it is made again after a wait? The tree fixes the answer per class — everything
under :class:`TransientError` yes, everything under :class:`PermanentError` no — and the three families whose
members differ (attachments, dispatch, providers) mark each member: ``[transient]`` or ``[permanent]`` (it
also derives from that half), or ``[per error]`` where the error itself decides (a provider's status and
retry headers, a connection that broke before or after the first answer byte, the kind of error a
dispatcher process reported). A family's own class is ``[per class]``: permanent when raised as it is.

    FoldlineError                       [per class] the root; .transient says whether to try again
    ├── TransientError                  the same call may succeed after a wait (an outage, a timeout)
    │   ├── StoreUnavailable            a backing store (SQLite, Kafka, Redis, S3) failed or did not answer in time
    │   │   └── StoreBusy               another writer holds the store's lock past the bounded wait
    │   ├── FoldTimeout                 a fold did not reach the awaited seq within the bounded wait
    │   └── ToolServerUnavailable       a tool server (MCP) could not be started or reached, or stopped answering
    ├── PermanentError                  the same call fails again: change the input, configuration or state first
    │   ├── ValidationError             an event or batch breaks a log rule (names seq and rule)
    │   │   ├── FormatError             bytes/JSON/Avro that do not decode into an event
    │   │   │   ├── AvroDecodeError     bytes that are not a well-formed foldline Avro record
    │   │   │   └── UnknownSchemaError  a record names a writer schema this process does not know
    │   │   └── EventTooLarge           an event over the size every backend holds (core/limits.py)
    │   ├── ConflictError               append with a stale expected_seq; nothing was written (re-read, then append)
    │   ├── FencedError                 append by a writer whose epoch was superseded; nothing written
    │   ├── SessionNotFound             no such session in the log
    │   ├── SessionExists               a session id that must be new already has events
    │   ├── ImportFailed                an export file has a bad line (names the line)
    │   ├── InvariantViolation          a request differs from its rebuild from the log; not sent
    │   ├── RequestTooLarge             a request body over the size limit (core/limits.py); not logged, not sent
    │   ├── ReconstructionError         a logged request cannot be rebuilt (e.g. unknown serializer)
    │   │   └── MissingHeader           a request boundary with no request/header before it
    │   ├── ConfigError                 configuration names something that does not exist
    │   │   ├── AuthenticationFailed    a server refused the configured credentials or TLS handshake
    │   │   ├── MissingExtra            the configuration needs an optional part of foldline that is not installed
    │   │   ├── UnsafeRetention         a topic setting could delete log events not yet archived (names setting and fix)
    │   │   ├── UnsupportedSetting      a call-config setting the chosen model does not accept (names model, setting)
    │   │   ├── InvalidChange           a replay's change (system file, tools object, config file) cannot be used
    │   │   └── ToolDefinitionError     a function that cannot be a tool (no JSON Schema for a type, no docstring)
    │   ├── ArchiveError                the session archive cannot be used (names the object)
    │   │   ├── ArchiveObjectMissing    a manifest names a segment that is not there
    │   │   ├── ArchiveCorrupt          a segment or manifest does not match its digest, session or seq range
    │   │   ├── ArchiveConflict         another archiver changed a manifest first; re-read it and plan again
    │   │   └── ArchiveAhead            the archive holds more of a session than the log: restore before use
    │   ├── EventsExpired               events deleted from Kafka (retention) that the archive does not hold
    │   ├── ForkError                   a fork point the parent log cannot be cut at (past the end, inside a step)
    │   ├── ApprovalError               an approval decision cannot be recorded (names the session and call)
    │   │   ├── ApprovalNotPending      the call awaits no decision (never asked, already answered, not in the session)
    │   │   └── AlreadyDecided          the call was decided already (in the log, or waiting in the inbox)
    │   ├── WriteNotAllowed             this process may not write to the session (it opened its log or inbox read-only)
    │   ├── TurnOpen                    a turn is open (paused on approvals, or left by a crash): continue it first
    │   ├── NoOpenTurn                  there is no open turn to continue
    │   ├── ReplayError                 a recorded session cannot be replayed (names the session)
    │   │   ├── NothingToReplay         the session holds no request/dispatch record to compare a request with
    │   │   └── NotReplayable           the recording holds something a replay cannot follow (names seq and why)
    │   ├── ToolServerError             a tool server (MCP) answered something unusable (not MCP, a bad schema)
    │   ├── ErasureError                sealed content and its erasure (docs/ERASURE.md)
    │   │   ├── ContentErased           the content's key was destroyed (erased): only structure is left
    │   │   ├── KeyMissing              a sealed event's key is not in the key store (lost, not erased)
    │   │   ├── ContentCorrupt          sealed content does not authenticate (changed bytes, or another key)
    │   │   ├── NothingToErase          erase named a session or subject the log and key store do not know
    │   │   └── NotErasable             content that destroying a key cannot erase (logged unsealed)
    │   ├── MetricsServerError          the /metrics + health endpoint could not start (port taken)
    │   ├── OutputInvalid               a turn's final answer does not match its output type (after any retries)
    │   └── InputError                  a file or stream a command was given cannot be read, written or used
    ├── AttachmentError                 [per class] an attachment object cannot be used
    │   ├── AttachmentNotFound          [permanent] the store has no object for the digest
    │   ├── AttachmentCorrupt           [permanent] bytes or metadata do not match the reference
    │   └── AttachmentReadFailed        [transient] the store could not be read (I/O, network, permissions)
    ├── DispatchFailed                  [per error] a dispatcher reported that a handed-off step failed (as its kind)
    │   ├── DispatchTimeout             [transient] no dispatcher answered a handed-off step within the bounded wait
    │   └── DispatchLost                [transient] the dispatcher holding a send died: it may or may not have been sent
    └── ProviderError                   [per class] the model provider failed or answered something unusable
        ├── ProviderStatusError         [per error] a non-2xx HTTP status (408, 409, 429, 5xx: retry unless final)
        │   └── ContextOverflow         [permanent] the request does not fit the model's context window
        ├── ProviderTransportError      [per error] the connection failed (retryable before the first answer byte)
        ├── ProviderStreamError         [per error] a streamed answer is malformed, broke off or carried an error event
        ├── AnswerTooLarge              [permanent] an answer exceeded the configured size limit
        └── RetriesExhausted            [transient] the attempts or the deadline ran out; the last failure is its cause
"""

from __future__ import annotations

__all__ = [
    "AlreadyDecided",
    "AnswerTooLarge",
    "ApprovalError",
    "ApprovalNotPending",
    "ArchiveAhead",
    "ArchiveConflict",
    "ArchiveCorrupt",
    "ArchiveError",
    "ArchiveObjectMissing",
    "AttachmentCorrupt",
    "AttachmentError",
    "AttachmentNotFound",
    "AttachmentReadFailed",
    "AuthenticationFailed",
    "AvroDecodeError",
    "ConfigError",
    "ConflictError",
    "ContentCorrupt",
    "ContentErased",
    "ContextOverflow",
    "DispatchFailed",
    "DispatchLost",
    "DispatchTimeout",
    "ErasureError",
    "EventTooLarge",
    "EventsExpired",
    "FencedError",
    "FoldTimeout",
    "FoldlineError",
    "ForkError",
    "FormatError",
    "ImportFailed",
    "InputError",
    "OutputInvalid",
    "InvalidChange",
    "InvariantViolation",
    "KeyMissing",
    "MetricsServerError",
    "MissingExtra",
    "MissingHeader",
    "NoOpenTurn",
    "NotErasable",
    "NotReplayable",
    "NothingToErase",
    "NothingToReplay",
    "PermanentError",
    "ProviderError",
    "ProviderStatusError",
    "ProviderStreamError",
    "ProviderTransportError",
    "ReconstructionError",
    "ReplayError",
    "RequestTooLarge",
    "RetriesExhausted",
    "SessionExists",
    "SessionNotFound",
    "ToolDefinitionError",
    "ToolServerError",
    "ToolServerUnavailable",
    "StoreBusy",
    "StoreUnavailable",
    "TransientError",
    "TurnOpen",
    "WriteNotAllowed",
    "UnknownSchemaError",
    "UnsafeRetention",
    "UnsupportedSetting",
    "ValidationError",
]


class FoldlineError(Exception):
    """Root of every error foldline raises on purpose."""

    @property
    def transient(self) -> bool:
        """Whether the same call may succeed if it is made again after a wait (see the module docstring): fixed
        per class by the tree, decided per error where a class says ``[per error]``."""
        return isinstance(self, TransientError)


class TransientError(FoldlineError):
    """The same call may succeed if it is made again after a wait (an outage, a timeout, a lost hand-over)."""


class PermanentError(FoldlineError):
    """The same call fails the same way again: the input, the configuration or the state must change first."""


class ValidationError(PermanentError):
    """An event breaks a rule of the session log.

    ``seq`` is the offending event's seq (``None`` when the whole batch is at fault) and ``rule``
    a short stable identifier such as ``"seq-gapless"`` that tests and tools can match on.
    """

    def __init__(self, rule: str, message: str, *, seq: int | None = None) -> None:
        self.rule = rule
        self.seq = seq
        where = f"event seq {seq}: " if seq is not None else ""
        super().__init__(f"{where}{message} [rule {rule}]")


class FormatError(ValidationError):
    """Bytes that do not decode into an event envelope."""


class AvroDecodeError(FormatError):
    """Bytes that are not a well-formed foldline Avro record."""

    def __init__(self, message: str, *, seq: int | None = None) -> None:
        super().__init__("avro-decode", message, seq=seq)


class UnknownSchemaError(FormatError):
    """A record names a writer schema (fingerprint or registry id) this process does not know."""

    def __init__(self, message: str) -> None:
        super().__init__("avro-unknown-schema", message)


class EventTooLarge(ValidationError):
    """An event whose canonical encoding is larger than every backend is set to hold (rule ``event-size``)."""

    def __init__(self, size: int, limit: int, what: str, *, seq: int | None = None) -> None:
        self.size = size
        self.limit = limit
        super().__init__(
            "event-size",
            f"{what} is {size:,} bytes, over the {limit:,}-byte limit of one event; keep large content in the "
            "attachment store (tool results over the loop's limit are cut and kept there whole)",
            seq=seq,
        )


class ConflictError(PermanentError):
    """Optimistic-concurrency failure: the log's head moved since the writer last read it."""

    def __init__(self, session_id: str, expected_seq: int, actual_seq: int) -> None:
        self.session_id = session_id
        self.expected_seq = expected_seq
        self.actual_seq = actual_seq
        super().__init__(
            f"session {session_id!r}: append expected next seq {expected_seq} but the log is at "
            f"{actual_seq}; re-read the session and retry. Nothing was written."
        )


class FencedError(PermanentError):
    """A writer's epoch was superseded by a newer writer of the same session."""

    def __init__(self, session_id: str, epoch: int, current_epoch: int) -> None:
        self.session_id = session_id
        self.epoch = epoch
        self.current_epoch = current_epoch
        super().__init__(
            f"session {session_id!r}: writer epoch {epoch} was fenced by epoch {current_epoch}; "
            "this writer must stop (another instance owns the session). Nothing was written."
        )


class SessionNotFound(PermanentError):
    def __init__(self, session_id: str, where: str = "`foldline sessions` lists the known ones") -> None:
        self.session_id = session_id
        super().__init__(f"session {session_id!r} not found; {where}")


class SessionExists(PermanentError):
    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        super().__init__(f"session {session_id!r} already exists; choose another id (e.g. --as NEW_ID)")


class AttachmentError(FoldlineError):
    def __init__(self, attachment_id: str, message: str) -> None:
        self.attachment_id = attachment_id
        super().__init__(f"attachment {attachment_id}: {message}")


class AttachmentNotFound(AttachmentError, PermanentError):
    """The store has no object for the digest."""


class AttachmentCorrupt(AttachmentError, PermanentError):
    """The object's bytes or metadata do not match what the reference records."""


class AttachmentReadFailed(AttachmentError, TransientError):
    """The store could not be read; the object may be fine."""


class StoreUnavailable(TransientError):
    """A backing store failed or did not answer within the bounded wait; the message names it and the cause."""


class StoreBusy(StoreUnavailable):
    """Another writer held the store's lock for longer than the bounded wait; nothing was written."""


class FoldTimeout(TransientError):
    """A fold did not reach the awaited seq within the bounded wait."""


class ToolServerUnavailable(TransientError):
    """A tool server (an MCP server) could not be started or reached, or stopped answering; ``server`` names it."""

    def __init__(self, server: str, message: str) -> None:
        self.server = server
        super().__init__(f"MCP server {server!r}: {message}")


class ImportFailed(PermanentError):
    def __init__(self, line: int, reason: str) -> None:
        self.line = line
        self.reason = reason
        super().__init__(f"line {line}: {reason}. Nothing was imported.")


class InvariantViolation(PermanentError):
    """The request about to be sent differs from its rebuild from the raw log. It is not sent."""

    def __init__(self, message: str, diff: str) -> None:
        self.diff = diff
        super().__init__(f"{message}\n{diff}")


class RequestTooLarge(PermanentError):
    """A request body larger than the limit (:data:`~foldline.core.limits.MAX_REQUEST_BODY_BYTES`): nothing was
    logged for it or sent. Trimming or compacting the session (a PressurePolicy) brings it back under."""

    def __init__(self, size: int, limit: int, what: str = "the request body") -> None:
        self.size = size
        self.limit = limit
        super().__init__(
            f"{what} is {size:,} bytes, over the {limit:,}-byte limit of one request; trim or compact the "
            "session (AgentOptions.pressure) or keep large content out of it — nothing was sent"
        )


class DispatchFailed(FoldlineError):
    """A dispatcher process could not complete a handed-off step; ``kind`` is its error type."""

    def __init__(self, session_id: str, boundary: int, kind: str, message: str) -> None:
        self.session_id = session_id
        self.boundary = boundary
        self.kind = kind
        self.detail = message
        super().__init__(f"session {session_id!r}: the dispatcher failed the step at seq {boundary}: {kind}: {message}")

    @property
    def transient(self) -> bool:
        """As the error the dispatcher reported (``kind``): a store outage over there is one here too."""
        return isinstance(self, TransientError) or self.kind in _transient_kinds()


class DispatchTimeout(DispatchFailed, TransientError):
    """No dispatcher answered within the bounded wait; the session log says what, if anything, was sent."""


class DispatchLost(DispatchFailed, TransientError):
    """A ``send`` whose dispatcher died while it held it: it may or may not have reached the provider."""


class ProviderError(FoldlineError):
    """The provider failed (transport, status, unparseable answer)."""


class ProviderStatusError(ProviderError):
    """The provider answered with a non-2xx HTTP status. ``excerpt`` is a short, credential-free body excerpt.

    What the answer said about retrying travels with it: ``error_type`` (the body's error type or code),
    ``request_id`` (the provider's request id header), ``retry_after`` (seconds, from ``retry-after-ms`` or
    ``retry-after``), ``should_retry`` (the ``x-should-retry`` header) and ``final`` (the answer marks the
    failure as not worth retrying, e.g. a quota or spend limit behind a 429).
    """

    def __init__(
        self,
        provider: str,
        status: int,
        excerpt: str,
        *,
        error_type: str | None = None,
        request_id: str | None = None,
        retry_after: float | None = None,
        should_retry: bool | None = None,
        final: bool = False,
    ) -> None:
        self.provider = provider
        self.status = status
        self.excerpt = excerpt
        self.error_type = error_type
        self.request_id = request_id
        self.retry_after = retry_after
        self.should_retry = should_retry
        self.final = final
        retry = " (retryable: rate limited or overloaded)" if status in (408, 429, 500, 502, 503, 504, 529) else ""
        if final:
            retry = " (final: the provider marks it as not worth retrying)"
        super().__init__(f"{provider}: HTTP {status}{retry}: {excerpt}")

    @property
    def transient(self) -> bool:
        """As the providers' own rules say (their SDKs do the same): never when the answer marks itself final;
        as ``x-should-retry`` says when it is there; else for 408, 409, 429 and every 5xx. A kind the tree fixes
        as permanent (:class:`ContextOverflow`) never is."""
        if self.final or isinstance(self, PermanentError):
            return False
        if self.should_retry is not None:
            return self.should_retry
        return self.status in (408, 409, 429) or self.status >= 500


class ContextOverflow(ProviderStatusError, PermanentError):
    """The request is longer than the model's context window. Retrying the same bytes cannot help: compact
    earlier (a lower ``PressurePolicy`` budget) or choose a model with a larger window."""


class ProviderTransportError(ProviderError):
    """The connection failed (connect, read, reset, timeout). ``received_bytes`` counts the answer bytes that
    had arrived: 0 means the failure came before the first one, so resending the same bytes is safe."""

    def __init__(self, message: str, *, received_bytes: int = 0, error_type: str = "transport") -> None:
        self.received_bytes = received_bytes
        self.error_type = error_type
        super().__init__(message)

    @property
    def transient(self) -> bool:
        """Only before the first answer byte: after it the request reached the model, so it is not resent."""
        return self.received_bytes == 0


class ProviderStreamError(ProviderError):
    """A streamed answer that cannot be assembled: malformed server-sent events, an event of a type foldline
    does not know, a stream that ended before its final event, or an error event in the middle of the answer.
    ``retryable`` is true only for an error event whose type the provider uses for transient failures."""

    def __init__(
        self,
        message: str,
        *,
        error_type: str = "malformed-stream",
        received_bytes: int = 0,
        retryable: bool = False,
        request_id: str | None = None,
    ) -> None:
        self.error_type = error_type
        self.received_bytes = received_bytes
        self.retryable = retryable
        self.request_id = request_id
        super().__init__(message)

    @property
    def transient(self) -> bool:
        """Only for an error event of a type the provider uses for transient failures (``retryable``)."""
        return self.retryable


class AnswerTooLarge(ProviderError, PermanentError):
    """The answer grew past the configured limit (``TransportSettings.max_answer_bytes``); it was not kept."""

    def __init__(self, message: str, *, received_bytes: int = 0) -> None:
        self.received_bytes = received_bytes
        super().__init__(message)


class RetriesExhausted(ProviderError, TransientError):
    """Every attempt failed, or the retry deadline passed; ``attempts`` were made and the last failure is the
    ``__cause__``. Each failed attempt is in the session log as an ``llm/retry`` event."""

    def __init__(self, message: str, *, attempts: int) -> None:
        self.attempts = attempts
        super().__init__(message)


class ReconstructionError(PermanentError):
    """A logged request cannot be rebuilt from the log (unknown serializer, missing events)."""


class MissingHeader(ReconstructionError):
    """A request boundary has no ``request/header`` before it, so there is no request to build."""

    def __init__(self, session_id: str, boundary: int) -> None:
        self.session_id = session_id
        self.boundary = boundary
        super().__init__(
            f"session {session_id!r}: no request/header before seq {boundary}, so no request can be built there; "
            "a step writes its header snapshot before its first request"
        )


class ConfigError(PermanentError):
    """Configuration is invalid or names something unavailable."""


class AuthenticationFailed(ConfigError):
    """A server refused the configured credentials (e.g. a Kafka SASL login) or the TLS handshake failed."""


class MissingExtra(ConfigError):
    """A backend or command needs an extra of the package (``pip install 'foldline[<extra>]'``) that is not
    installed: ``extra`` names it, ``module`` the Python module that was missing."""

    def __init__(self, extra: str, module: str, what: str = "this") -> None:
        self.extra = extra
        self.module = module
        super().__init__(
            f"{what} needs foldline's {extra!r} extra, which is not installed (no module {module!r}): "
            f"pip install 'foldline[{extra}]' (or foldline[distributed] for every server backend)"
        )


class UnsafeRetention(ConfigError):
    """A topic's configuration could delete session events that are not archived; nothing was written.

    ``topic`` and ``setting`` name what is wrong (e.g. ``retention.ms``), ``fix`` says what to change.
    """

    def __init__(self, topic: str, setting: str, value: str, problem: str, fix: str) -> None:
        self.topic = topic
        self.setting = setting
        self.value = value
        self.fix = fix
        super().__init__(f"topic {topic}: {setting}={value} {problem}; {fix}")


class UnsupportedSetting(ConfigError):
    """A call-config setting the chosen model does not accept (its provider would answer 400 to every request).

    ``model`` and ``setting`` name what is wrong (e.g. ``temperature``); the message says what to change.
    """

    def __init__(self, model: str, setting: str, message: str) -> None:
        self.model = model
        self.setting = setting
        super().__init__(message)


class ArchiveError(PermanentError):
    """The session archive cannot be used; ``object`` names the manifest or segment (``s3://…`` or a path)."""

    def __init__(self, obj: str, message: str) -> None:
        self.object = obj
        super().__init__(f"archive object {obj}: {message}")


class ArchiveObjectMissing(ArchiveError):
    """A manifest names a segment the archive store does not have."""


class ArchiveCorrupt(ArchiveError):
    """A segment or manifest does not match its recorded digest, its session or its seq range."""


class ArchiveConflict(ArchiveError):
    """Another archiver changed the manifest since it was read (a conditional write lost); re-read and retry."""


class ArchiveAhead(ArchiveError):
    """The archive holds more events of a session than the log's head (a cluster rebuilt without restoring)."""

    def __init__(self, obj: str, session_id: str, archived: int, head: int) -> None:
        self.session_id = session_id
        self.archived = archived
        self.head = head
        super().__init__(
            obj,
            f"session {session_id!r} is archived up to seq {archived} but the log holds only {head} events; the "
            "log was rebuilt without its archive — run `foldline restore` before the session is read or written",
        )


class EventsExpired(PermanentError):
    """Kafka deleted events of a session (its retention) and the archive does not hold them.

    The session cannot be read whole: it is never returned shorter. ``first_seq`` is the first seq that
    neither Kafka nor the archive has.
    """

    def __init__(self, session_id: str, first_seq: int, message: str) -> None:
        self.session_id = session_id
        self.first_seq = first_seq
        super().__init__(f"session {session_id!r}: event seq {first_seq} is gone: {message}")


class InvalidChange(ConfigError):
    """A replay's change cannot be used: a system-prompt file that is not text, a tools object that does not
    import or is not a toolset, a config file that is not JSON or TOML or names fields a call config does not
    have. The message names the input and what to fix."""


class ToolDefinitionError(ConfigError):
    """A function that cannot be offered to a model as a tool: a parameter type with no JSON Schema, no
    docstring, ``*args``, a name that is taken or that the provider APIs refuse; ``tool`` names it."""

    def __init__(self, tool: str, message: str) -> None:
        self.tool = tool
        super().__init__(f"tool {tool!r}: {message}")


class ReplayError(PermanentError):
    """A recorded session cannot be replayed; ``session_id`` names it (None: no session was found at all)."""

    def __init__(self, session_id: str | None, message: str) -> None:
        self.session_id = session_id
        super().__init__(f"session {session_id!r}: {message}" if session_id is not None else message)


class NothingToReplay(ReplayError):
    """The session holds no ``request/dispatch`` record (after its fork seed), so no request can be compared."""


class NotReplayable(ReplayError):
    """The recording holds something a replay cannot follow (a request that does not rebuild to its digest, a
    cancelled answer, a step quarantined then but readable now); ``seq`` names the event."""

    def __init__(self, session_id: str, seq: int, message: str) -> None:
        self.seq = seq
        super().__init__(session_id, f"seq {seq}: {message}")


class ApprovalError(PermanentError):
    """An approval decision cannot be recorded; the message names the session and call and what to do."""

    def __init__(self, session_id: str, call_id: str, message: str) -> None:
        self.session_id = session_id
        self.call_id = call_id
        super().__init__(message)


class ApprovalNotPending(ApprovalError):
    """The call awaits no decision: no approval was asked for it, it was answered, or the session has no such call."""


class AlreadyDecided(ApprovalError):
    """The call was decided already: a call is decided once (the first decision counts)."""


class WriteNotAllowed(PermanentError):
    """This process may not write to the session — a decision, an injected message — because it opened the log or
    its inbox read-only (a read-only data directory); nothing was written."""


class TurnOpen(PermanentError):
    """A session's turn is open — paused on approval decisions, or left open by a crash under the ``continue``
    policy — and must be continued (``Agent.continue_turn``, ``foldline resume``) before a new one starts."""

    def __init__(self, session_id: str, turn: int, message: str) -> None:
        self.session_id = session_id
        self.turn = turn
        super().__init__(message)


class NoOpenTurn(PermanentError):
    """``continue_turn`` on a session whose last turn has ended."""


class ForkError(PermanentError):
    """A fork point the parent log cannot be cut at (past its end, inside a step or a compaction)."""


class ToolServerError(PermanentError):
    """A tool server (an MCP server) answered something unusable: a message that is not MCP, a tool whose input
    schema is not valid JSON Schema; ``server`` names it."""

    def __init__(self, server: str, message: str) -> None:
        self.server = server
        super().__init__(f"MCP server {server!r}: {message}")


class ErasureError(PermanentError):
    """Sealed content cannot be read, or an erasure cannot be done (docs/ERASURE.md)."""


class ContentErased(ErasureError):
    """The session's content was erased: its key was destroyed, so only its structure (seqs, types, ids, usage,
    digests) can be read. Nothing can be built from it, and nothing more can be appended to it."""

    def __init__(self, session_id: str | None, detail: str = "") -> None:
        self.session_id = session_id
        who = f"session {session_id!r} was erased" if session_id is not None else "this content was erased"
        super().__init__(
            f"{who}: its content key was destroyed, so its content cannot be read and nothing can be built from "
            f"it or appended to it{'; ' + detail if detail else ''} (`foldline erasures` lists when, by whom and why)"
        )


class KeyMissing(ErasureError):
    """A sealed event names a data key the key store does not hold and never erased: the key was lost. This is
    never an erasure: restore the key store from a copy."""

    def __init__(self, kid: str, where: str) -> None:
        self.kid = kid
        super().__init__(
            f"{where}: the content is sealed with key {kid}, which the key store does not hold and did not erase — "
            "the key was lost (a wiped or replaced key store, another data directory or bucket?); restore the key "
            "store from a copy. Nothing was read."
        )


class ContentCorrupt(ErasureError):
    """Sealed content that does not authenticate under its key: the bytes were changed, or the key is not the
    one they were sealed with."""

    def __init__(self, where: str, seq: int | None = None) -> None:
        self.seq = seq
        at = f"event seq {seq} " if seq is not None else ""
        super().__init__(
            f"{at}{where}: the sealed content does not authenticate under its key — the stored bytes were changed "
            "or the key store holds another key under its id; restore the log or the key store from a copy"
        )


class NothingToErase(ErasureError):
    """``erase`` named a session the log does not hold, or a subject no session was bound to."""


class NotErasable(ErasureError):
    """Content that destroying a key cannot erase: events logged without sealing on a log that cannot rewrite
    them (Kafka). The message names the events and what can be done."""


class MetricsServerError(PermanentError):
    """The metrics and health endpoint could not start (usually: the port is already taken)."""


class OutputInvalid(PermanentError):
    """A turn's final answer does not match the output type it asked for (structured output), after the retries the
    caller allowed: :attr:`errors` is what pydantic found wrong, :attr:`text` the answer, :attr:`turn` its turn. The
    turn and its answer are logged; the next turn starts from a valid log."""

    def __init__(self, turn: int, text: str, errors: str, attempts: int) -> None:
        self.turn, self.text, self.errors, self.attempts = turn, text, errors, attempts
        super().__init__(
            f"turn {turn}: the answer does not match the output type after {attempts} attempt(s): {errors} — allow "
            "more attempts (OutputType(retries=...)), simplify the schema, or read the logged answer"
        )


class InputError(PermanentError):
    """A file, directory or stream a command was given cannot be read, written or used (unreadable, not
    text, a directory where a file is meant); the message names it and the cause."""


def _transient_kinds() -> frozenset[str]:
    """The names of every class under :class:`TransientError` (a dispatcher reports an error by its name)."""
    names: set[str] = set()
    pending: list[type[FoldlineError]] = [TransientError]
    while pending:
        cls = pending.pop()
        names.add(cls.__name__)
        pending.extend(cls.__subclasses__())
    return frozenset(names)
