"""``python -m foldline.adapters.avro [SCHEMA_DIR]``: write the event schema the record definitions give.

When it differs from the committed one, the committed one is first kept in ``previous/`` (docs/SCHEMAS.md).
"""

from __future__ import annotations

import sys
from pathlib import Path

from .layout import write_schema
from .schemas import schema_dir

for path in write_schema(Path(sys.argv[1]) if len(sys.argv) > 1 else schema_dir()):
    print(f"wrote {path}")
