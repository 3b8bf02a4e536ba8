"""Before a process starts its Kafka clients: is a client with these security settings let in?

librdkafka answers a refused login or an unverifiable broker certificate only through its error callback
and its log; a metadata request just waits for its whole timeout and then fails with a transport error,
while every reconnect logs the refusal again. :func:`check_kafka_access` asks for metadata in short slices
and serves the callback between them, so wrong credentials or a wrong CA surface within about half a second
as one typed error (:class:`~foldline.errors.AuthenticationFailed`), and librdkafka's log lines of the
attempt are kept out of the process's log (the first one is quoted in the error).

The adapter factories (:mod:`foldline.config.factories`) run it for every process kind whose Kafka connection is secured
(``security.protocol`` other than ``PLAINTEXT``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from ...errors import AuthenticationFailed, ConfigError, StoreUnavailable

__all__ = ["check_kafka_access"]

_SLICE_S = 0.25


class _Collected:
    """A librdkafka logger that keeps the lines instead of printing them (confluent-kafka calls ``log``)."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def log(self, _level: int, msg: str, *args: Any) -> None:
        if len(self.lines) < 20:
            self.lines.append(msg % args if args else msg)


def check_kafka_access(bootstrap: str, properties: Mapping[str, str], timeout_s: float) -> None:
    """Return once a metadata request over ``properties`` succeeds; raise within ``timeout_s`` otherwise.

    :class:`AuthenticationFailed` for refused SASL credentials or a failed TLS handshake (a certificate the
    CA does not verify, a TLS client on a plaintext port), :class:`ConfigError` for properties librdkafka
    rejects, :class:`StoreUnavailable` when no broker answered in time.
    """
    errors: list[KafkaError] = []
    logged = _Collected()
    conf: dict[str, Any] = {**properties, "bootstrap.servers": bootstrap, "error_cb": errors.append, "logger": logged}
    try:
        admin = AdminClient(conf)
    except KafkaException as exc:
        raise ConfigError(f"the Kafka client properties are not usable: {exc.args[0].str()}") from exc
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"the Kafka client properties are not usable: {exc}") from exc
    protocol = properties.get("security.protocol", "PLAINTEXT").upper()
    user = properties.get("sasl.username")
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            admin.list_topics(timeout=max(0.01, min(_SLICE_S, deadline - time.monotonic())))
            return
        except KafkaException:
            pass  # the reason, if any, arrives through the error callback
        admin.poll(0)
        for err in errors:
            if err.code() == KafkaError._AUTHENTICATION:
                raise AuthenticationFailed(
                    f"Kafka at {bootstrap} refused the SASL login of user {user!r} "
                    f"({properties.get('sasl.mechanism', '?')}): check FOLDLINE_KAFKA_SASL_USERNAME and "
                    "FOLDLINE_KAFKA_SASL_PASSWORD (or the client-properties file)"
                )
            if err.code() == KafkaError._SSL:
                raise AuthenticationFailed(
                    f"the TLS handshake with Kafka at {bootstrap} failed ({_reason(err.str())}): check "
                    "FOLDLINE_KAFKA_SSL_CA_LOCATION / FOLDLINE_KAFKA_SSL_CA_PEM and that the port is the broker's "
                    f"{protocol} listener"
                )
        if time.monotonic() >= deadline:
            first = f"; librdkafka said: {_reason(logged.lines[0])}" if logged.lines else ""
            raise StoreUnavailable(
                f"Kafka at {bootstrap} did not answer a {protocol} client within {timeout_s:g}s{first}; check "
                "FOLDLINE_KAFKA_BOOTSTRAP and that FOLDLINE_KAFKA_SECURITY_PROTOCOL is the listener's protocol"
            )


def _reason(text: str) -> str:
    """The part of a librdkafka message after its ``<broker>: `` prefix, on one line, without credentials."""
    tail = text.rsplit("]: ", 1)[-1]
    _broker, sep, reason = tail.partition(": ")
    return " ".join((reason if sep else tail).split())[:300]
