"""Family discovery (``privstream.families.registry``): families are entry points of the
``privstream.families`` group, so a family in another distribution — here a toy module and a
``toyfam-0.0.dist-info`` in a temporary directory, nothing installed and nothing in privstream
edited — runs under ``privstream run <family>`` (in-process and in a subprocess), passes
``privstream config check`` in a flow file and exports its declared public metric; a broken or
duplicate entry point stops discovery naming the distribution."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from privstream.cli import main
from privstream.families import registry
from privstream.families.spec import Family, FamilyConfig
from privstream.operators.stream_state import Tally

ROOT = Path(__file__).resolve().parent.parent

TOY_MODULE = """
from privstream.families.spec import BenchSpec, Family, MetricSpec
from privstream.mechanisms import ldp_ids

FAMILY = Family(
    name="toyfam",
    summary="a toy family from another distribution",
    mechanisms={"LBU": ldp_ids.MECHANISMS["LBU"]},
    config=ldp_ids.LdpIdsConfig,
    epsilon=1.0,
    window=5,
    users=400,
    default="LBU",
    metrics=(MetricSpec("toy_slots_seen", "A toy family's own gauge.", lambda tally, entry: 1.0),),
    bench=BenchSpec(
        datasets=("sin",), files=False, counts=False, score=lambda run: {"publications": 0.0},
        fields=("publications",), mechanisms=("LBU",), users=400, slots=10,
    ),
)
"""


def _distribution(root: Path, entry_points: str, module: str = TOY_MODULE) -> Path:
    """A module ``toyfam_family`` and ``toyfam-0.0.dist-info`` declaring ``entry_points`` in the
    ``privstream.families`` group, under ``root`` (what ``pip install`` would leave)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "toyfam_family.py").write_text(textwrap.dedent(module))
    info = root / "toyfam-0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toyfam\nVersion: 0.0\n")
    (info / "entry_points.txt").write_text(f"[privstream.families]\n{entry_points}\n")
    return root


@pytest.fixture
def rediscover() -> Iterator[None]:
    """Discovery is cached: forget it before and after a test that changes ``sys.path``."""
    registry.families.cache_clear()
    yield
    sys.modules.pop("toyfam_family", None)
    registry.families.cache_clear()


@pytest.fixture
def toyfam(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rediscover: None) -> Path:
    root = _distribution(tmp_path / "site", "toyfam = toyfam_family:FAMILY")
    monkeypatch.syspath_prepend(str(root))
    return root


def test_the_builtin_families_are_the_entry_points_pyproject_declares() -> None:
    table = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    assert table[registry.GROUP] == registry.BUILTIN
    assert list(registry.families()) == ["ldp-ids", "personalized", "cgm", "dpi", "sao2"]
    assert len(registry.REGISTRY) == 11 + 8 + 2 + 5 + 1
    assert registry.LDP_IDS is registry.family("ldp-ids")  # the old names still resolve


def test_an_external_family_is_discovered_and_runs_in_process(toyfam: Path, tmp_path: Path) -> None:
    assert isinstance(registry.family("toyfam"), Family)
    assert list(registry.FAMILIES) == ["ldp-ids", "personalized", "cgm", "dpi", "sao2", "toyfam"]
    out = tmp_path / "toy.jsonl"
    argv = ["run", "toyfam", "--users", "300", "--slots", "12", "--insecure-seed", "7"]
    assert main([*argv, "--no-progress", "--out", str(out)]) == 0
    releases = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["slot"] for r in releases] == list(range(1, 13))
    assert {r["mechanism"] for r in releases} == {"LBU"}
    assert all(r["release_id"] == f"{r['stream']}/LBU/{r['slot']}" for r in releases)


def test_an_external_family_s_public_metric_is_allow_listed(toyfam: Path) -> None:
    from privstream.operators import metrics

    assert "privstream_toy_slots_seen" in metrics.public_metrics()
    assert "privstream_dissimilarity" in metrics.public_metrics()  # LDP-IDS declares it
    assert "privstream_mu_spent" in metrics.public_metrics()  # CGM declares it
    assert "privstream_dissimilarity" not in metrics.GENERIC_PUBLIC_METRICS
    board = metrics.LedgerBoard()
    guarantee = registry.family("toyfam").build("LBU", _config()).privacy_cost
    board.update("toy", "LBU", guarantee, 400, Tally(), halted=False)
    registry_ = CollectorRegistry()
    registry_.register(board)
    text = generate_latest(registry_).decode()
    assert 'privstream_toy_slots_seen{mechanism="LBU",stream="toy"} 1.0' in text


def _config() -> FamilyConfig:
    from privstream.mechanisms.tasks import FrequencyTask

    return registry.family("toyfam").make_config(
        epsilon=1.0, window=5, population=400, task=FrequencyTask(2)
    )


def test_an_external_family_runs_in_a_subprocess(toyfam: Path, tmp_path: Path) -> None:
    out = tmp_path / "toy.jsonl"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(toyfam), str(ROOT)])}
    code = "import sys; from privstream.cli import main; sys.exit(main())"
    argv = ["run", "toyfam", "--users", "300", "--slots", "8", "--insecure-seed", "7"]
    done = subprocess.run(
        [sys.executable, "-c", code, *argv, "--no-progress", "--out", str(out)],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert len(out.read_text().splitlines()) == 8


def test_an_external_family_passes_a_flow_file_check(
    toyfam: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    flow = tmp_path / "flow.toml"
    flow.write_text(
        textwrap.dedent("""
        [kafka]
        bootstrap = "localhost:9092"
        input_topic = "events"
        output_topic = "releases"

        [population]
        users = 1000
        epsilon = 2.0
        window = 20

        [[streams]]
        name = "toy"
        family = "toyfam"
        mechanisms = ["LBU"]
        domain = 4
        share = 1.0
        """)
    )
    assert main(["config", "check", str(flow)]) == 0
    assert "toyfam" in capsys.readouterr().out
    flow.write_text(flow.read_text().replace('"toyfam"', '"nofam"'))
    assert main(["config", "check", str(flow)]) == 2
    assert "toyfam" in capsys.readouterr().err  # the choices name the discovered family


def test_a_broken_entry_point_names_its_distribution(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rediscover: None
) -> None:
    root = _distribution(tmp_path / "site", "toyfam = toyfam_missing:FAMILY")
    monkeypatch.syspath_prepend(str(root))
    with pytest.raises(registry.FamilyDiscoveryError, match=r"toyfam 0\.0 failed to load"):
        registry.families()


def test_an_entry_point_must_name_a_family_of_its_own_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rediscover: None
) -> None:
    root = _distribution(tmp_path / "site", "other = toyfam_family:FAMILY")
    monkeypatch.syspath_prepend(str(root))
    with pytest.raises(registry.FamilyDiscoveryError, match="must be the family's name"):
        registry.families()


def test_a_duplicate_family_names_both_distributions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rediscover: None
) -> None:
    module = TOY_MODULE.replace('name="toyfam"', 'name="cgm"')
    root = _distribution(tmp_path / "site", "cgm = toyfam_family:FAMILY", module)
    monkeypatch.syspath_prepend(str(root))
    with pytest.raises(registry.FamilyDiscoveryError, match=r"two .* name the family 'cgm'") as e:
        registry.families()
    assert "distribution toyfam 0.0" in str(e.value)
