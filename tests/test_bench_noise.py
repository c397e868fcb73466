"""``privstream bench noise``: the measurements exist, are positive and add up."""

from __future__ import annotations

import json
from pathlib import Path

from privstream.cli.commands import main


def test_bench_noise_reports_every_measurement(tmp_path: Path) -> None:
    out = tmp_path / "noise.json"
    assert main(["bench", "noise", "--users", "20000", "--repeats", "1", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    stream = result["random_stream"]
    assert stream["users"] == 20000 and stream["pcg64_s"] > 0 and stream["aes_ctr_s"] > 0
    assert stream["ratio"] == stream["aes_ctr_s"] / stream["pcg64_s"]
    assert set(result["central_noise"]) == {"d=2", "d=10000"}
    for row in result["central_noise"].values():
        assert row["discrete_us_per_draw"] > 0 and row["float_us_per_draw"] > 0
    assert result["pbd_slot"]["ms_per_slot"] > 0
