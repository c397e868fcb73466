"""Issue 18 §4 and issue 27 item 3: a store resumed for another flow.

Reproduced (as it was): a store was bound per stream only (each stream's snapshot to its own
ε = share × population ε), so doubling the population's ε while halving every share kept each
stream's binding and resumed silently; a new stream (or a renamed one: a new step id) started
with a fresh budget beside the old streams' ledgers (a rename pushed the composed spend to 3.0
against the population's 2.0). The first test shows that the per-stream bindings of the two
configurations are equal (nothing refused them).

Fixed (``privstream.runtime.incarnation``): the store keeps the flow's manifest — population ε and
window, every stream's share, the retired streams' shares — and refuses a change by name;
``retired = ["old"]`` removes a stream explicitly, its share stays spent, and its name never
comes back.
"""

from __future__ import annotations

import copy
import secrets
from pathlib import Path
from typing import Any

import pytest

from privstream.cli.run_config import flow_manifest
from privstream.flows.config import load
from privstream.mechanisms.errors import IncompatibleState
from privstream.mechanisms.seeding import NoiseKey
from privstream.runtime.incarnation import begin, read
from tests.test_flow_config import BASE, _toml

KEY = NoiseKey.from_text(secrets.token_hex(32))
A = {"name": "a", "family": "ldp-ids", "mechanisms": ["LPA"], "domain": 8, "share": 0.5}
B = {"name": "b", "family": "ldp-ids", "mechanisms": ["LPA"], "domain": 8, "share": 0.25}


def _config(tmp_path: Path, streams: list[dict[str, Any]], epsilon: float = 2.0, **pop: Any) -> Any:
    data = copy.deepcopy(BASE)
    data["population"].update(epsilon=epsilon, **pop)
    data["streams"] = streams
    path = tmp_path / f"flow-{secrets.token_hex(4)}.toml"
    path.write_text(_toml(data))
    return load(path)


def _resume(tmp_path: Path, config: Any) -> Any:
    return begin(KEY, tmp_path / "store", flow_manifest(config, KEY),
                 frozenset(config.population.retired))  # fmt: skip


def test_the_per_stream_epsilon_did_not_see_a_doubled_budget_with_halved_shares(
    tmp_path: Path,
) -> None:
    before = _config(tmp_path, [A, B])
    after = _config(tmp_path, [{**A, "share": 0.25}, {**B, "share": 0.125},
                               {**B, "name": "c", "share": 0.5}], epsilon=4.0)  # fmt: skip
    assert [s.epsilon for s in before.streams] == [s.epsilon for s in after.streams][:2]


def test_a_doubled_budget_halved_shares_and_an_added_stream_are_refused(tmp_path: Path) -> None:
    _resume(tmp_path, _config(tmp_path, [A, B]))
    after = _config(tmp_path, [{**A, "share": 0.25}, {**B, "share": 0.125},
                               {**B, "name": "c", "share": 0.5}], epsilon=4.0)  # fmt: skip
    with pytest.raises(IncompatibleState) as refused:
        _resume(tmp_path, after)
    message = str(refused.value)
    assert "the population's epsilon changed from 2 to 4" in message
    assert "stream 'a': its share changed from 0.5 to 0.25" in message
    assert "stream 'b': its share changed from 0.25 to 0.125" in message


def test_a_renamed_stream_is_refused_unless_retired_and_then_charged(tmp_path: Path) -> None:
    """Rename b → c: refused; with ``retired = ["b"]`` accepted only while a + b + c fit under
    the population's ε (b's share stays spent): composed spend ≤ 2.0, never 3.0."""
    _resume(tmp_path, _config(tmp_path, [A, {**B, "share": 0.5}]))
    with pytest.raises(IncompatibleState, match="stream 'b' is gone from the flow"):
        _resume(tmp_path, _config(tmp_path, [A, {**B, "name": "c", "share": 0.5}]))
    with pytest.raises(IncompatibleState, match=r"brings the live and retired shares to 1\.5 > 1"):
        _resume(tmp_path, _config(tmp_path, [A, {**B, "name": "c", "share": 0.5}], retired=["b"]))
    stored = read(tmp_path / "store")
    assert stored is not None and dict(stored.manifest.streams) == {"a": 0.5, "b": 0.5}


def test_a_retired_stream_stays_spent_and_never_comes_back(tmp_path: Path) -> None:
    _resume(tmp_path, _config(tmp_path, [A, B]))
    _resume(tmp_path, _config(tmp_path, [A, {**B, "name": "c", "share": 0.25}], retired=["b"]))
    stored = read(tmp_path / "store")
    assert stored is not None
    assert dict(stored.manifest.retired) == {"b": 0.25}
    assert dict(stored.manifest.streams) == {"a": 0.5, "c": 0.25}
    with pytest.raises(IncompatibleState, match="stream 'b' was retired and cannot come back"):
        _resume(tmp_path, _config(tmp_path, [A, {**B, "name": "c", "share": 0.25}, B]))
    with pytest.raises(IncompatibleState, match=r"brings the live and retired shares to 1\.25"):
        _resume(tmp_path, _config(tmp_path, [A, {**B, "name": "c", "share": 0.25},
                                             {**B, "name": "d", "share": 0.25}], retired=["b"]))  # fmt: skip


def test_retired_must_not_name_a_configured_stream(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="retired: names configured stream"):
        _config(tmp_path, [A], retired=["a"])
