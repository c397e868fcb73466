"""Static checks of the shuffler's deployment (deploy/kubernetes/shuffler, deploy/README.md "The
shuffler"), its own trust domain: every manifest validates against the Kubernetes schema in
strict mode; everything lives in its own namespace; no pod there can read the server's noise
key (no reference to its Secret, no noise key variable, only the clock key mounted) and no
server pod references the shuffler's Secrets; the container's command line, as the entrypoint
builds it, parses with privstream's own parser and agrees with the volume, the port and the
Secret's mount; the entrypoint refuses a shuffler that could read the noise key; the
NetworkPolicy admits only Prometheus from the monitoring namespace and lets out only DNS and
Kafka; and the README's server of this mode reads the shuffler's topics and never the report
topic."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from privstream.cli import shuffled_run
from privstream.cli.commands import _parser
from privstream.families.registry import FAMILIES
from privstream.mechanisms.seeding import SecretError, clock_key_from_text

from .test_manifests import (
    DEPLOY,
    ENTRYPOINT,
    K8S_VERSION,
    MANIFESTS,
    entrypoint_default,
    flag_values,
    manifest_files,
)
from .test_manifests import objects as server_objects

SHUFFLER = MANIFESTS / "shuffler"
POD = "shuffler-0"  # the StatefulSet's one pod: its name is the shuffler's id


def shuffler_files() -> list[Path]:
    return sorted(p for p in SHUFFLER.glob("*.yaml") if p.name != "kustomization.yaml")


def kustomization() -> dict[str, Any]:
    found: dict[str, Any] = yaml.safe_load((SHUFFLER / "kustomization.yaml").read_text())
    return found


def objects() -> dict[str, dict[str, Any]]:
    """Every shuffler manifest object by kind (one of each kind in this set)."""
    found: dict[str, dict[str, Any]] = {}
    for path in shuffler_files():
        for doc in yaml.safe_load_all(path.read_text()):
            assert doc["kind"] not in found, f"a second {doc['kind']} in {path.name}"
            found[doc["kind"]] = doc
    return found


def pod(kind: str) -> dict[str, Any]:
    spec: dict[str, Any] = objects()[kind]["spec"]["template"]["spec"]
    return spec


def container(kind: str = "StatefulSet") -> dict[str, Any]:
    (only,) = pod(kind)["containers"]
    return only


def pods() -> list[dict[str, Any]]:
    return [pod("StatefulSet"), pod("Deployment")]


@pytest.mark.parametrize(
    "doc",
    [
        pytest.param(doc, id=f"{path.name}#{index}")
        for path in shuffler_files()
        for index, doc in enumerate(yaml.safe_load_all(path.read_text()))
    ],
)
def test_shuffler_manifest_validates_in_strict_mode(doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_everything_is_in_the_shufflers_own_namespace() -> None:
    """The kustomization lists every manifest but the Secret template and sets the namespace
    that every object names and the Namespace object makes; the server's manifests name
    neither it nor any of its objects."""
    namespace = kustomization()["namespace"]
    assert set(kustomization()["resources"]) == {p.name for p in shuffler_files()} - {"secret.yaml"}
    assert objects()["Namespace"]["metadata"]["name"] == namespace == "privstream-shuffler"
    labels = objects()["Namespace"]["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    for kind, obj in objects().items():
        if kind != "Namespace":
            assert obj["metadata"]["namespace"] == namespace, kind
    server = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())
    assert server.get("namespace") != namespace
    for path in manifest_files():
        assert namespace not in path.read_text(), path.name
    for obj in server_objects().values():
        assert obj["metadata"].get("namespace") != namespace


def secrets_named(obj: Any) -> set[str]:
    """Every Secret a pod spec (or any object) names: volumes, envFrom, env valueFrom."""
    found: set[str] = set()
    if isinstance(obj, dict):
        if isinstance(obj.get("secret"), dict):
            found.add(obj["secret"]["secretName"])
        for key in ("secretRef", "secretKeyRef"):
            if isinstance(obj.get(key), dict):
                found.add(obj[key]["name"])
        for value in obj.values():
            found |= secrets_named(value)
    elif isinstance(obj, list):
        for value in obj:
            found |= secrets_named(value)
    return found


def test_no_shuffler_pod_can_read_the_noise_key() -> None:
    """Issue 25: the shuffler knows who sent what, so it must never hold the server's noise key.
    Its pods mount only the clock key (where the entrypoint reads it) and name only the
    shuffler's own Secrets; no noise key variable; no API token to fetch any Secret with."""
    noise_secret = server_objects()["Secret"]["metadata"]["name"]
    clock_secret = objects()["Secret"]["metadata"]["name"]
    own = {clock_secret, "privstream-shuffler-kafka-credentials",
           "privstream-shuffler-clock-kafka-credentials"}  # fmt: skip
    for path in shuffler_files():
        assert noise_secret not in path.read_text() and "noise" not in path.name
    for spec in pods():
        assert secrets_named(spec) <= own
        mounted = {v["secret"]["secretName"] for v in spec["volumes"] if "secret" in v}
        assert mounted == {clock_secret}
        (only,) = spec["containers"]
        names = {e["name"] for e in only.get("env", ())}
        assert not names & {"PRIVSTREAM_SECRET", "PRIVSTREAM_SECRET_FILE"}
        assert "--secret-file" not in only["args"] and "--insecure-seed" not in only["args"]
        assert spec["automountServiceAccountToken"] is False
        assert spec["serviceAccountName"] == objects()["ServiceAccount"]["metadata"]["name"]
        mount = {m["name"]: m for m in only["volumeMounts"]}[
            next(v["name"] for v in spec["volumes"] if "secret" in v)
        ]
        (key_name,) = objects()["Secret"]["stringData"]
        default = Path(entrypoint_default("PRIVSTREAM_CLOCK_KEY_FILE"))
        assert Path(mount["mountPath"]) / key_name == default and mount["readOnly"] is True
    assert objects()["ServiceAccount"]["automountServiceAccountToken"] is False
    for server_pod in server_objects().values():
        assert not secrets_named(server_pod) & own
    with pytest.raises(SecretError):  # the template's placeholder starts nothing
        clock_key_from_text(objects()["Secret"]["stringData"]["clock.key"])


