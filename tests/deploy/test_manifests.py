"""Static checks of the deployment assets (deploy/README.md): every Kubernetes manifest
validates against the newest Kubernetes schema that kubernetes-validate ships, in strict mode
(an unknown or misspelt field fails); the objects agree with each other, with the entrypoint's
defaults, the Containerfile and the Prometheus scrape config (port names, probes, the key's
mount, the audit's metrics); ``promtool check config`` accepts the scrape config; and the
build script parses."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from privstream.mechanisms.seeding import NoiseKey, SecretError
from tests.integration.prometheus import ensure_prometheus

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
MANIFESTS = DEPLOY / "kubernetes"
PROMETHEUS = DEPLOY / "prometheus"
ENTRYPOINT = DEPLOY / "entrypoint.sh"
SCRIPTS = (ENTRYPOINT, DEPLOY / "build-image.sh")
K8S_VERSION = kubernetes_validate.latest_version()
# The jobs of the scrape config: (pod component, container port name) each one scrapes.
JOBS = {
    "privstream": ("flow", "metrics"),
    "privstream-internal": ("flow", "internal"),
    "privstream-audit": ("audit", "audit-metrics"),
    "privstream-shuffler": ("shuffler", "shuffler-metrics"),
}


def shuffler_pod_template() -> dict[str, Any]:
    """The shuffler's pod template (deploy/kubernetes/shuffler/statefulset.yaml)."""
    statefulset = yaml.safe_load((MANIFESTS / "shuffler" / "statefulset.yaml").read_text())
    template: dict[str, Any] = statefulset["spec"]["template"]
    return template


def manifest_files() -> list[Path]:
    return sorted(p for p in MANIFESTS.glob("*.yaml") if p.name != "kustomization.yaml")


def documents() -> list[Any]:
    """Every YAML document of the manifests, as a test parameter named file#index."""
    return [
        pytest.param(doc, id=f"{path.name}#{index}")
        for path in manifest_files()
        for index, doc in enumerate(yaml.safe_load_all(path.read_text()))
        if doc is not None
    ]


def objects() -> dict[str, dict[str, Any]]:
    """Every manifest object by kind (one of each kind in this set)."""
    found: dict[str, dict[str, Any]] = {}
    for path in manifest_files():
        for doc in yaml.safe_load_all(path.read_text()):
            assert doc["kind"] not in found, f"a second {doc['kind']} in {path.name}"
            found[doc["kind"]] = doc
    return found


def entrypoint_default(variable: str) -> str:
    """The default the entrypoint gives ``$variable`` (``${VAR:-default}``)."""
    match = re.search(rf"\${{{variable}:-([^}}]+)}}", ENTRYPOINT.read_text())
    assert match, f"deploy/entrypoint.sh has no default for {variable}"
    return match.group(1)


def flow_container() -> dict[str, Any]:
    (container,) = objects()["StatefulSet"]["spec"]["template"]["spec"]["containers"]
    return container


def audit_pod() -> dict[str, Any]:
    return objects()["CronJob"]["spec"]["jobTemplate"]["spec"]["template"]


def ports(container: dict[str, Any]) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in container["ports"]}


@pytest.mark.parametrize("doc", documents())
def test_manifest_validates_in_strict_mode(doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_kustomization_lists_every_manifest_but_the_secret_template() -> None:
    kustomization = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())
    assert kustomization["kind"] == "Kustomization"
    listed = set(kustomization["resources"])
    assert listed == {p.name for p in manifest_files()} - {"secret.yaml"}


def test_the_secret_template_holds_a_key_privstream_refuses() -> None:
    secret = objects()["Secret"]
    (placeholder,) = secret["stringData"].values()
    with pytest.raises(SecretError):
        NoiseKey.from_text(placeholder)
    volumes = flow_pod()["volumes"]
    assert {"secretName": secret["metadata"]["name"], "defaultMode": 0o400} in [
        v.get("secret") for v in volumes
    ]


def flow_pod() -> dict[str, Any]:
    spec: dict[str, Any] = objects()["StatefulSet"]["spec"]["template"]["spec"]
    return spec


def test_the_key_is_mounted_where_the_entrypoint_reads_it() -> None:
    default = Path(entrypoint_default("PRIVSTREAM_SECRET_FILE"))
    secret = objects()["Secret"]
    (key_name,) = secret["stringData"]
    mounts = {m["name"]: m for m in flow_container()["volumeMounts"]}
    (key_volume,) = [v for v in flow_pod()["volumes"] if "secret" in v]
    mount = mounts[key_volume["name"]]
    assert Path(mount["mountPath"]) / key_name == default
    assert mount["readOnly"] is True


