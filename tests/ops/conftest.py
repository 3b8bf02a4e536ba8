"""The deployment tools the ops tests run: installed by deploy/local scripts on first use, never skipped.

``deploy_tools`` runs ``deploy/local/promtool.sh install`` and ``deploy/local/helm.sh install`` once per
session (a no-op when everything is there; a cold helm build takes about two minutes). When an install
fails, every test that needs the tools fails with the script to run and its error output.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
KUBE_VERSION = "1.31.0"  # deploy/local/helm.sh unpacks the schemas of this version (FOLDLINE_KUBE_VERSION)


@dataclass(frozen=True)
class DeployTools:
    promtool: Path
    helm: Path
    kubeconform: Path
    kube_schemas: Path
    crd_models: Path
    node: Path

    @property
    def schema_location(self) -> str:
        layout = "{{ .NormalizedKubernetesVersion }}-standalone{{ .StrictSuffix }}/{{ .ResourceKind }}{{ .KindSuffix }}"
        return f"{self.kube_schemas}/{layout}.json"


def run(*args: str | Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run a tool from the repository root; the caller asserts on the exit status and output."""
    return subprocess.run(
        [str(a) for a in args], input=stdin, capture_output=True, text=True, timeout=300, check=False, cwd=REPO
    )


def _install(script: str) -> list[str]:
    path = REPO / "deploy" / "local" / script
    try:
        done = subprocess.run(
            ["bash", str(path), "install"], capture_output=True, text=True, timeout=900, check=False, cwd=REPO
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"`deploy/local/{script} install` did not finish in 15 minutes")
    if done.returncode != 0:
        pytest.fail(
            f"`deploy/local/{script} install` failed (exit {done.returncode}); it installs the tools these tests "
            f"run. Its output:\n{done.stderr[-3000:]}"
        )
    return done.stdout.strip().splitlines()


@pytest.fixture(scope="session")
def deploy_tools() -> DeployTools:
    [promtool] = _install("promtool.sh")[-1:]
    helm, kubeconform, kube_schemas, crd_models = _install("helm.sh")[-4:]
    node = shutil.which("node")
    if node is None:
        pytest.fail("node (Node.js) is not on PATH; it runs deploy/local/validate-crds.mjs (apt-get install nodejs)")
    tools = DeployTools(Path(promtool), Path(helm), Path(kubeconform), Path(kube_schemas), Path(crd_models), Path(node))
    for name in ("promtool", "helm", "kubeconform", "node"):
        if not getattr(tools, name).exists():
            pytest.fail(f"{name} not found at {getattr(tools, name)} after `deploy/local/*.sh install`")
    return tools
