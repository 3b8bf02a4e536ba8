"""Build hook: the archive's Avro decoder, generated from the record definitions, compiled with mypyc.

Reading a 10,000-event session from the archive is mostly decoding, and the compiled decoder does it in
about half the instructions of the interpreted one. ``foldline.adapters.avro.direct.decoder_source()`` writes
the decoder's text from the event definitions; the hook compiles that text as
``foldline.adapters.avro._direct_native`` with its sha256 written into it, and
:mod:`foldline.adapters.avro.decoding` uses that module only when the digest matches the text the
definitions give at run time, so a changed definition is never read by a stale build.

* a wheel gets the two extension files (the module and mypyc's runtime library) and a platform tag;
* an editable install gets them next to ``direct.py`` in the source tree (``.gitignore`` keeps them out
  of the repository), each replaced whole, atomically.

The compilation happens in a temporary directory of the build's own: a copy of the package with the module to
compile beside ``direct.py``, so the source tree is never written to while compiling and two builds of one
checkout at once (two virtual environments, a wheel beside an editable install) cannot see each other's
files. Its results are cached under ``build/`` by the digest of the source, and the cache is published whole
(a directory renamed into place): a build finds it complete or not at all.

Without a C compiler, or with ``FOLDLINE_PURE_PYTHON=1``, the build goes on without them and says so:
reads then run the generated text itself (the same results, slower); ``foldline doctor`` shows which decoder
reads.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

PACKAGE_ROOT = Path("services/foldline")
PACKAGE_DIR = PACKAGE_ROOT / "adapters" / "avro"
NATIVE = "_direct_native"
_GENERATE = (
    "import sys; sys.path.insert(0, 'services'); "
    "from foldline.adapters.avro.direct import decoder_source; sys.stdout.write(decoder_source())"
)


class CustomBuildHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        package = Path(self.root) / PACKAGE_DIR
        if os.environ.get("FOLDLINE_PURE_PYTHON") == "1":
            self.app.display_warning("FOLDLINE_PURE_PYTHON=1: the archive decoder is not compiled")
            if version == "editable":
                _remove_stale(package, keep=set())  # an earlier editable build's: this install reads interpreted
            return
        compiler = sysconfig.get_config_var("CC") or "cc"
        if shutil.which(compiler.split()[0]) is None:
            self.app.display_warning(
                f"no C compiler ({compiler!r} not found): the archive decoder is not compiled; "
                "reads use the interpreted one (about half the speed)"
            )
            if version == "editable":
                _remove_stale(package, keep=set())
            return
        built = self._compile(Path(self.root))
        for so in built:
            if version == "editable":
                _place(so, package / so.name)
            else:
                build_data["force_include"][str(so)] = f"foldline/adapters/avro/{so.name}"
        if version == "editable":
            _remove_stale(package, keep={so.name for so in built})
        build_data["pure_python"] = False
        build_data["infer_tag"] = True

    def _compile(self, root: Path) -> list[Path]:
        generated = subprocess.run([sys.executable, "-c", _GENERATE], cwd=root, capture_output=True, check=False)
        if generated.returncode != 0:
            raise RuntimeError(
                "writing the archive decoder from the record definitions failed (set FOLDLINE_PURE_PYTHON=1 to "
                f"build without it):\n{generated.stderr.decode(errors='replace')[-4000:]}"
            )
        source = generated.stdout
        digest = hashlib.sha256(source).hexdigest()
        tag = sysconfig.get_config_var("EXT_SUFFIX") or ""
        cache = root / "build" / f"mypyc-{digest[:16]}{tag.replace('.so', '')}"  # build/ is not in git
        if _complete(cache):
            return sorted(cache.glob(f"{NATIVE}*.so"))  # the same source compiled already (pip asks twice)
        work = Path(tempfile.mkdtemp(prefix="foldline-mypyc-"))
        try:
            # a copy of the package (its Python sources: what the type checker reads) with the module to
            # compile beside direct.py; mypyc leaves its results in that copy and under work/src/build
            src = work / "src"
            shutil.copytree(root / PACKAGE_ROOT, src / "foldline", ignore=shutil.ignore_patterns("__pycache__", "*.so"))
            copy = src / "foldline" / "adapters" / "avro" / f"{NATIVE}.py"
            copy.write_bytes(source + f'\n\nSOURCE_SHA256 = "{digest}"\n'.encode())
            run = subprocess.run(
                [sys.executable, "-m", "mypyc", "--follow-imports=silent", "--ignore-missing-imports", str(copy)],
                cwd=src,
                capture_output=True,
                text=True,
                check=False,
            )
            if run.returncode != 0:
                raise RuntimeError(
                    "compiling the archive decoder with mypyc failed (set FOLDLINE_PURE_PYTHON=1 to build without "
                    f"it):\n{run.stdout[-4000:]}\n{run.stderr[-4000:]}"
                )
            built = sorted((src / "build").rglob(f"{NATIVE}*.so"))
            names = {so.name for so in built}
            if len(names) != len(built) or not any(n.startswith(NATIVE + ".") for n in names):
                raise RuntimeError(f"mypyc left unexpected files for the archive decoder: {sorted(names)}")
            # publish the cache whole: filled beside it, then renamed into place; a build that finished first wins
            landing = cache.parent / f".{cache.name}.{os.getpid()}.{work.name}"
            landing.mkdir(parents=True)
            for so in built:
                shutil.copy2(so, landing / so.name)
            if cache.is_dir() and not _complete(cache):
                shutil.rmtree(cache, ignore_errors=True)  # left half-written by a build that did not finish
            try:
                landing.rename(cache)
            except OSError:
                if not _complete(cache):
                    raise
                shutil.rmtree(landing, ignore_errors=True)  # another build published the same files first
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return sorted(cache.glob(f"{NATIVE}*.so"))


def _complete(cache: Path) -> bool:
    return cache.is_dir() and any(cache.glob(f"{NATIVE}.*.so"))


def _place(built: Path, target: Path) -> None:
    """Copy ``built`` to ``target`` whole: beside it first, then renamed over it (a reader never sees half)."""
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    shutil.copy2(built, partial)
    os.replace(partial, target)


def _remove_stale(package: Path, keep: set[str]) -> None:
    """Remove compiled decoder files an earlier editable build left in the source tree, but those in ``keep``."""
    for old in package.glob(f"{NATIVE}*.so"):
        if old.name not in keep:
            old.unlink(missing_ok=True)
