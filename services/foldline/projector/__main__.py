"""``python -m foldline.projector [OPTIONS]`` is ``foldline projector [OPTIONS]`` (for subprocess use)."""

from __future__ import annotations

import sys

from ..cli.main import app

app(args=["projector", *sys.argv[1:]], prog_name="foldline")
