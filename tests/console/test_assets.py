"""The console's browser assets are inside the package and are the files MANIFEST names; no page loads anything
from another origin."""

from __future__ import annotations

import hashlib
import re
from importlib import resources
from pathlib import Path

CONSOLE = Path(str(resources.files("foldline.console")))
VENDOR = CONSOLE / "static" / "vendor"


def test_the_vendored_files_are_the_ones_the_manifest_names() -> None:
    lines = [line for line in (VENDOR / "MANIFEST").read_text().splitlines() if line and not line.startswith("#")]
    digests: dict[str, str] = {}
    for line in lines:
        if "  " in line:
            digest, name = line.split("  ", 1)
            digests[name] = digest
    assert {"htmx.min.js", "uPlot.iife.min.js", "uPlot.min.css", "htmx.LICENSE", "uPlot.LICENSE"} <= set(digests)
    on_disk = {p.name for p in VENDOR.iterdir() if p.name != "MANIFEST"}
    assert on_disk == set(digests), "a vendored file the manifest does not name, or one it names that is missing"
    for name, digest in digests.items():
        assert hashlib.sha256((VENDOR / name).read_bytes()).hexdigest() == digest, name


def test_no_page_loads_anything_from_another_origin() -> None:
    for template in (CONSOLE / "templates").glob("*.html"):
        text = template.read_text()
        for attr in re.findall(r'(?:src|href)="([^"]*)"', text):
            assert not re.match(r"(?:[a-z]+:)?//", attr), (template.name, attr)
        assert "<script>" not in text, template.name  # no inline script (the CSP would refuse it anyway)
    own = (CONSOLE / "static" / "console.js").read_text() + (CONSOLE / "static" / "console.css").read_text()
    assert not re.search(r"https?://", own)
    assert "eval(" not in own
