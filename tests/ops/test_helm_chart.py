"""helm/foldline: lint, render, validate every manifest against Kubernetes and CRD schemas, one rule source."""

from __future__ import annotations

import json
import sys
import tarfile
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from foldline.config import Config

from .conftest import KUBE_VERSION, REPO, DeployTools, run

CHART = REPO / "helm" / "foldline"
RULE_FILE = REPO / "deploy" / "prometheus" / "rules" / "foldline.rules.yml"
MONITORING = "monitoring.coreos.com/v1"

VARIANTS: dict[str, list[str]] = {
    "defaults": [],
    "autoscaled, existing secret, real providers": [
        "--set", "projector.autoscaling.enabled=true",
        "--set", "dispatcher.autoscaling.enabled=true",
        "--set", "archiver.autoscaling.enabled=true",
        "--set", "secret.existingSecret=foldline-credentials",
        "--set", "dispatcher.anthropicUrl=https://api.anthropic.com",
        "--set", "dispatcher.openaiUrl=https://api.openai.com",
        "--set", "config.s3Endpoint=http://minio:9000",
        "--set", "config.extraEnv.FOLDLINE_FOLD_PREFIX=prod:fold:",
    ],
    "SASL_SSL with a CA, client properties, a named group": [
        "--set", "config.kafkaSecurityProtocol=SASL_SSL",
        "--set", "config.kafkaSaslMechanism=SCRAM-SHA-512",
        "--set", "config.kafkaPartitions=6",
        "--set-string", "config.kafkaClientProperties.socket\\.keepalive\\.enable=true",
        "--set-string", "config.kafkaClientProperties.ssl\\.endpoint\\.identification\\.algorithm=https",
        "--set", "secret.kafkaSaslUsername=foldline",
        "--set", "secret.kafkaSaslPassword=s3cr3t-pw",
        "--set-file", f"secret.kafkaCaPem={REPO / 'tests' / 'ops' / 'fixtures' / 'kafka-ca.pem'}",
        "--set", "projector.group=prod-projectors",
    ],
    "no operator objects, no PDBs, dispatcher only": [
        "--set", "serviceMonitor.enabled=false",
        "--set", "prometheusRule.enabled=false",
        "--set", "projector.enabled=false",
        "--set", "archiver.enabled=false",
        "--set", "archive.enabled=false",
        "--set", "dispatcher.podDisruptionBudget.enabled=false",
    ],
}  # fmt: skip


