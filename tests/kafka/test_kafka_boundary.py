"""confluent-kafka is used only inside the Kafka adapter package (and the Avro codec's schema-registry client).

Everything else — the projector runtimes, the dispatcher, the CLI — reaches Kafka through
``foldline.adapters.kafka``, which translates every librdkafka failure into foldline's error tree.
"""

from __future__ import annotations

import ast
from pathlib import Path

import foldline

PACKAGE = Path(foldline.__file__).resolve().parent
ALLOWED = ("adapters/kafka/", "adapters/avro/codec.py")


def _imports_confluent_kafka(path: Path) -> list[int]:
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module is not None:
            names = [node.module]
        else:
            continue
        if any(name == "confluent_kafka" or name.startswith("confluent_kafka.") for name in names):
            lines.append(node.lineno)
    return lines


def test_only_the_kafka_adapter_imports_confluent_kafka() -> None:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        lines = _imports_confluent_kafka(path)
        if lines and not rel.startswith(ALLOWED):
            found[rel] = lines
    assert found == {}


def test_the_scan_sees_the_adapter_itself() -> None:
    """The scan above finds imports where they are (so an empty result means something)."""
    assert _imports_confluent_kafka(PACKAGE / "adapters" / "kafka" / "consumer.py")
    assert _imports_confluent_kafka(PACKAGE / "adapters" / "kafka" / "log.py")