def test_the_recovery_store_is_on_the_persistent_volume_and_kept() -> None:
    statefulset = objects()["StatefulSet"]
    (claim,) = statefulset["spec"]["volumeClaimTemplates"]
    mount = {m["name"]: m for m in flow_container()["volumeMounts"]}[claim["metadata"]["name"]]
    recovery = Path(entrypoint_default("PRIVSTREAM_RECOVERY_DIR"))
    assert Path(mount["mountPath"]) in recovery.parents
    assert statefulset["spec"]["replicas"] == 1
    assert set(statefulset["spec"]["persistentVolumeClaimRetentionPolicy"].values()) == {"Retain"}


def member_ports(processes: int) -> dict[str, int]:
    """The ports cluster member i serves (the launcher's PORT + i): ``metrics``/``internal``
    for member 0, ``metrics-i``/``internal-i`` for the others."""
    public = int(entrypoint_default("PRIVSTREAM_METRICS_PORT"))
    internal = int(entrypoint_default("PRIVSTREAM_INTERNAL_METRICS_PORT"))
    return {
        **{"metrics" + (f"-{i}" if i else ""): public + i for i in range(processes)},
        **{"internal" + (f"-{i}" if i else ""): internal + i for i in range(processes)},
    }


def test_the_entrypoint_port_defaults_let_a_cluster_start() -> None:
    """Issue 27: with 9100/9101 member 1's public port was member 0's internal one (3 of 3
    cluster starts failed). The launcher's check passes for the deployed process count."""
    from privstream.runtime.cluster import check_ports

    argv = ["--metrics-port", entrypoint_default("PRIVSTREAM_METRICS_PORT"),
            "--internal-metrics-port", entrypoint_default("PRIVSTREAM_INTERNAL_METRICS_PORT")]  # fmt: skip
    processes = flow_file().run.processes
    assert processes >= 2  # the deployed flow is a cluster: the check below means something
    check_ports(argv, 100)  # and any cluster of up to 100 members fits


def test_flow_ports_match_the_entrypoint_the_service_and_the_network_policy() -> None:
    """Every member of the configured process count has its public and internal port declared
    (the scrape jobs keep each by name: see the test below); the NetworkPolicy's ranges open
    every public port to anyone and every internal one to Prometheus only."""
    container = flow_container()
    assert ports(container) == member_ports(flow_file().run.processes)
    service = objects()["Service"]["spec"]
    assert service["clusterIP"] == "None"
    assert {p["name"]: (p["port"], p["targetPort"]) for p in service["ports"]} == {
        name: (port, name) for name, port in ports(container).items()
    }
    labels = objects()["StatefulSet"]["spec"]["template"]["metadata"]["labels"]
    assert service["selector"].items() <= labels.items()
    policy = objects()["NetworkPolicy"]["spec"]
    assert policy["podSelector"]["matchLabels"].items() <= labels.items()
    rules = {(r["ports"][0]["port"], r["ports"][0]["endPort"]): r.get("from")
             for r in policy["ingress"]}  # fmt: skip
    public, internal = sorted(rules)
    for name, port in ports(container).items():
        low, high = public if name.startswith("metrics") else internal
        assert low <= port <= high, name
    assert public[1] < internal[0]
    assert rules[public] is None  # public: anyone
    (prometheus,) = rules[internal]
    assert prometheus["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "prometheus"}


def test_probes_ask_the_public_metrics_endpoint() -> None:
    container = flow_container()
    probes = [container[k] for k in ("startupProbe", "readinessProbe", "livenessProbe")]
    for probe in probes:
        assert probe["httpGet"] == {"path": "/metrics", "port": "metrics"}
    assert container["livenessProbe"]["failureThreshold"] >= 5


def test_flow_pod_runs_as_the_image_user_without_privileges() -> None:
    uid = int(re.search(r"useradd --uid (\d+)", (DEPLOY / "Containerfile").read_text())[1])
    for pod in (flow_pod(), audit_pod()["spec"]):
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] == uid
        assert pod["enableServiceLinks"] is False  # no stray PRIVSTREAM_KAFKA_* variables
        (container,) = pod["containers"]
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert flow_pod()["securityContext"]["fsGroup"] == uid
    assert flow_pod()["terminationGracePeriodSeconds"] >= 60


