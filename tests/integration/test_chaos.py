"""The chaos suite in its short form (``make chaos`` runs the long one): 20 SIGKILLs at start,
during the recovery store's creation and mid-run, broker freezes and cuts, hostile messages and
continuous scrapes, then a replay with other poll sizes, a stream rename on the store (refused),
``privstream audit`` and a comparison with an undisturbed run."""

from __future__ import annotations

import json
from pathlib import Path

from .chaos import Plan, run_chaos


def test_chaos_loses_nothing_and_duplicates_nothing(tmp_path: Path) -> None:
    report = run_chaos(Plan(kills=20, users=2000, slots=60, outages=3, seed=11), tmp_path)
    print(json.dumps(vars(report), indent=2))
    assert report.kills >= 20 and report.store_kills >= 1 and report.early_kills >= 1
    assert report.outages >= 1 and report.scrapes > 0
    assert report.releases == 2 * 60  # two mechanisms, every slot
    assert report.poll_replay_differing == 0 and report.rename_refused
    assert report.failures() == {}, vars(report)
