"""Which build of :mod:`.direct` decodes: the compiled one when it was built from the ``direct.py`` beside it.

The package's build compiles ``direct.py`` with mypyc into ``_direct_native`` (``hatch_build.py``), with the
sha256 of the source it was compiled from written into it. That module reads only when the digest is
this ``direct.py``'s: after an edit to the source and before a rebuild (``pip install -e .``, or
``make``, which reinstalls when ``direct.py`` changes), a warning says so and the interpreted module reads.
The two give the same envelopes (``tests/test_avro_direct.py`` runs both).
"""

from __future__ import annotations

import hashlib
import importlib
import logging
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from ...core.events import Envelope
from . import direct

__all__ = ["DECODER", "NATIVE_MODULE", "decode_bodies", "direct_envelope", "native_module", "why_interpreted"]

NATIVE_MODULE = "foldline.adapters.avro._direct_native"

log = logging.getLogger("foldline.avro")


def native_module() -> tuple[ModuleType | None, str]:
    """The compiled decoder built from this ``direct.py``, or ``None`` and why not."""
    try:
        native = importlib.import_module(NATIVE_MODULE)
    except ImportError as exc:
        return None, f"the compiled decoder is not built ({exc}); reinstall with a C compiler to build it"
    source = Path(direct.__file__).read_bytes()
    if getattr(native, "SOURCE_SHA256", None) != hashlib.sha256(source).hexdigest():
        return None, (
            f"the compiled decoder ({native.__file__}) was built from another direct.py; "
            "reinstall (pip install -e . or make) to rebuild it"
        )
    return native, ""


_native, why_interpreted = native_module()
if _native is None and "another direct.py" in why_interpreted:
    log.warning("%s; the interpreted decoder reads meanwhile", why_interpreted)

DECODER = "compiled (mypyc)" if _native is not None else "interpreted"
"""Which decoder reads: ``compiled (mypyc)`` or ``interpreted``."""

decode_bodies: Callable[[bytes, int, Any], list[Envelope]] = (
    _native.decode_bodies if _native is not None else direct.decode_bodies
)
direct_envelope: Callable[[bytes], Envelope | None] = (
    _native.direct_envelope if _native is not None else direct.direct_envelope
)
