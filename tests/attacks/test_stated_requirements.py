"""Issue 18 §4: personalized events stating their ε_i were all refused in a flow with share < 1.

Reproduced (as it was): a flow file's central-DP stream registered every user at ``ε_i × share``
and compared what an event states with that, so at share 0.5 every event stating the user's
own ε_i was a ``requirement_changed`` dead letter (9,000 of 9,000). Fixed: the registration
keeps the users' own ε_i and applies the share inside (``Preferences.share``); a stated ε_i is
compared with the registered ε_i, and one that differs is still refused.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from privstream.families.registry import PERSONALIZED
from privstream.flows.config import FlowConfig, estimation_task, load
from privstream.flows.streams import registration_for
from privstream.mechanisms.accountant import BudgetSplit
from privstream.operators.family import family_mechanisms
from privstream.operators.registration import Preferences
from privstream.schema.events import REQUIREMENT_CHANGED, EventBatch
from tests.attacks.helpers import Outputs, run_operator

N, T, SHARE = 300, 30, 0.5
USERS = [f"u{i}" for i in range(N)]
REQUIRED = {u: ((1.0, 6) if i % 3 else (2.0, 12)) for i, u in enumerate(USERS)}


def flow_file(tmp_path: Path) -> FlowConfig:
    """A flow file with one personalized stream at share 0.5 over the registered users."""
    rows = "".join(f"{u},{e},{w}\n" for u, (e, w) in REQUIRED.items())
    (tmp_path / "registrations.csv").write_text("user,epsilon,window\n" + rows)
    (tmp_path / "flow.toml").write_text(
        '[kafka]\nbootstrap = "localhost:9092"\ninput_topic = "in"\noutput_topic = "out"\n'
        "[population]\nusers = 300\nepsilon = 2.0\nwindow = 6\n"
        'registrations = "registrations.csv"\n'
        f'[[streams]]\nname = "visits"\nfamily = "personalized"\nmechanisms = "PBD"\n'
        f"domain = 2\nshare = {SHARE}\n"
    )
    return load(tmp_path / "flow.toml")


def stating(epsilon_of: dict[str, float]) -> list[EventBatch]:
    """Every user reports every slot stating ``(epsilon_of[u], w_u)``: T·N = 9,000 events."""
    rng = np.random.default_rng(7)
    users = np.array(USERS, dtype=object)
    eps = np.array([epsilon_of[u] for u in USERS])
    win = np.array([REQUIRED[u][1] for u in USERS], dtype=np.int64)
    return [
        EventBatch(
            "visits",
            np.full(N, t),
            users,
            (rng.random(N) < 0.3).astype(float),
            None,
            t,
            epsilons=eps,
            windows=win,
        )
        for t in range(1, T + 1)
    ]


def run(config: FlowConfig, registration: Preferences, items: list[EventBatch]) -> Outputs:
    """The stream's operator as ``flows.streams`` builds it from the file."""
    spec = config.streams[0]
    family_config = PERSONALIZED.make_config(
        epsilon=spec.epsilon, window=spec.window, population=config.population.users,
        task=estimation_task(spec.task),
    )  # fmt: skip
    return run_operator(
        items,
        lambda keyed: family_mechanisms(
            "p", keyed, family=PERSONALIZED, mechanism=list(spec.mechanisms),
            config=family_config, secret=3, registration=registration,
            split=BudgetSplit.parse(spec.budget_split, len(spec.mechanisms)),
        ),
    )  # fmt: skip


def test_users_stating_their_own_requirement_are_accepted_at_a_share(tmp_path: Path) -> None:
    config = flow_file(tmp_path)
    own = {u: e for u, (e, _) in REQUIRED.items()}
    before = Preferences(by_user={u: (e * SHARE, w) for u, (e, w) in REQUIRED.items()})
    refused = run(config, before, stating(own))["dead_letters"]  # the registration as it was
    assert len(refused) == N * T == 9000
    assert {d.reason for d in refused} == {REQUIREMENT_CHANGED}
    out = run(config, registration_for(config.streams[0], config), stating(own))
    assert out["dead_letters"] == []
    assert len(out["releases"]) == T
    # the mechanisms still run every user at share × ε_i: the classes are (0.5, 6) and (1, 12)
    classes = {(c["budget"], c["scope"]) for c in out["ledger"][-1]["classes"]}
    assert classes == {(0.5, 6), (1.0, 12)}


def test_a_stated_requirement_other_than_the_registered_one_is_still_refused(
    tmp_path: Path,
) -> None:
    """Stating the scaled value (what the stream holds) or any other ε_i is refused by name."""
    config = flow_file(tmp_path)
    liars = {u: (e * SHARE if i % 10 == 0 else e) for i, (u, (e, _)) in enumerate(REQUIRED.items())}
    out = run(config, registration_for(config.streams[0], config), stating(liars))
    assert len(out["dead_letters"]) == T * (N // 10)
    assert {d.reason for d in out["dead_letters"]} == {REQUIREMENT_CHANGED}