def render(tools: DeployTools, *args: str) -> list[dict[str, Any]]:
    done = run(tools.helm, "template", "fl", CHART, "--namespace", "agents", "--kube-version", KUBE_VERSION, *args)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def test_helm_lint_strict(deploy_tools: DeployTools) -> None:
    done = run(deploy_tools.helm, "lint", "--strict", CHART, "--kube-version", KUBE_VERSION)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in done.stdout


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_rendered_manifest_is_valid(deploy_tools: DeployTools, variant: str, tmp_path: Path) -> None:
    docs = render(deploy_tools, *VARIANTS[variant])
    core = [d for d in docs if d["apiVersion"] != MONITORING]
    operator = [d for d in docs if d["apiVersion"] == MONITORING]
    manifest = tmp_path / "core.yaml"
    manifest.write_text(yaml.safe_dump_all(core))
    done = run(
        deploy_tools.kubeconform, "-strict", "-summary", "-output", "json",
        "-kubernetes-version", KUBE_VERSION, "-schema-location", deploy_tools.schema_location, manifest,
    )  # fmt: skip
    report = json.loads(done.stdout)
    assert done.returncode == 0, done.stdout + done.stderr
    assert report["summary"] == {"valid": len(core), "invalid": 0, "errors": 0, "skipped": 0}, report
    if operator:
        done = run(
            deploy_tools.node, REPO / "deploy" / "local" / "validate-crds.mjs", deploy_tools.crd_models,
            stdin=json.dumps(operator),
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout.count(": valid") == len(operator), done.stdout


def test_validators_reject_broken_manifests(deploy_tools: DeployTools, tmp_path: Path) -> None:
    """The validation above can fail: a misspelt field and a bad rule duration are caught."""
    [deployment, *_] = by_kind(render(deploy_tools), "Deployment")
    deployment["spec"]["replica"] = 3
    manifest = tmp_path / "bad.yaml"
    manifest.write_text(yaml.safe_dump(deployment))
    done = run(
        deploy_tools.kubeconform, "-strict", "-kubernetes-version", KUBE_VERSION,
        "-schema-location", deploy_tools.schema_location, manifest,
    )  # fmt: skip
    assert done.returncode != 0
    assert "additional properties 'replica' not allowed" in done.stdout
    [rule] = by_kind(render(deploy_tools), "PrometheusRule")
    rule["spec"]["groups"][1]["rules"][0]["for"] = "a minute"
    done = run(
        deploy_tools.node, REPO / "deploy" / "local" / "validate-crds.mjs", deploy_tools.crd_models,
        stdin=json.dumps([rule]),
    )  # fmt: skip
    assert done.returncode == 1
    assert "INVALID" in done.stdout


def test_values_schema_rejects_bad_values(deploy_tools: DeployTools) -> None:
    for bad, message in (
        (["--set", "metrics.port=80"], "/metrics/port"),
        (["--set", "dispatcher.replicaz=2"], "replicaz"),
        (["--set", "config.backend=embedded"], "/config/backend"),
        (["--set", "secret.redisUrl=localhost:6379"], "/secret/redisUrl"),
        (["--set", "config.kafkaSecurityProtocol=TLS"], "/config/kafkaSecurityProtocol"),
        (["--set", "config.kafkaSecurityProtocol=SASL_SSL"], "/config/kafkaSaslMechanism"),
        (["--set", "secret.kafkaCaPem=not a certificate"], "/secret/kafkaCaPem"),
        (["--set", "archive.maxDelaySeconds=0"], "/archive/maxDelaySeconds"),
        (["--set", "config.kafkaMinInsyncReplicas=0"], "/config/kafkaMinInsyncReplicas"),
        (["--set", "archiver.concurrenzy=4"], "concurrenzy"),
        (["--set-string", "config.kafkaClientProperties.sasl\\.password=x"], "sasl.password"),
    ):
        done = run(deploy_tools.helm, "template", "fl", CHART, "--kube-version", KUBE_VERSION, *bad)
        assert done.returncode != 0, bad
        assert "values don't meet the specifications of the schema" in done.stderr
        assert message in done.stderr, done.stderr


def test_prometheus_rule_is_the_rule_file(deploy_tools: DeployTools) -> None:
    link = CHART / "files" / "foldline.rules.yml"
    assert link.is_symlink(), "helm/foldline/files/foldline.rules.yml must link to the rule file, not copy it"
    assert link.resolve() == RULE_FILE.resolve()
    [rule] = by_kind(render(deploy_tools), "PrometheusRule")
    assert rule["spec"] == yaml.safe_load(RULE_FILE.read_text())
    assert rule["metadata"]["labels"]["app.kubernetes.io/name"] == "foldline"
    [labelled] = by_kind(render(deploy_tools, "--set", "prometheusRule.labels.release=kube-prom"), "PrometheusRule")
    assert labelled["metadata"]["labels"]["release"] == "kube-prom"
    assert labelled["spec"] == rule["spec"]


def test_alerts_link_to_the_console_when_its_address_is_set(deploy_tools: DeployTools) -> None:
    plain = yaml.safe_load(RULE_FILE.read_text())
    [rule] = by_kind(
        render(deploy_tools, "--set", "prometheusRule.consoleUrl=https://console.example.com/"), "PrometheusRule"
    )
    alerts = 0
    for group, original in zip(rule["spec"]["groups"], plain["groups"], strict=True):
        for linked, before in zip(group["rules"], original["rules"], strict=True):
            if "alert" not in before:
                assert linked == before
                continue
            alerts += 1
            url = linked["annotations"].pop("console_url")
            assert url == f"https://console.example.com/fleet?alert={before['alert']}"
            assert linked == before  # nothing else changed
    assert alerts >= 8
    done = run(
        deploy_tools.helm,
        "template",
        "fl",
        CHART,
        "--kube-version",
        KUBE_VERSION,
        "--set",
        "prometheusRule.consoleUrl=console.example.com",
    )
    assert done.returncode != 0
    assert "/prometheusRule/consoleUrl" in done.stderr


def test_workers_are_probed_scraped_and_configured(deploy_tools: DeployTools) -> None:
    docs = render(deploy_tools, "--set", "metrics.port=9500")
    deployments = {d["metadata"]["labels"]["app.kubernetes.io/component"]: d for d in by_kind(docs, "Deployment")}
    assert set(deployments) == {"projector", "dispatcher", "archiver"}
    assert deployments["projector"]["spec"]["replicas"] == 3
    assert deployments["dispatcher"]["spec"]["replicas"] == 2
    assert deployments["archiver"]["spec"]["replicas"] == 2
    for name, d in deployments.items():
        [c] = d["spec"]["template"]["spec"]["containers"]
        assert c["command"] == ["foldline"]
        assert c["args"][0] == name
        assert c["args"][c["args"].index("--metrics-port") + 1] == "9500"
        assert c["args"][c["args"].index("--metrics-host") + 1] == "0.0.0.0"
        assert c["ports"] == [{"name": "metrics", "containerPort": 9500, "protocol": "TCP"}]
        assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
        assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
        assert c["resources"]["limits"]
        assert c["resources"]["requests"]
        assert list(c["envFrom"]) == [
            {"configMapRef": {"name": "fl-foldline"}},
            {"secretRef": {"name": "fl-foldline"}},
        ]
        assert c["securityContext"]["readOnlyRootFilesystem"] is True
    [config] = by_kind(docs, "ConfigMap")
    assert config["data"]["FOLDLINE_BACKEND"] == "distributed"
    assert config["data"]["FOLDLINE_KAFKA_PARTITIONS"] == "12"
    assert config["data"]["FOLDLINE_KAFKA_REPLICATION_FACTOR"] == "3"
    assert config["data"]["FOLDLINE_KAFKA_MIN_INSYNC_REPLICAS"] == "2"
    assert config["data"]["FOLDLINE_ARCHIVE"] == "s3"
    [secret] = by_kind(docs, "Secret")
    assert set(secret["stringData"]) == {"FOLDLINE_REDIS_URL"}  # empty credentials are not rendered
    services = by_kind(docs, "Service")
    assert {s["spec"]["selector"]["app.kubernetes.io/component"] for s in services} == {
        "projector",
        "dispatcher",
        "archiver",
    }
    assert all(s["spec"]["ports"][0]["name"] == "metrics" for s in services)
    [monitor] = by_kind(docs, "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    assert monitor["spec"]["selector"]["matchExpressions"][0]["values"] == ["projector", "dispatcher", "archiver"]
    pdbs = by_kind(docs, "PodDisruptionBudget")
    assert sorted(p["spec"]["maxUnavailable"] for p in pdbs) == [1, 1, 1]
    assert not by_kind(docs, "HorizontalPodAutoscaler")


def test_autoscaling_and_an_existing_secret(deploy_tools: DeployTools) -> None:
    docs = render(deploy_tools, *VARIANTS["autoscaled, existing secret, real providers"])
    hpas = by_kind(docs, "HorizontalPodAutoscaler")
    assert sorted(h["spec"]["scaleTargetRef"]["name"] for h in hpas) == [
        "fl-foldline-archiver",
        "fl-foldline-dispatcher",
        "fl-foldline-projector",
    ]
    for d in by_kind(docs, "Deployment"):
        assert "replicas" not in d["spec"]  # the HPA owns it
        [c] = d["spec"]["template"]["spec"]["containers"]
        assert {"secretRef": {"name": "foldline-credentials"}} in c["envFrom"]
    assert not by_kind(docs, "Secret")
    [dispatcher] = [d for d in by_kind(docs, "Deployment") if d["metadata"]["name"].endswith("dispatcher")]
    args = dispatcher["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--anthropic-url") + 1] == "https://api.anthropic.com"
    assert args[args.index("--openai-url") + 1] == "https://api.openai.com"
    [config] = by_kind(docs, "ConfigMap")
    assert config["data"]["FOLDLINE_S3_ENDPOINT"] == "http://minio:9000"


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_the_worker_command_lines_are_accepted_by_the_cli(deploy_tools: DeployTools, variant: str) -> None:
    """Every option the chart passes exists (click rejects an unknown option even with --help)."""
    foldline = Path(sys.executable).with_name("foldline")
    for d in by_kind(render(deploy_tools, *VARIANTS[variant]), "Deployment"):
        [c] = d["spec"]["template"]["spec"]["containers"]
        done = run(foldline, *c["args"], "--help")
        assert done.returncode == 0, f"{c['args']}: {done.stdout}{done.stderr}"


def test_the_packaged_chart_carries_the_rule_file_itself(deploy_tools: DeployTools, tmp_path: Path) -> None:
    done = run(deploy_tools.helm, "package", CHART, "--destination", tmp_path)
    assert done.returncode == 0, done.stderr
    [archive] = tmp_path.glob("foldline-*.tgz")
    with tarfile.open(archive) as tar:
        member = tar.getmember("foldline/files/foldline.rules.yml")
        assert member.isfile()  # the link's target, not a link
        extracted = tar.extractfile(member)
        assert extracted is not None
        assert extracted.read() == RULE_FILE.read_bytes()


def test_the_default_image_tag_is_the_package_version() -> None:
    """The chart runs ``foldline:<appVersion>``; the Dockerfile builds the package at pyproject's version."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert chart["appVersion"] == project["version"]
    dockerfile = (REPO / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["foldline"]' in dockerfile
    copied = {part for line in dockerfile.splitlines() if line.startswith("COPY ") for part in line.split()[1:-1]}
    assert {"pyproject.toml", "README.md", "services", "schemas"} <= copied  # everything the wheel build reads


def test_the_rendered_environment_is_the_configuration_foldline_reads(
    deploy_tools: DeployTools, tmp_path: Path
) -> None:
    """ConfigMap + Secret + the mounted client-properties file, read by Config.from_env as a pod would."""
    docs = render(deploy_tools, *VARIANTS["SASL_SSL with a CA, client properties, a named group"])
    configmaps = {d["metadata"]["name"]: d for d in by_kind(docs, "ConfigMap")}
    [secret] = by_kind(docs, "Secret")
    env = {**configmaps["fl-foldline"]["data"], **secret["stringData"]}
    mounted = env["FOLDLINE_KAFKA_CLIENT_PROPERTIES"]
    properties = tmp_path / "client.properties"
    properties.write_text(configmaps["fl-foldline-kafka"]["data"]["client.properties"])
    config = Config.from_env({**env, "FOLDLINE_KAFKA_CLIENT_PROPERTIES": str(properties)})
    assert config.kafka.partitions == 6
    assert config.kafka.librdkafka() == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "foldline",
        "sasl.password": "s3cr3t-pw",
        "ssl.ca.pem": (REPO / "tests" / "ops" / "fixtures" / "kafka-ca.pem").read_text(),
        "socket.keepalive.enable": "true",
        "ssl.endpoint.identification.algorithm": "https",
    }
    for d in by_kind(docs, "Deployment"):
        pod = d["spec"]["template"]["spec"]
        [c] = pod["containers"]
        [mount] = [m for m in c["volumeMounts"] if m["name"] == "kafka-properties"]
        assert Path(mount["mountPath"]) / "client.properties" == Path(mounted)
        [volume] = [v for v in pod["volumes"] if v["name"] == "kafka-properties"]
        assert volume["configMap"]["name"] == "fl-foldline-kafka"
        if c["args"][0] == "projector":
            assert c["args"][c["args"].index("--group") + 1] == "prod-projectors"
    assert "s3cr3t-pw" not in json.dumps([configmaps, [d for d in docs if d["kind"] != "Secret"]])
    [projector] = [
        d for d in by_kind(render(deploy_tools), "Deployment") if d["metadata"]["name"].endswith("projector")
    ]
    assert "--group" not in projector["spec"]["template"]["spec"]["containers"][0]["args"]  # foldline's default group


def test_the_charts_topics_and_archive_pass_the_start_up_check(deploy_tools: DeployTools) -> None:
    """Defaults of a production cluster: three replicas, two in sync, a week of retention behind an archive whose
    maximum delay fits twice into it — the policy every worker checks the topic against; with the archive off,
    topics are created to keep events forever."""
    from foldline.config.factories import topic_policy

    def config_of(*args: str) -> Config:
        [configmap] = [
            d for d in by_kind(render(deploy_tools, *args), "ConfigMap") if d["metadata"]["name"] == "fl-foldline"
        ]
        return Config.from_env(configmap["data"])

    config = config_of()
    policy = topic_policy(config)
    assert (policy.replication_factor, policy.min_insync_replicas) == (3, 2)
    assert config.archive.enabled
    assert config.archive.bucket == "foldline-archive"
    assert policy.min_retention_ms is not None
    assert policy.created_retention_ms() == 604_800_000 >= policy.min_retention_ms
    off = topic_policy(config_of("--set", "archive.enabled=false"))
    assert not off.archived
    assert off.created_retention_ms() == -1
    [archiver] = [
        d
        for d in by_kind(render(deploy_tools, "--set", "archiver.group=prod-archivers"), "Deployment")
        if d["metadata"]["name"].endswith("archiver")
    ]
    args = archiver["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:1] == ["archiver"]
    assert args[args.index("--group") + 1] == "prod-archivers"
