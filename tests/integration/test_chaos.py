"""The chaos suite in its short form (``make chaos`` runs the long one): 20 SIGKILLs at start,
during the recovery store's creation and mid-run, broker freezes and cuts, hostile messages and
continuous scrapes, then a replay with other poll sizes, a stream rename on the store (refused),
``privstream audit`` and a comparison with an undisturbed run; then the cluster round, one of
each disturbance: a member SIGKILLed during start-up, the launcher SIGKILLed (after a second
launcher on its store was refused), a member frozen, each followed by a restart of the cluster."""

from __future__ import annotations

import json
from pathlib import Path

from .chaos import Plan, run_chaos


def test_chaos_loses_nothing_and_duplicates_nothing(tmp_path: Path) -> None:
    plan = Plan(kills=20, users=2000, slots=60, outages=3, seed=11, cluster_kills=3)
    report = run_chaos(plan, tmp_path)
    print(json.dumps(vars(report), indent=2))
    assert report.kills >= 20 and report.store_kills >= 1 and report.early_kills >= 1
    assert report.outages >= 1 and report.scrapes > 0
    assert report.releases == 2 * 60  # two mechanisms, every slot
    assert report.poll_replay_differing == 0 and report.rename_refused
    assert report.cluster_startup_kills == report.cluster_launcher_kills == 1
    assert report.cluster_hung_members == 1 and report.cluster_restarts >= 3
    assert report.cluster_releases == 4 * 8  # four mechanisms over three streams, slots 1-8
    assert report.cluster_unnoticed == report.cluster_orphans == 0
    assert report.cluster_second_writers == 0
    assert report.cluster_lost_slots == report.cluster_conflicting_duplicates == 0
    assert report.cluster_differing_releases == 0 and report.cluster_audit_ok
    assert report.failures() == {}, vars(report)
