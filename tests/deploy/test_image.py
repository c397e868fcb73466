"""The container image, built by ``make image``'s script and run here against the embedded
broker: the flow starts as uid 10001 on a read-only root filesystem with the key mounted
read-only and the recovery store on a volume, releases every slot, and stops by itself.

Containers run on this kind of machine only with runc and explicit resource limits (crun, the
default runtime, fails with ``setrlimit RLIMIT_NOFILE: Operation not permitted`` and ``cgroups in
hybrid mode not supported``); ``deploy/README.md`` gives the same command to operators. The
image gets its own tag, so a test never replaces what an operator built as ``latest``."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from privstream.connectors.broker import EmbeddedBroker, free_port
from privstream.connectors.kafka import KafkaSettings
from tests.integration.conftest import Topics, read_json, write_secret
from tests.integration.prometheus import ensure_debian

from .test_entrypoint import flow_args, produce

ROOT = Path(__file__).resolve().parents[2]
IMAGE = "localhost/privstream:test"
UID = 10001  # the image's user (deploy/Containerfile)
SLOTS = 5


@pytest.fixture(scope="session")
def image() -> str:
    """``deploy/build-image.sh`` (it installs podman and mmdebstrap itself); runc to run it."""
    ensure_debian("runc", ("runc",))
    env = {**os.environ, "IMAGE": IMAGE, "PYTHON": str(ROOT / ".venv" / "bin" / "python")}
    if not Path(env["PYTHON"]).exists():
        env["PYTHON"] = shutil.which("python3") or "python3"
    done = subprocess.run(
        ["sh", str(ROOT / "deploy" / "build-image.sh")], cwd=ROOT, env=env,
        capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    assert done.returncode == 0, f"make image failed:\n{done.stderr[-4000:]}"
    return IMAGE


def _owned_by_the_image_user(path: Path, mode: int) -> Path:
    if os.geteuid() == 0:
        os.chown(path, UID, UID)
        path.chmod(mode)
    else:  # a rootless podman maps uids; let the container's user in
        path.chmod(mode | 0o077 if path.is_dir() else mode | 0o044)
    return path


def test_the_image_runs_a_flow_against_the_embedded_broker(
    image: str, broker: EmbeddedBroker, kafka: KafkaSettings, tmp_path: Path
) -> None:
    topics = Topics(kafka)
    key = write_secret(tmp_path / "noise.key")
    produce(kafka, topics, 1, SLOTS, key)  # markers tagged with the flow's clock key
    key = _owned_by_the_image_user(key, 0o400)
    state = tmp_path / "state"
    state.mkdir()
    _owned_by_the_image_user(state, 0o700)
    podman = ensure_debian("podman", ("podman",))["podman"]
    done = subprocess.run(
        [podman, "run", "--rm", "--runtime", "runc", "--ulimit", "nofile=20000:20000",
         "--ulimit", "nproc=4096:4096", "--network=host", "--read-only",
         "-e", "PRIVSTREAM_FAMILY=ldp-ids", "-e", f"PRIVSTREAM_BOOTSTRAP={broker.bootstrap}",
         "-e", "PRIVSTREAM_METRICS_ADDR=127.0.0.1", "-e", f"PRIVSTREAM_METRICS_PORT={free_port()}",
         "-e", "PRIVSTREAM_INTERNAL_METRICS_ADDR=127.0.0.1",
         "-e", f"PRIVSTREAM_INTERNAL_METRICS_PORT={free_port()}",
         "-v", f"{key}:/var/run/secrets/privstream/noise.key:ro",
         "-v", f"{state}:/var/lib/privstream", image, *flow_args(topics), "--slots", str(SLOTS)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    releases = read_json(kafka, topics.releases, SLOTS)
    assert sorted(r["slot"] for r in releases) == list(range(1, SLOTS + 1))
    assert all(r["mechanism"] == "LBU" and not r["insecure_seed"] for r in releases)
    assert list((state / "recovery").glob("*.sqlite3")), "no recovery store on the volume"
    assert key.read_text().strip() not in done.stdout + done.stderr
