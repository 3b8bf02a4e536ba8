"""The ports: small abstract interfaces the loop and services depend on.

Adapters live in :mod:`foldline.adapters` and are chosen in one place, :mod:`foldline.config`.
"""

from .attachments import AttachmentMeta, AttachmentStore
from .event_log import EventLog, WriterLease

__all__ = ["AttachmentMeta", "AttachmentStore", "EventLog", "WriterLease"]
