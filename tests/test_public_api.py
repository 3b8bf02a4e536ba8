"""The public API is a list a change must touch on purpose (httpx keeps the same test of its exports).

Each public package's ``__all__`` is spelled out here; every name in it resolves; nothing else public sits in
the package's namespace; and the quickstart and the README's example import only these names.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]

PUBLIC: dict[str, list[str]] = {
    "foldline": [
        "Agent",
        "AgentOptions",
        "CallConfig",
        "Change",
        "Config",
        "Enter",
        "EpochHeader",
        "FoldlineError",
        "ImageBlock",
        "ImageData",
        "MCPServer",
        "OutputType",
        "PressurePolicy",
        "Recording",
        "Reject",
        "ReplayReport",
        "Stores",
        "TextBlock",
        "ToolOutput",
        "ToolSpec",
        "Toolset",
        "TurnResult",
        "VerifyReport",
        "__version__",
        "is_loop_request",
        "open_stores",
        "replay_sessions",
        "verify_events",
    ],
    "foldline.loop": [
        "Agent",
        "AgentOptions",
        "AttemptDiscarded",
        "Enter",
        "ImageData",
        "Inbox",
        "InboxItem",
        "MCPServer",
        "OUTPUT_RETRY_SOURCE",
        "OutputType",
        "PreStepContext",
        "PressurePolicy",
        "ReasoningDelta",
        "Reject",
        "StepFinished",
        "StepRecord",
        "StepStarted",
        "StreamEvent",
        "TextDelta",
        "ToolArgumentsDelta",
        "ToolCallFinished",
        "ToolCallResult",
        "ToolCallStarted",
        "ToolOutput",
        "Toolset",
        "TurnFinished",
        "TurnResult",
        "TurnStream",
        "decide",
        "inject",
        "run_subagent",
    ],
    "foldline.providers": [
        "SERIALIZERS",
        "AnthropicMessagesSerializer",
        "AnthropicMessagesV2Serializer",
        "AnthropicMessagesV3Serializer",
        "AnthropicProvider",
        "Body",
        "BodyParts",
        "OpenAIChatSerializer",
        "OpenAIChatV2Serializer",
        "OpenAIProvider",
        "OpenAIResponsesProvider",
        "OpenAIResponsesSerializer",
        "OpenAIResponsesV2Serializer",
        "Provider",
        "ProviderResponse",
        "ReasoningChatProvider",
        "ReasoningChatSerializer",
        "ReasoningChatV2Serializer",
        "Serializer",
        "TransportSettings",
        "emulated_provider",
        "register_serializer",
        "registry",
        "serializer_for",
    ],
    "foldline.config": [
        "ARCHIVE_STORES",
        "BACKENDS",
        "KAFKA_SECURITY_VARIABLES",
        "SETTINGS",
        "ArchiveConfig",
        "Backend",
        "Config",
        "ConsoleConfig",
        "DispatchConfig",
        "EmbeddedConfig",
        "FoldsConfig",
        "KafkaConfig",
        "MetricsConfig",
        "ProjectorConfig",
        "ProvidersConfig",
        "RedisConfig",
        "S3Config",
        "Setting",
        "Stores",
        "masked",
        "masked_url",
        "open_stores",
        "read_client_properties",
    ],
}


@pytest.mark.parametrize("package", sorted(PUBLIC))
def test_the_exported_names_are_exactly_the_public_api(package: str) -> None:
    module = importlib.import_module(package)
    assert sorted(module.__all__) == sorted(PUBLIC[package])
    assert len(set(module.__all__)) == len(module.__all__)
    for name in module.__all__:
        assert getattr(module, name) is not None, name


def _public_namespace(module: ModuleType) -> set[str]:
    """Names the package's namespace holds that look public: not ``_``-prefixed, not a submodule (importing
    one sets it on the package), not ``from __future__ import annotations``."""
    return {
        name
        for name, value in vars(module).items()
        if not name.startswith("_") and not inspect.ismodule(value) and name != "annotations"
    }


@pytest.mark.parametrize("package", ["foldline.loop", "foldline.providers", "foldline.config"])
def test_nothing_public_is_left_out_of_all(package: str) -> None:
    module = importlib.import_module(package)
    exported = set(module.__all__) - {"registry"}  # a module exported on purpose (the serializer versions)
    assert _public_namespace(module) - exported == set()


def test_the_top_level_imports_each_name_on_first_use_and_only_those() -> None:
    import foldline

    homes = vars(foldline)["_HOMES"]
    assert sorted([*homes, "__version__"]) == sorted(foldline.__all__)
    with pytest.raises(AttributeError, match="no attribute 'Dispatcher'"):
        _ = foldline.Dispatcher


def _foldline_imports(source: str) -> list[tuple[str, str]]:
    """(module, name) of every ``from foldline... import name`` in ``source``."""
    found: list[tuple[str, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "foldline":
            found += [(node.module or "", alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            assert not any(a.name.startswith("foldline") for a in node.names), "import foldline.x: use from-imports"
    return found


def _readme_example() -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Python API") :]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None
    return match.group(1)


@pytest.mark.parametrize(
    "where", ["examples/quickstart.py", "examples/streaming.py", "examples/structured_output.py", "README.md"]
)
def test_the_examples_import_only_public_names(where: str) -> None:
    source = (ROOT / where).read_text() if where.endswith(".py") else _readme_example()
    imports = _foldline_imports(source)
    assert imports
    for module, name in imports:
        assert module in PUBLIC, f"{where} imports {name} from {module}, which is not a public package"
        assert name in PUBLIC[module], f"{where} imports {name} from {module}, which does not export it"
