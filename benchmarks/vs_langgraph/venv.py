"""The comparison's own virtual environment: ``.bench/langgraph``, created and filled on first use.

LangGraph, its checkpointer and matplotlib (for the plot) live there, pinned with every dependency in
``requirements.txt`` and installed with ``--no-deps``, so they never enter foldline's environment and
their objects never share a heap with foldline's loop. The environment is rebuilt when the requirements
change (a stamp holds their SHA-256). ``.bench/`` ignores itself for git.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

__all__ = ["REQUIREMENTS", "ROOT", "VENV", "ensure"]

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".bench" / "langgraph"
REQUIREMENTS = Path(__file__).with_name("requirements.txt")
_STAMP = ".requirements.sha256"


def _run(cmd: list[str], what: str) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(
            f"{what} failed ({' '.join(cmd)} exited {done.returncode}): {done.stderr.strip()[-1500:]}; "
            f"the comparison needs PyPI reachable once; delete {VENV} to start over"
        )


def ensure(venv: Path = VENV) -> Path:
    """The Python of the comparison environment, creating and installing it when needed."""
    python = venv / "bin" / "python"
    wanted = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()
    stamp = venv / _STAMP
    if python.exists() and stamp.exists() and stamp.read_text(encoding="ascii").strip() == wanted:
        return python
    if venv.exists():
        shutil.rmtree(venv)
    venv.parent.mkdir(parents=True, exist_ok=True)
    (venv.parent / ".gitignore").write_text("*\n", encoding="ascii")
    _run([sys.executable, "-m", "venv", str(venv)], "creating the comparison environment")
    pip = [str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--disable-pip-version-check"]
    _run([*pip, "-r", str(REQUIREMENTS)], "installing LangGraph into the comparison environment")
    stamp.write_text(wanted + "\n", encoding="ascii")
    return python
