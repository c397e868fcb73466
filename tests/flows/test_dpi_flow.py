"""DPI in a flow file: a ``family = "dpi"`` stream with its options loads as the run builds it;
a lifetime stream beside a w-event stream of the same population is refused at load (the two
budgets do not compose); lifetime streams together share the population's ε over a lifetime."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from privstream.cli.commands import main
from privstream.families.registry import FAMILIES
from privstream.flows.config import ConfigError, load
from privstream.mechanisms.guarantees import LifetimeScope
from privstream.mechanisms.tasks import FrequencyTask
from tests.test_flow_config import _toml

DPI: dict[str, Any] = {
    "name": "pages", "family": "dpi", "mechanisms": ["DPI"], "domain": 10, "share": 0.5,
    "mu": 0.1, "zeta": 0.2, "lambda": 0.3, "rba": "alg4", "pool_size": 300, "synopses": 5,
    "queries": "acc,inst,mean",
}  # fmt: skip
COUNTRY: dict[str, Any] = {
    "name": "country", "family": "ldp-ids", "mechanisms": ["LPA"], "domain": 8, "share": 0.5,
}  # fmt: skip
VISITS: dict[str, Any] = {
    "name": "visits", "family": "personalized", "mechanisms": "PBD", "domain": 2, "share": 0.5,
}  # fmt: skip


def flow(tmp_path: Path, *streams: dict[str, Any]) -> Path:
    (tmp_path / "reg.csv").write_text(
        "user,epsilon,window\n" + "".join(f"u{u},2.0,20\n" for u in range(100))
    )
    data = {
        "kafka": {"bootstrap": "localhost:9092", "input_topic": "events",
                  "output_topic": "releases"},
        "population": {"users": 100, "epsilon": 2.0, "window": 20, "registrations": "reg.csv"},
        "streams": list(streams),
    }  # fmt: skip
    path = tmp_path / "flow.toml"
    path.write_text(_toml(data))
    return path


def test_a_dpi_stream_loads_with_its_options(tmp_path: Path) -> None:
    (pages,) = load(flow(tmp_path, DPI)).streams
    assert pages.family == "dpi" and pages.epsilon == 1.0 and pages.mechanisms == ("DPI",)
    assert pages.options == {"mu": 0.1, "zeta": 0.2, "lam": 0.3, "rba": "alg4",
                             "pool_size": 300, "synopses": 5,
                             "queries": ("acc", "inst", "mean"), "rba_rate": 1e8,
                             "eta_mode": "budget_exact", "sensitivity_mode": "unbounded",
                             "prior_mass": 0.0}  # fmt: skip
    family = FAMILIES["dpi"]
    config = family.make_config(epsilon=pages.epsilon, window=pages.window, population=100,
                                task=FrequencyTask(10), **pages.options)  # fmt: skip
    mechanism = family.build("DPI", config)
    assert (mechanism.config.mu, mechanism.config.zeta, mechanism.config.lam) == (0.1, 0.2, 0.3)
    assert isinstance(mechanism.privacy_cost.scope, LifetimeScope)


def test_config_check_says_lifetime(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two lifetime streams share the population's ε over a user's lifetime."""
    path = flow(tmp_path, DPI, {**DPI, "name": "items", "share": 0.25})
    assert main(["config", "check", str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == ("stream pages: dpi DPI; d = 10; ε = 0.5 × 2 = 1 (registered users: "
                      "0.5 × ε_i); over a user's lifetime")  # fmt: skip
    assert out[-1] == ("2 stream(s), n = 100: shares sum to 0.75, so a user in every stream "
                       "spends at most 1.5 of ε = 2 over their lifetime")  # fmt: skip


def test_a_bad_dpi_option_names_its_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=re.escape('streams["pages"].rba: must be alg3 or alg4')):
        load(flow(tmp_path, {**DPI, "rba": "alg5"}))


@pytest.mark.parametrize(
    ("other", "scope"),
    [(COUNTRY, "a w-event window of w=20"), (VISITS, "a personal window of w=20")],
)
def test_a_lifetime_stream_beside_a_windowed_one_is_refused_at_load(
    tmp_path: Path, other: dict[str, Any], scope: str
) -> None:
    """In either order: the message names both streams, both scopes and what to do."""
    for streams, at in (((DPI, other), other["name"]), ((other, DPI), "pages")):
        with pytest.raises(ConfigError) as info:
            load(flow(tmp_path, *streams))
        assert str(info.value) == (
            f'{tmp_path / "flow.toml"}: streams["{at}"]: streams pages and {other["name"]} do '
            f"not compose: pages is private over a user's lifetime and {other['name']} over "
            f"{scope}, and a bound over one says nothing about the other "
            "(accounting.composable); a population's budget is either per population.window "
            "or over a user's lifetime, not both: run the lifetime stream on a population of "
            "its own (a flow file of its own, with its own users and registrations)"
        )
