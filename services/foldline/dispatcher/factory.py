"""The dispatcher process's factory: its stores and its :class:`~.dispatcher.Dispatcher`, from a Config.

A dispatcher reads folds (Redis) and attachments (S3) and talks to providers; it writes nothing to the log,
so it opens no Kafka client. ``foldline dispatcher`` and the demo's in-process dispatcher are built here;
so is the loop's end of the step stream (:func:`step_client`). The adapters come from
:mod:`foldline.config.factories`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..adapters.redis_steps import RedisStepClient
from ..config import Config
from ..config.factories import attachment_store, fold_store, providers
from .dispatcher import Dispatcher

if TYPE_CHECKING:
    from ..metrics import DispatcherMetrics
    from ..ports.attachments import AttachmentStore
    from ..ports.fold_store import FoldStore
    from ..providers.base import Provider

__all__ = ["DispatcherStores", "open_dispatcher", "open_dispatcher_stores", "step_client"]


@dataclass(slots=True)
class DispatcherStores:
    """What a dispatcher process reads: the folds and the attachments."""

    folds: FoldStore
    attachments: AttachmentStore

    def close(self) -> None:
        self.folds.close()
        self.attachments.close()


def open_dispatcher_stores(config: Config) -> DispatcherStores:
    """A dispatcher process's stores: the Redis folds and the S3 attachments of ``config``."""
    folds = fold_store(config)
    try:
        return DispatcherStores(folds, attachment_store(config))
    except BaseException:
        folds.close()
        raise


def open_dispatcher(
    config: Config,
    folds: FoldStore,
    attachments: AttachmentStore | None,
    *,
    providers_by_name: dict[str, Provider] | None = None,
    metrics: DispatcherMetrics | None = None,
) -> Dispatcher:
    """A dispatcher on ``folds`` within ``config.dispatch``'s bounds; the providers the configuration names
    unless given."""
    d = config.dispatch
    return Dispatcher(
        folds,
        providers_by_name if providers_by_name is not None else providers(config),
        attachments=attachments,
        fold_timeout_s=d.fold_timeout_s,
        outage_s=config.outage_s,
        max_concurrency=d.concurrency,
        metrics=metrics,
    )


def step_client(config: Config, *, stream: str | None = None) -> RedisStepClient:
    """The loop's end of the step stream: hands steps to ``foldline dispatcher`` processes."""
    d = config.dispatch
    return RedisStepClient(
        config.redis,
        stream=stream or d.stream,
        group=d.group,
        prepare_timeout_s=d.handover_timeout_s,
        answer_timeout_s=d.answer_timeout_s,
        outage_s=config.outage_s,
    )