def test_the_flow_runs_deploy_flow_toml_from_its_configmap() -> None:
    """The StatefulSet runs every stream of deploy/flow.toml, mounted with its registration
    table from the ConfigMap the README creates from those files."""
    env = {e["name"]: e["value"] for e in flow_container()["env"]}
    config = Path(env["PRIVSTREAM_CONFIG"])
    assert "PRIVSTREAM_FAMILY" not in env and "args" not in flow_container()
    mounts = {m["name"]: m for m in flow_container()["volumeMounts"]}
    volumes = {v["name"]: v for v in flow_pod()["volumes"]}
    (flow,) = [n for n, m in mounts.items() if m["mountPath"] == str(config.parent)]
    assert mounts[flow]["readOnly"] is True
    assert volumes[flow]["configMap"]["name"] == "privstream-flow"
    readme = (DEPLOY / "README.md").read_text()
    assert "kubectl create configmap privstream-flow" in readme
    assert f"--from-file={config.name}=deploy/flow.toml" in readme
    table = flow_file().population.registrations
    assert table is not None and f"--from-file={table.name}=deploy/{table.name}" in readme


def flow_file() -> Any:
    from privstream.flows.config import load

    return load(DEPLOY / "flow.toml")


def test_both_pods_take_kafka_settings_from_the_configmap() -> None:
    configmap = objects()["ConfigMap"]
    assert configmap["data"]["PRIVSTREAM_BOOTSTRAP"]
    for container in (flow_container(), audit_pod()["spec"]["containers"][0]):
        sources = [s.get("configMapRef", s.get("secretRef")) for s in container["envFrom"]]
        assert sources[0] == {"name": configmap["metadata"]["name"]}
        assert sources[1]["optional"] is True  # the SASL credentials, where the cluster has any


def flag_values(args: list[str]) -> dict[str, str]:
    """``--flag value`` pairs of a command line; a flag without a value maps to ""."""
    following = [*args[1:], "--"]
    return {
        arg: "" if value.startswith("--") else value
        for arg, value in zip(args, following, strict=True)
        if arg.startswith("--")
    }


def test_the_audit_cronjob_serves_its_report_on_the_audit_port() -> None:
    cronjob = objects()["CronJob"]["spec"]
    assert cronjob["concurrencyPolicy"] == "Forbid"
    pod = audit_pod()
    assert pod["metadata"]["labels"]["app.kubernetes.io/component"] == "audit"
    (container,) = pod["spec"]["containers"]
    args = container["args"]
    assert args[0] == "audit"
    flags = flag_values(args[1:])
    assert flags["--metrics-port"] == str(ports(container)["audit-metrics"]) == "9102"
    assert flags["--metrics-addr"] == "0.0.0.0"
    assert int(flags["--linger"]) > 0
    flow = flow_file()
    assert flags["--release-topic"] == flow.kafka.output_topic
    assert flags["--ledger-topic"] == flow.kafka.ledger_topic
    assert flags["--population"] == str(flow.population.users)
    assert float(flags["--max-epsilon"]) == flow.population.epsilon


def relabel(labels: dict[str, str], configs: list[dict[str, Any]]) -> dict[str, str] | None:
    """Prometheus's relabelling (actions keep, drop and replace) of one target; None when
    dropped."""
    labels = dict(labels)
    for config in configs:
        action = config.get("action", "replace")
        value = config.get("separator", ";").join(
            labels.get(name, "") for name in config.get("source_labels", [])
        )
        match = re.fullmatch(config.get("regex", "(.*)"), value)
        if action in ("keep", "drop"):
            if (match is None) == (action == "keep"):
                return None
        elif action == "replace":
            if match is not None:
                replacement = re.sub(r"\$\{?(\d+)\}?", r"\\\1", config.get("replacement", "$1"))
                labels[config["target_label"]] = match.expand(replacement)
        else:
            raise AssertionError(f"relabel action {action} is not simulated here")
    return labels


def pod_targets(pod: dict[str, Any], name: str) -> Iterator[tuple[str, dict[str, str]]]:
    """The targets Kubernetes service discovery (role: pod) makes of a running pod: one per
    container port, with the meta labels."""
    meta = {
        "__meta_kubernetes_namespace": "ns",
        "__meta_kubernetes_pod_name": name,
        "__meta_kubernetes_pod_phase": "Running",
    }
    for key, value in pod["metadata"]["labels"].items():
        meta["__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", key)] = value
    for container in pod["spec"]["containers"]:
        for port in container["ports"]:
            yield port["name"], meta | {"__meta_kubernetes_pod_container_port_name": port["name"]}


