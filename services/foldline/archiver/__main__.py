"""``python -m foldline.archiver [OPTIONS]`` is ``foldline archiver [OPTIONS]`` (for subprocess use)."""

from __future__ import annotations

import sys

from ..cli.main import app

app(args=["archiver", *sys.argv[1:]], prog_name="foldline")
