"""What this install of foldline was built with: whether its build compiled the archive decoder.

``hatch_build.py`` compiles the decoder unless the build is told not to (``FOLDLINE_PURE_PYTHON=1``) or finds no
C compiler; a build that compiles marks the wheel (or the editable install) as not pure Python. So an install
without the compiled decoder either was built that way on purpose — tests of the compiled decoder then skip,
saying so — or its build is broken or stale, which they report.
"""

from __future__ import annotations

import importlib.metadata

import pytest

from foldline.adapters.avro import decoding


def built_pure() -> bool:
    """Whether the installed foldline was built without compiling anything (its ``WHEEL`` says so)."""
    try:
        wheel = importlib.metadata.distribution("foldline").read_text("WHEEL") or ""
    except importlib.metadata.PackageNotFoundError:
        return True  # run from a source tree that was never installed: nothing was compiled
    return "Root-Is-Purelib: true" in wheel


def require_compiled_decoder() -> None:
    """Skip, with the reason, when this install was built without the compiled decoder; fail when it was built
    with it and the decoder still does not read (a broken build, or one of other record definitions)."""
    native, why = decoding.native_module()
    if native is not None:
        return
    if built_pure():
        pytest.skip(
            "the compiled decoder is not built: this install was built without it (FOLDLINE_PURE_PYTHON=1, or no "
            f"C compiler); reads use the interpreted one ({why})"
        )
    pytest.fail(f"this install was built with the compiled decoder, but it does not read: {why}")
