"""Shared JSON test vectors: replaying each vector's draws reproduces its report exactly."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from privstream.client.randomizers import ReplayRandomness, randomize
from tests.client.make_vectors import PATH, render

DOC = json.loads(PATH.read_text())
VECTORS: list[dict[str, Any]] = DOC["vectors"]


def test_the_vector_file_is_current() -> None:
    """The committed file is what the device library generates today."""
    assert PATH.read_text() == render()
    assert DOC["format"] == "privstream-client-vectors" and DOC["version"] == 1
    assert {v["oracle"] for v in VECTORS} == {"GRR", "OUE", "OLH", "HM"}


@pytest.mark.parametrize("i", range(len(VECTORS)))
def test_replaying_the_draws_gives_the_report(i: int) -> None:
    v = VECTORS[i]
    rng = ReplayRandomness([(op, arg, value) for op, arg, value in v["draws"]])
    report = randomize(v["oracle"], v["value"], v["epsilon"], v["d"] or 0, rng)
    want = v["report"]
    if v["oracle"] == "HM":
        assert math.isclose(report, want, rel_tol=1e-12, abs_tol=1e-12)  # type: ignore[arg-type]
    else:
        assert (list(report) if isinstance(report, tuple) else report) == want
    assert rng.exhausted, "the randomiser consumed fewer draws than recorded"


def test_vectors_cover_both_branches_of_each_coin() -> None:
    """GRR and OLH vectors keep and move the value; HM vectors use SR and PM (PM: 3 draws)."""
    draws = {
        o: {len(v["draws"]) for v in VECTORS if v["oracle"] == o} for o in ("GRR", "OLH", "HM")
    }
    assert draws["GRR"] == {1, 2} and draws["OLH"] == {3, 4} and {1, 2, 3} <= draws["HM"]


def test_a_replay_that_asks_for_another_draw_fails() -> None:
    rng = ReplayRandomness([("randbelow", 4, 1)])
    with pytest.raises(ValueError, match="bits"):
        rng.bits(53)