def test_no_server_pod_holds_an_api_token() -> None:
    """The other direction: the namespace boundary keeps the shuffler's Secrets from the
    server's pods only if those hold no API credential to ask for them (RBAC aside, which
    deploy/README.md has the operators check): the flow, its clock and its audit mount none."""
    server = server_objects()
    specs = [server["StatefulSet"]["spec"]["template"]["spec"],
             server["Deployment"]["spec"]["template"]["spec"],
             server["CronJob"]["spec"]["jobTemplate"]["spec"]["template"]["spec"]]  # fmt: skip
    for spec in specs:
        assert spec["automountServiceAccountToken"] is False


def entrypoint_argv(
    tmp_path: Path, args: list[str], **env: str
) -> subprocess.CompletedProcess[str]:
    """Run deploy/entrypoint.sh with ``args`` and ``env`` over a stand-in ``privstream`` that
    writes the argv it was given, one argument a line, to ``tmp_path / "argv"``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    stub = bin_dir / "privstream"
    stub.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > "{tmp_path / "argv"}"\n')
    stub.chmod(0o755)
    base = {"PATH": f"{bin_dir}{os.pathsep}/usr/bin:/bin", "HOME": str(tmp_path)}
    return subprocess.run([str(ENTRYPOINT), *args], env={**base, **env}, capture_output=True,
                          text=True, timeout=30)  # fmt: skip


def container_env(spec: dict[str, Any]) -> dict[str, str]:
    """The container's environment as the kubelet sets it (``metadata.name`` is ``POD``)."""
    env = {}
    for e in spec.get("env", ()):
        if "value" in e:
            env[e["name"]] = e["value"]
        else:
            assert e["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}, e
            env[e["name"]] = POD
    return env


def test_the_shuffler_runs_with_flags_the_cli_parses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The StatefulSet's args through the entrypoint, as the container runs them, parsed by
    ``privstream``'s own parser: the shuffler's topics, id = the pod's name, its store on the
    volume, its metrics on the declared port, the clock key file and no noise key."""
    spec = container()
    key = tmp_path / "clock.key"
    key.write_text("ab" * 32 + "\n")
    env = {**container_env(spec), "PRIVSTREAM_CLOCK_KEY_FILE": str(key),
           "PRIVSTREAM_SECRET_FILE": str(tmp_path / "no-noise.key")}  # fmt: skip
    done = entrypoint_argv(tmp_path, spec["args"], **env)
    assert done.returncode == 0, done.stderr
    argv = (tmp_path / "argv").read_text().splitlines()
    # Kafka from the ConfigMap (envFrom), as privstream reads it: no --bootstrap needed
    monkeypatch.setenv(
        "PRIVSTREAM_BOOTSTRAP", objects()["ConfigMap"]["data"]["PRIVSTREAM_BOOTSTRAP"]
    )
    args = _parser().parse_args(argv)
    assert args.command == "shuffler"
    flags = flag_values(spec["args"][1:])
    assert (args.report_topic, args.task_topic, args.shuffled_topic, args.dead_letter_topic) == (
        flags["--report-topic"], flags["--task-topic"], flags["--shuffled-topic"],
        flags["--dead-letter-topic"],
    )  # fmt: skip
    assert (
        len({args.report_topic, args.task_topic, args.shuffled_topic, args.dead_letter_topic}) == 4
    )
    assert args.shuffler_id == POD
    assert args.clock_key_file == str(key)
    assert args.secret_file is None and args.insecure_seed is None
    assert args.metrics_addr == "0.0.0.0"
    assert {p["name"]: p["containerPort"] for p in spec["ports"]} == {
        "shuffler-metrics": args.metrics_port
    }
    (claim,) = objects()["StatefulSet"]["spec"]["volumeClaimTemplates"]
    mount = {m["name"]: m for m in spec["volumeMounts"]}[claim["metadata"]["name"]]
    assert Path(mount["mountPath"]) in args.store.parents
    assert args.store == Path(entrypoint_default("PRIVSTREAM_SHUFFLER_STORE"))
    assert args.policy == "drop" and args.no_transactions is False


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        ([], {"PRIVSTREAM_SECRET": "0f" * 32}, "must never hold the server's noise key"),
        ([], {"NOISE_FILE": "yes"}, "must never hold the server's noise key"),
        (["--secret-file", "/k"], {}, "takes no --secret-file"),
        (["--secret", "/k"], {}, "takes no --secret"),  # argparse's prefix of --secret-file
        (["--insecure-seed=3"], {}, "takes no --insecure-seed=3"),
        ([], {"NO_CLOCK_KEY": "yes"}, "is missing or empty; create the shuffler's Secret"),
    ],
    ids=[
        "secret-variable",
        "noise-key-file",
        "secret-file",
        "secret-prefix",
        "insecure-seed",
        "no-clock-key",
    ],
)
def test_the_entrypoint_refuses_a_shuffler_that_could_read_the_noise_key(
    tmp_path: Path, args: list[str], env: dict[str, str], message: str
) -> None:
    key = tmp_path / "clock.key"
    key.write_text("ab" * 32 + "\n")
    noise = tmp_path / "noise.key"
    if env.pop("NOISE_FILE", None):
        noise.write_text("0f" * 32 + "\n")
    if env.pop("NO_CLOCK_KEY", None):
        key.unlink()
    done = entrypoint_argv(
        tmp_path, ["shuffler", "--report-topic", "r", *args],
        PRIVSTREAM_CLOCK_KEY_FILE=str(key), PRIVSTREAM_SECRET_FILE=str(noise), **env,
    )  # fmt: skip
    assert done.returncode == 2
    assert message in done.stderr
    assert not (tmp_path / "argv").exists()  # privstream never started
    assert "0f" * 32 not in done.stdout + done.stderr


def test_the_network_policy_admits_only_prometheus_and_lets_out_only_dns_and_kafka() -> None:
    policy = objects()["NetworkPolicy"]["spec"]
    assert policy["podSelector"] == {}  # every pod of the namespace: the shuffler and its clock
    assert set(policy["policyTypes"]) == {"Ingress", "Egress"}
    (ingress,) = policy["ingress"]
    (source,) = ingress["from"]
    assert source == {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
    }
    metrics = {p["name"]: p["containerPort"] for p in container()["ports"]}["shuffler-metrics"]
    assert ingress["ports"] == [{"port": metrics, "protocol": "TCP"}]
    dns, kafka = policy["egress"]
    assert all(rule.get("to") for rule in policy["egress"])  # no rule open to everywhere
    assert {(p["port"], p["protocol"]) for p in dns["ports"]} == {(53, "UDP"), (53, "TCP")}
    assert dns["to"][0]["podSelector"] == {"matchLabels": {"k8s-app": "kube-dns"}}
    bootstrap = objects()["ConfigMap"]["data"]["PRIVSTREAM_BOOTSTRAP"]
    host, port = bootstrap.rsplit(":", 1)
    assert int(port) in {p["port"] for p in kafka["ports"]}
    (target,) = kafka["to"]
    namespace = target["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
    assert host.split(".")[1] == namespace  # kafka-bootstrap.<namespace>.svc


def test_the_statefulset_keeps_one_shuffler_its_store_and_its_name() -> None:
    statefulset = objects()["StatefulSet"]
    assert statefulset["spec"]["replicas"] == 1
    assert f"{statefulset['metadata']['name']}-0" == POD
    assert set(statefulset["spec"]["persistentVolumeClaimRetentionPolicy"].values()) == {"Retain"}
    labels = statefulset["spec"]["template"]["metadata"]["labels"]
    assert labels["app.kubernetes.io/component"] == "shuffler"
    service = objects()["Service"]
    assert statefulset["spec"]["serviceName"] == service["metadata"]["name"]
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"].items() <= labels.items()
    assert [(p["name"], p["port"], p["targetPort"]) for p in service["spec"]["ports"]] == [
        (p["name"], p["containerPort"], p["name"]) for p in container()["ports"]
    ]
    budget = objects()["PodDisruptionBudget"]["spec"]
    assert budget["selector"]["matchLabels"].items() <= labels.items()
    assert budget == {"maxUnavailable": 1, "selector": budget["selector"]}
    assert server_objects()["PodDisruptionBudget"]["spec"]["maxUnavailable"] == 1  # as the server
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container()[probe]["httpGet"] == {"path": "/metrics", "port": "shuffler-metrics"}


def test_the_shufflers_pods_meet_the_restricted_pod_security_standard() -> None:
    uid = int(re.search(r"useradd --uid (\d+)", (DEPLOY / "Containerfile").read_text())[1])
    for spec in pods():
        context = spec["securityContext"]
        assert context["runAsNonRoot"] is True and context["runAsUser"] == uid
        assert context["seccompProfile"] == {"type": "RuntimeDefault"}
        assert spec["enableServiceLinks"] is False  # no stray PRIVSTREAM_KAFKA_* variables
        (only,) = spec["containers"]
        assert only["securityContext"] == {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        }
        assert {k for v in spec["volumes"] for k in v if k != "name"} <= {"secret", "emptyDir"}


def readme_server() -> tuple[dict[str, str], list[str]]:
    """The server of ``ldp-shuffled`` mode as deploy/README.md's "The shuffler" gives it: its
    container's env and args (the entrypoint's one-stream form)."""
    text = (DEPLOY / "README.md").read_text()
    section = text[text.index("\n## The shuffler\n") :]
    (block,) = [
        b for b in re.findall(r"```yaml\n(.*?)```", section, re.S) if "PRIVSTREAM_FAMILY" in b
    ]
    spec = yaml.safe_load(block)
    return {e["name"]: e["value"] for e in spec["env"]}, [str(a) for a in spec["args"]]


def test_the_readme_server_reads_the_shufflers_topics_and_never_the_reports() -> None:
    """The server's args parse (``privstream run sao2 ...``, with the entrypoint's fixed parts)
    and pass ``--trust ldp-shuffled``'s own check; its request topic is the shuffler's task
    topic, its shuffled topic the shuffler's, its δ the shuffler's, and it names no report
    topic; the shuffler's clock marks the report topic for the server's stream."""
    env, args = readme_server()
    fixed = ["--secret-file", entrypoint_default("PRIVSTREAM_SECRET_FILE"), "--recovery-dir",
             entrypoint_default("PRIVSTREAM_RECOVERY_DIR"), "--no-progress"]  # fmt: skip
    server = _parser().parse_args(["run", env["PRIVSTREAM_FAMILY"], *args, *fixed])
    family = FAMILIES[server.family]
    shuffled_run.check_run(server, family)  # raises on a report or input topic
    assert server.trust == shuffled_run.SHUFFLED
    assert server.input_topic is None and server.report_topic is None
    shuffler = flag_values(container()["args"][1:])
    assert server.request_topic == shuffler["--task-topic"]
    assert server.shuffled_topic == shuffler["--shuffled-topic"]
    assert float(shuffler["--delta"]) == server.delta
    server_topics = {server.output_topic, server.ledger_topic, server.dead_letter_topic}
    assert not server_topics & {shuffler["--report-topic"], shuffler["--dead-letter-topic"]}
    clock = container("Deployment")["args"]
    assert clock[0] == "clock"
    clock_flags = flag_values(clock[1:])
    assert clock_flags["--topic"] == shuffler["--report-topic"]
    assert clock_flags["--stream"] == server.stream
    acls = readme_acls()
    (deny,) = [c for c in acls if "--deny-principal" in c]
    assert deny[deny.index("--deny-principal") + 1] == "User:privstream-server"
    assert deny[deny.index("--operation") + 1] == "All"
    private = {shuffler["--report-topic"], shuffler["--dead-letter-topic"]}
    assert private == topics_of(deny)
    for command in acls:
        if "User:privstream-server" in command and "--allow-principal" in command:
            assert not topics_of(command) & private
    (transactional,) = [c for c in acls if "--transactional-id" in c]
    assert transactional[transactional.index("--transactional-id") + 1] == (
        f"privstream-shuffler-{POD}"  # privstream.runtime.shuffler: privstream-shuffler-<id>
    )


def readme_acls() -> list[list[str]]:
    """The ``acl ...`` commands of deploy/README.md's "Kafka ACLs", as argv."""
    text = (DEPLOY / "README.md").read_text()
    section = text[text.index("\n### Kafka ACLs\n") :]
    (block,) = re.findall(r"```sh\n(.*?)```", section[: section.index("\n### ", 1)], re.S)
    lines = block.replace("\\\n", " ").splitlines()
    return [shlex.split(line) for line in lines if line.startswith("acl ")]


def topics_of(command: list[str]) -> set[str]:
    return {command[i + 1] for i, arg in enumerate(command) if arg == "--topic"}
