"""The base install runs the embedded default; each server backend is an extra that names itself when missing.

The processes here run with the modules of every extra made unimportable (a meta-path finder that refuses
them, as if they were not installed): the embedded default — the demo, verify, export and import, doctor, the
library's quickstart — runs; a command or library call that needs an extra fails with one typed line naming
it (``pip install 'foldline[<extra>]'``). ``make demo`` and ``make test`` install ``.[dev]``, which holds every
extra.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from foldline.config.extras import EXTRAS
from tests.adversarial.helpers import cli_env

ROOT = Path(__file__).resolve().parents[1]
EVERY_EXTRA = sorted({m.partition(".")[0] for modules in EXTRAS.values() for m in modules} | {"hiredis", "s3transfer"})

_BLOCKER = """
import importlib.abc, sys
BLOCKED = set(sys.argv[1].split(","))
class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, NotInstalled())
"""


def _run(blocked: list[str], code: str, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _BLOCKER + code, ",".join(blocked), *args],
        capture_output=True,
        text=True,
        env=cli_env(FOLDLINE_ARCHIVE="off"),
        cwd=cwd,
        timeout=300,
        check=False,
    )


def _cli(blocked: list[str], *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    code = "sys.argv = ['foldline', *sys.argv[2:]]\nfrom foldline.cli.main import main\nmain()\n"
    return _run(blocked, code, *args, cwd=cwd)


def test_the_embedded_default_runs_with_no_extra_installed(tmp_path: Path) -> None:
    data = str(tmp_path / "data")
    for args in (
        ("demo", "--sessions", "2", "--steps", "2", "--data-dir", data, "--json"),
        ("verify", "--data-dir", data),
        ("show", "demo-000", "--data-dir", data),
        ("requests", "demo-000", "--data-dir", data),
        ("export", "demo-000", "--out", str(tmp_path / "s.jsonl"), "--data-dir", data),
        ("import", str(tmp_path / "s.jsonl"), "--as", "copy", "--data-dir", data),
        ("resume", "copy", "--steps", "1", "--data-dir", data),
        ("doctor", "--data-dir", data),
        ("replay", "--all", "--data-dir", data),
        ("config",),
    ):
        out = _cli(EVERY_EXTRA, *args)
        assert out.returncode == 0, (args, out.stdout[-500:], out.stderr[-2000:])
    quickstart = _run(
        EVERY_EXTRA, f"import runpy\nrunpy.run_path({str(ROOT / 'examples' / 'quickstart.py')!r})", cwd=tmp_path
    )
    assert quickstart.returncode == 0, quickstart.stderr[-2000:]


@pytest.mark.parametrize(
    ("blocked", "args", "extra"),
    [
        (EVERY_EXTRA, ("demo", "--backend", "distributed", "--sessions", "1", "--steps", "1"), "kafka"),
        (EVERY_EXTRA, ("verify", "--backend", "kafka"), "kafka"),
        (EVERY_EXTRA, ("projector",), "kafka"),
        (["redis", "hiredis"], ("dispatcher",), "redis"),
        (["boto3", "botocore", "s3transfer"], ("dispatcher",), "s3"),
        (["faust", "mode", "aiokafka"], ("projector", "--runtime", "faust"), "faust"),
        (["fastavro"], ("restore",), "archive"),
        (["opentelemetry"], ("sessions",), "otel"),  # tracing asked for (OTEL_TRACES_EXPORTER) but not installed
    ],
)
def test_a_missing_extra_is_one_line_naming_it(blocked: list[str], args: tuple[str, ...], extra: str) -> None:
    extra_env = {"FOLDLINE_ARCHIVE": "dir", "FOLDLINE_ARCHIVE_DIR": "/nonexistent"} if extra == "archive" else {}
    if extra == "otel":
        extra_env = {"OTEL_TRACES_EXPORTER": "otlp"}
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            _BLOCKER + "sys.argv = ['foldline', *sys.argv[2:]]\nfrom foldline.cli.main import main\nmain()\n",
            ",".join(blocked),
            *args,
        ],
        capture_output=True,
        text=True,
        env=cli_env(FOLDLINE_REDIS_URL="redis://127.0.0.1:1/0", FOLDLINE_KAFKA_BOOTSTRAP="127.0.0.1:1", **extra_env),
        timeout=120,
        check=False,
    )
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 2, (out.stdout[-500:], out.stderr[-2000:])
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("error: MissingExtra: "), lines[0]
    assert f"pip install 'foldline[{extra}]'" in lines[0]


def test_the_library_names_the_extra_a_configuration_needs() -> None:
    code = (
        "from foldline import Config, open_stores\n"
        "from foldline.errors import MissingExtra\n"
        "for backend, extra in (('kafka', 'kafka'), ('distributed', 'kafka')):\n"
        "    try:\n"
        "        open_stores(Config(backend=backend))\n"
        "    except MissingExtra as exc:\n"
        "        assert exc.extra == extra, exc\n"
        "    else:\n"
        "        raise AssertionError(backend)\n"
        "print('ok')\n"
    )
    out = _run(EVERY_EXTRA, code)
    assert (out.returncode, out.stdout.strip()) == (0, "ok"), out.stderr[-2000:]


def test_the_package_declares_the_extras_and_make_installs_them_all() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = " ".join(project["dependencies"])
    for vendor in ("confluent-kafka", "faust", "redis", "boto3", "fastavro", "mcp", "opentelemetry"):
        assert vendor not in base, vendor
    extras = project["optional-dependencies"]
    assert {"kafka", "redis", "s3", "archive", "faust", "mcp", "console", "otel", "distributed", "dev"} <= set(extras)
    assert extras["console"] == ["starlette>=0.40", "uvicorn>=0.30", "jinja2>=3.1"]
    assert extras["distributed"] == ["foldline[kafka,redis,s3,archive]"]
    assert "foldline[distributed,faust,mcp,console,otel]" in extras["dev"]
    assert all(d.startswith("opentelemetry-") for d in extras["otel"])
    assert "-e '.[dev]'" in (ROOT / "Makefile").read_text()  # make demo and make test: everything