def test_each_scrape_job_keeps_exactly_its_port_of_the_manifests() -> None:
    config = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())
    assert config["rule_files"] == ["rules/*.yml"]
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert jobs.keys() == JOBS.keys()
    pods = {"flow": objects()["StatefulSet"]["spec"]["template"], "audit": audit_pod(),
            "shuffler": shuffler_pod_template()}  # fmt: skip
    for component, pod in pods.items():
        assert pod["metadata"]["labels"]["app.kubernetes.io/component"] == component
        for port, target in pod_targets(pod, f"privstream-{component}-0"):
            kept = {}
            for name, job in jobs.items():
                assert job["kubernetes_sd_configs"] == [{"role": "pod"}]
                result = relabel(target, job["relabel_configs"])
                if result is not None:
                    kept[name] = result
            member = re.sub(r"-[0-9]+$", "", port)  # metrics-1: member 1's public metrics
            expected = [j for j, (c, p) in JOBS.items() if (c, p) == (component, member)]
            assert list(kept) == expected, f"{component} port {port}"
            for labels in kept.values():
                assert labels["namespace"] == "ns"
                assert labels["pod"] == f"privstream-{component}-0"


def test_prometheus_config_passes_promtool(tmp_path: Path) -> None:
    """``promtool check config``, rules included. Debian's Prometheus is built without
    Kubernetes service discovery: there, the config is checked with each job's
    ``kubernetes_sd_configs`` replaced by a static target (the test above checks the jobs'
    discovery and relabelling against the manifests)."""
    promtool = ensure_prometheus()["promtool"]
    config = PROMETHEUS / "prometheus.yml"
    done = subprocess.run(
        [promtool, "check", "config", str(config)], capture_output=True, text=True
    )
    if "field kubernetes_sd_configs not found" in done.stdout + done.stderr:
        parsed = yaml.safe_load(config.read_text())
        for job in parsed["scrape_configs"]:
            job.pop("kubernetes_sd_configs")
            job["static_configs"] = [{"targets": ["pod.invalid:9100"]}]
        config = tmp_path / "prometheus.yml"
        config.write_text(yaml.safe_dump(parsed))
        if (PROMETHEUS / "rules").is_dir():
            (tmp_path / "rules").symlink_to(PROMETHEUS / "rules")
        done = subprocess.run(
            [promtool, "check", "config", str(config)], capture_output=True, text=True
        )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "alertmanager:9093" in config.read_text()


def test_containerfile_exposes_the_ports_and_runs_the_entrypoint() -> None:
    text = (DEPLOY / "Containerfile").read_text()
    assert "ARG BASE=docker.io/library/python:3.11-slim-bookworm" in text
    assert re.search(r"^EXPOSE 9100 9101 9102 9103 9200 9201$", text, re.M)
    assert entrypoint_default("PRIVSTREAM_SHUFFLER_METRICS_PORT") == "9103"
    target = re.search(r"^COPY deploy/entrypoint\.sh (\S+)$", text, re.M)
    assert target and f'ENTRYPOINT ["{target[1]}"]' in text
    assert re.search(r"^USER 10001:10001$", text, re.M)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_scripts_parse_and_are_executable(script: Path) -> None:
    assert script.stat().st_mode & 0o111 == 0o111, f"chmod 755 {script}"
    assert script.read_text().startswith("#!/bin/sh\n")
    done = subprocess.run(["sh", "-n", str(script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_make_image_runs_the_build_script_and_its_outputs_are_ignored() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^image: .*## .+\n\tdeploy/build-image\.sh$", makefile, re.M)
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    paths = ["dist/privstream-0.1.0-py3-none-any.whl", "build/image/rootfs.tar"]
    done = subprocess.run(["git", "check-ignore", *paths], cwd=ROOT, capture_output=True, text=True)
    assert done.stdout.split() == paths


def test_the_clock_deployment_holds_the_clock_key_and_never_the_noise_key() -> None:
    """Issue 18 §1: a flow on Kafka closes slots only on markers tagged with the clock key, so
    the deployment ships the writer of those markers; it runs the entrypoint's ``clock`` mode
    over the same flow file and mounts the clock key where the entrypoint reads it, never the
    noise key (which would let it remove the noise)."""
    pod = objects()["Deployment"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["args"] == ["clock"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["PRIVSTREAM_CONFIG"] == flow_container_env()["PRIVSTREAM_CONFIG"]
    secrets_mounted = {v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    assert secrets_mounted == {"privstream-ldp-ids-clock-key"}
    assert objects()["Secret"]["metadata"]["name"] not in secrets_mounted
    (key_volume,) = [v for v in pod["volumes"] if "secret" in v]
    mount = {m["name"]: m for m in container["volumeMounts"]}[key_volume["name"]]
    default = Path(entrypoint_default("PRIVSTREAM_CLOCK_KEY_FILE"))
    assert Path(mount["mountPath"]) == default.parent and mount["readOnly"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["securityContext"]["runAsNonRoot"] is True


def flow_container_env() -> dict[str, str]:
    return {e["name"]: e["value"] for e in flow_container()["env"] if "value" in e}
