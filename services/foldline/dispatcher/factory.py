"""The dispatcher process's factory: its stores and its :class:`~.dispatcher.Dispatcher`, from a Config.

``foldline dispatcher`` and the demo's in-process dispatcher are built here; so is the loop's end of the
step stream (:func:`step_client`). The adapters come from :mod:`foldline.config.factories`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..config import Config, Stores, open_stores
from ..config.factories import providers
from ..errors import ConfigError
from .dispatcher import Dispatcher
from .redis_steps import RedisStepClient

if TYPE_CHECKING:
    from ..metrics import DispatcherMetrics
    from ..providers.base import Provider

__all__ = ["open_dispatcher", "open_dispatcher_stores", "step_client"]


def open_dispatcher_stores(config: Config) -> Stores:
    """A dispatcher process's stores: the configured backend's, which must have folds (distributed)."""
    _check_pool(config)
    stores = open_stores(config)
    if stores.folds is None:
        stores.close()
        raise ConfigError(
            f"foldline dispatcher builds requests from projected folds; the {config.backend!r} backend has none — "
            "use --backend distributed (Kafka log, Redis folds, S3 attachments) with `foldline projector` running"
        )
    return stores


def open_dispatcher(
    config: Config,
    stores: Stores,
    *,
    providers_by_name: dict[str, Provider] | None = None,
    metrics: DispatcherMetrics | None = None,
) -> Dispatcher:
    """A dispatcher on ``stores`` (which must have folds) within ``config.dispatch``'s bounds; the providers
    the configuration names unless given."""
    if stores.folds is None:
        raise ConfigError("a dispatcher needs the folds of the distributed backend")
    _check_pool(config)
    d = config.dispatch
    return Dispatcher(
        stores.log,
        stores.folds,
        providers_by_name if providers_by_name is not None else providers(config),
        attachments=stores.attachments,
        invariant=d.invariant,
        fold_timeout_s=d.fold_timeout_s,
        max_concurrency=d.concurrency,
        metrics=metrics,
    )


def step_client(config: Config, *, stream: str | None = None) -> RedisStepClient:
    """The loop's end of the step stream: hands steps to ``foldline dispatcher`` processes."""
    return RedisStepClient(
        config.redis, stream=stream or config.dispatch.stream, timeout_s=config.dispatch.handover_timeout_s
    )


def _check_pool(config: Config) -> None:
    if config.redis.max_connections <= config.dispatch.concurrency:
        raise ConfigError(
            f"FOLDLINE_REDIS_MAX_CONNECTIONS ({config.redis.max_connections}) must exceed "
            f"FOLDLINE_DISPATCH_CONCURRENCY ({config.dispatch.concurrency}): every step in flight waits for its "
            "fold on a Redis connection of its own"
        )
