"""SaO2 in a flow file: a ``family = "sao2"`` stream with its task (``binary = {d, kind}``) and
options loads as the run builds it — the stream's ε (``share × population.epsilon``) is the
lifetime budget, spent ``ε/horizons`` per horizon; a bad task or option names its key; a SaO2
stream (a lifetime guarantee) beside a w-event stream is refused at load."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from privstream.cli.commands import main
from privstream.families.registry import FAMILIES
from privstream.flows.config import ConfigError, load
from privstream.mechanisms.guarantees import LifetimeScope
from privstream.mechanisms.sao2 import Sao2Mechanism
from privstream.mechanisms.sao2_task import BinaryTask
from tests.flows.test_dpi_flow import COUNTRY
from tests.test_flow_config import _toml

CELLS: dict[str, Any] = {
    "name": "cells", "family": "sao2", "mechanisms": ["SaO2"], "binary": {"d": 12},
    "share": 0.5, "max_changes": 6, "fanout": 2, "horizons": 4, "weights": "optimal",
}  # fmt: skip


def flow(tmp_path: Path, *streams: dict[str, Any]) -> Path:
    data = {
        "kafka": {"bootstrap": "localhost:9092", "input_topic": "events",
                  "output_topic": "releases"},
        "population": {"users": 100, "epsilon": 2.0, "window": 16},
        "streams": list(streams),
    }  # fmt: skip
    path = tmp_path / "flow.toml"
    path.write_text(_toml(data))
    return path


def test_a_sao2_stream_loads_with_its_task_and_options(tmp_path: Path) -> None:
    (cells,) = load(flow(tmp_path, CELLS)).streams
    assert cells.family == "sao2" and cells.epsilon == 1.0 and cells.task == BinaryTask(12)
    assert cells.options == {"s": 6, "r": 2, "horizons": 4, "weights": "optimal",
                             "query_family": "prefix", "m": None, "delta": 1e-05}  # fmt: skip
    family = FAMILIES["sao2"]
    config = family.make_config(epsilon=cells.epsilon, window=16, population=100,
                                task=cells.task, **cells.options)  # fmt: skip
    mechanism = family.build("SaO2", config)
    assert isinstance(mechanism, Sao2Mechanism)
    assert (mechanism.config.epsilon, mechanism.config.lifetime) == (0.25, 1.0)
    assert (mechanism.config.s, mechanism.config.r, mechanism.config.weights) == (6, 2, "optimal")
    assert isinstance(mechanism.privacy_cost.scope, LifetimeScope)
    assert mechanism.privacy_cost.measure.epsilon == 1.0  # the stream's share of the budget


def test_config_check_states_the_binary_task_and_the_lifetime(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bits = {**CELLS, "name": "sets", "binary": {"d": 8, "kind": "bits"}, "share": 0.25}
    assert main(["config", "check", str(flow(tmp_path, CELLS, bits))]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("stream cells: sao2 SaO2; binary d = 12 (onehot); ε = 0.5 × 2 = 1")
    assert out[1].startswith("stream sets: sao2 SaO2; binary d = 8 (bits); ε = 0.25 × 2 = 0.5")
    assert out[-1].startswith("2 stream(s), n = 100: shares sum to 0.75, so a user in every "
                              "stream spends at most 1.5 of ε = 2")  # fmt: skip
    assert out[-1].endswith("over their lifetime")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"binary": {"d": 12, "kind": "hex"}}, 'streams["cells"].binary.kind: must be one of onehot, bits'),
        ({"binary": {"d": 60, "kind": "bits"}}, 'streams["cells"].binary.d: a bitmask value holds at most 52 bits'),
        ({"binary": {"d": 4, "size": 2}}, 'streams["cells"].binary'),
        ({"max_changes": 0}, 'streams["cells"].max_changes: must be an integer >= 1'),
        ({"fanout": 1}, 'streams["cells"].fanout: must be an integer >= 2'),
        ({"symbols": "3,2"}, "m must give 1 <= m_h <= d'_h for each of the"),
        ({"weights": "best"}, 'streams["cells"].weights: must be one of'),
    ],
)  # fmt: skip
def test_a_bad_sao2_key_names_itself(tmp_path: Path, change: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        load(flow(tmp_path, {**CELLS, **change}))


def test_a_sao2_stream_beside_a_w_event_stream_is_refused(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match="do not compose: cells is private over a user's lifetime"
    ):
        load(flow(tmp_path, CELLS, COUNTRY))


def test_a_hundred_thousand_users_of_a_thousand_cells_fit_in_a_few_hundred_mb(
    tmp_path: Path,
) -> None:
    """Sparse storage (issue 24): n = 10⁵ users of d = 1,000 one-hot cells through the whole
    flow (synthetic source, Bytewax, 16 slots, two horizons) peaks under 600 MB of resident
    memory, where one dense float64 n × d slot alone would be 800 MB. Run in a fresh process so
    the peak is this run's own."""
    import subprocess
    import sys

    script = (
        "import resource, sys\n"
        "from privstream.cli.commands import main\n"
        f"assert main(['run', 'sao2', '--dataset', 'trajectory', '--binary', '1000', '--users',"
        f" '100000', '--slots', '16', '--window', '8', '--insecure-seed', '1', '--no-progress',"
        f" '--out', {str(tmp_path / 'r.jsonl')!r}]) == 0\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300, check=True)  # fmt: skip
    peak_mb = int(done.stdout.split()[-1]) / 1024
    assert peak_mb < 600, peak_mb
    assert len((tmp_path / "r.jsonl").read_text().splitlines()) == 16
