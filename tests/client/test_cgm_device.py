"""CGM's device side (privstream.client.cgm): shared vectors, the exact discrete Gaussian, one
distribution with the server's simulated CGM clients, and the device's μ² ledger."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from privstream.client.cgm import (
    CgmDevice,
    Chain,
    chain_step,
    discrete_gaussian,
    report_charge,
    step_state,
)
from privstream.client.ledger import GaussianPolicy, Refusal
from privstream.client.randomizers import ReplayRandomness
from privstream.client.store import FileStore
from privstream.mechanisms.cgm import CgmClients, CgmProtocol
from privstream.mechanisms.noise import discrete_gaussian_variance
from privstream.mechanisms.tasks import BallTask, MeanTask
from tests.client.helpers import SeededRandomness
from tests.client.make_cgm_vectors import PATH, Step, render

DOC = json.loads(PATH.read_text())
CHAINS: list[dict[str, Any]] = DOC["chains"]


def _step(state: dict[str, Any]) -> Step:
    center = state["center"]
    return Step(**{k: v for k, v in state.items() if k != "center"},
                center=None if center is None else tuple(center))  # fmt: skip


# -- shared vectors ----------------------------------------------------------------------------


def test_the_cgm_vector_file_is_current() -> None:
    assert PATH.read_text() == render()
    assert DOC["format"] == "privstream-client-cgm-vectors" and DOC["version"] == 1
    assert len(CHAINS) == 5 and sum(len(c["steps"]) for c in CHAINS) == 19


@pytest.mark.parametrize("k", range(len(CHAINS)))
def test_replaying_a_chain_gives_its_reports(k: int) -> None:
    """Each step's recorded draws reproduce ``x*`` and ``v``, consuming every draw."""
    step, chains = _step(CHAINS[k]["step"]), dict[int, Chain]()
    for s in CHAINS[k]["steps"]:
        rng = ReplayRandomness([(op, arg, value) for op, arg, value in s["draws"]])
        phase = s["slot"] % step.lag
        report, chains[phase] = chain_step(chains.get(phase, Chain()), step, s["slot"],
                                           s["value"], rng)  # fmt: skip
        assert rng.exhausted
        assert list(report.x) == pytest.approx(s["x"], rel=1e-12, abs=1e-12)
        assert report.v == pytest.approx(s["v"], rel=1e-12)


# -- the exact discrete Gaussian ---------------------------------------------------------------


@pytest.mark.parametrize("p, q", [(2, 1), (7, 3), (30, 1)])
def test_the_discrete_gaussian_has_its_pmf(p: int, q: int) -> None:
    """χ² of 20,000 draws against ``∝ exp(−x²/2σ²)`` (cells with ≥ 5 expected, tails merged)
    below the 1e-4 quantile; mean and variance within 4.5σ of the exact ones."""
    rng, n = SeededRandomness(11 * p + q), 20_000
    draws = [discrete_gaussian(p, q, rng) for _ in range(n)]
    sigma2 = p / q
    support = range(-int(12 * math.sqrt(sigma2)) - 2, int(12 * math.sqrt(sigma2)) + 3)
    weights = {x: math.exp(-x * x / (2 * sigma2)) for x in support}
    total = math.fsum(weights.values())
    expected = {x: n * w / total for x, w in weights.items()}
    cells = [x for x in support if expected[x] >= 5]
    counts = {x: 0 for x in cells}
    for y in draws:
        counts[y if y in counts else min(cells, key=lambda c: abs(c - y))] += 1
    edge = {cells[0], cells[-1]}
    tail = {x: n * math.fsum(weights[y] for y in support if (y <= x if x < 0 else y >= x)) / total
            for x in edge}  # fmt: skip
    chi2 = math.fsum((counts[x] - (tail[x] if x in edge else expected[x])) ** 2
                     / (tail[x] if x in edge else expected[x]) for x in cells)  # fmt: skip
    dof = len(cells) - 1
    assert chi2 < dof + 3.72 * math.sqrt(2 * dof) + 10  # ≈ the 1e-4 quantile
    var = discrete_gaussian_variance(Fraction(p, q))
    mean = sum(draws) / n
    assert abs(mean) < 4.5 * math.sqrt(var / n)
    sample_var = sum((y - mean) ** 2 for y in draws) / (n - 1)
    assert abs(sample_var - var) < 4.5 * var * math.sqrt(2 / n) * 1.2  # excess kurtosis ≈ 0


def test_the_sampler_uses_integer_draws_only() -> None:
    """A large σ² (the grid's, 4·10⁵ steps) needs only ``randbelow`` with integer arguments."""
    from privstream.client.randomizers import RecordingRandomness

    rng = RecordingRandomness(SeededRandomness(3))
    s = 400_000
    draws = [discrete_gaussian(s * (s + 1), 1, rng) for _ in range(200)]
    assert {op for op, _, _ in rng.draws} == {"randbelow"}
    assert abs(sum(draws) / 200) < 4.5 * s / math.sqrt(200)


# -- one distribution with the server's simulated CGM clients -----------------------------------

N_USERS = 2500
CASES: dict[str, tuple[Step, MeanTask | BallTask, list[int]]] = {
    "scalar": (Step(sigma1=0.5, grid_bits=10), MeanTask(0.0, 1.0), [0, 1, 2, 3, 4]),
    "ball, lag 2, gap-aware": (
        Step(sigma1=0.6, grid_bits=10, lag=2, gap_aware=True, bound=0.2, lower=None,
             upper=None, center=(0.0, 1.0), radius=1.0),
        BallTask((0.0, 1.0), 1.0), [0, 1, 2, 5, 6]),
}  # fmt: skip


def _values(slot: int, d: int) -> Any:
    """Every user's raw value at ``slot``: moves faster than ``C`` (the differential clip bites),
    some beyond the domain (the range clip bites)."""
    i = np.arange(N_USERS)[:, None]
    base = 0.3 + 0.15 * slot * np.where(i % 2 == 0, 1.0, -1.0) + 0.001 * (i % 7)
    out = base + 0.1 * np.arange(d)[None, :]
    return out[:, 0] if d == 1 else out + np.array([0.0, 1.0])[:d][None, :]


def _server(step: Step, task: MeanTask | BallTask, slots: list[int]) -> list[tuple[Any, Any]]:
    d, state = task.d, CgmClients.empty(N_USERS, step.lag, task.d)
    rng, out = np.random.default_rng(2026), []
    for slot in slots:
        proto = CgmProtocol(slot, task, step.bound, step.sigma1, step.grid_bits, step.lag,
                            step.reuse, step.gap_aware)  # fmt: skip
        reports, state = proto.respond(_values(slot, d), np.ones(N_USERS, bool), state, rng)
        out.append((reports, state.clipped[:, slot % step.lag].copy()))
    return out


def _device(step: Step, d: int, slots: list[int]) -> list[tuple[Any, Any]]:
    chains = [dict[int, Chain]() for _ in range(N_USERS)]
    rng, out = SeededRandomness(2026), []
    for slot in slots:
        values, rows, clipped = _values(slot, d), [], []
        for user in range(N_USERS):
            value = values[user].tolist()
            phase = slot % step.lag
            report, chain = chain_step(chains[user].get(phase, Chain()), step, slot, value, rng)
            chains[user][phase] = chain
            rows.append([*report.x, report.v])
            clipped.append(chain.clipped)
        out.append((np.array(rows), np.array(clipped)))
    return out


def _z(a: float, b: float, se: float) -> float:
    return abs(a - b) / se


@pytest.mark.parametrize("case", sorted(CASES))
def test_device_reports_match_the_server_cgm_clients(case: str) -> None:
    """Per slot of a chain (noise reused from the previous report): ``v`` and the clipped value
    equal the server's exactly (a ball's
    norm to 1e-12); the noise ``x* − x'`` has the server's mean and variance and the
    lag covariance (the reuse) of the server's, all within 4.5σ two-sample; and both variances
    match ``Var_t = g²·s_t(s_t+1) + r_t²·Var_{t−1}`` (the chain's variance formula) within 4.5σ."""
    step, task, slots = CASES[case]
    d, n = task.d, N_USERS
    server, device = _server(step, task, slots), _device(step, d, slots)
    grid = (2 * (task.radius if isinstance(task, BallTask) else 0.5)) / 2**step.grid_bits
    theory: dict[int, tuple[float, float]] = {}
    previous: dict[int, Any] = {}
    for slot, (srv, srv_clip), (dev, dev_clip) in zip(slots, server, device, strict=True):
        assert np.array_equal(srv[:, -1], dev[:, -1]), "v differs from the server's"
        same = np.array_equal if d == 1 else lambda a, b: np.allclose(a, b, rtol=1e-12, atol=0)
        assert same(srv_clip, dev_clip), "the clipped value differs from the server's"
        v = float(dev[0, -1])
        noise_srv, noise_dev = srv[:, :-1] - srv_clip, dev[:, :-1] - dev_clip
        phase = slot % step.lag
        var_t = _chain_variance(step, d, grid, v, theory.get(phase))
        theory[phase] = (var_t, v)
        for j in range(d):
            a, b = noise_dev[:, j], noise_srv[:, j]
            assert _z(a.mean(), b.mean(), math.sqrt(2 * var_t / n)) < 4.5
            se_var = var_t * math.sqrt(2 / n)
            assert _z(a.var(), b.var(), math.sqrt(2) * se_var) < 4.5
            assert _z(a.var(), var_t, se_var) < 4.5 and _z(b.var(), var_t, se_var) < 4.5
            if phase in previous:
                pa, pb = previous[phase]
                ca, cb = np.mean(a * pa[:, j]), np.mean(b * pb[:, j])
                se_c = math.sqrt(np.var(a * pa[:, j]) / n + np.var(b * pb[:, j]) / n)
                assert _z(ca, cb, se_c) < 4.5
        previous[phase] = (noise_dev, noise_srv)


def _chain_variance(
    step: Step, d: int, grid: float, v: float, prev: tuple[float, float] | None
) -> float:
    """``Var(γ_t)`` per coordinate: fresh noise ``g²·s(s+1)`` (+ ≤ g²/4 of rounding, negligible)
    plus ``r_t²·Var(γ_{t−1})``, ``r_t = b/(b² + v_{t−1})``, ``V_t = 1 − r_t·b``, where the step's
    ``b² = v_{t−1}/v_t − v_{t−1}`` (``v_t = v_{t−1}/(b² + v_{t−1})``; a gap widens ``C``)."""
    from privstream.client.cgm import noise_std_steps

    if prev is None:
        _, s = noise_std_steps(1.0, step, d)
        return grid * grid * s * (s + 1)
    var_prev, v_prev = prev
    b = math.sqrt(max(v_prev / v - v_prev, 0.0))
    r = b / (b * b + v_prev)
    _, s = noise_std_steps(1 - r * b, step, d)
    return grid * grid * s * (s + 1) + r * r * var_prev


# -- the device: μ² ledger, chain store, refusals ------------------------------------------------


@dataclass(frozen=True)
class CgmFakeRequest:
    stream: str = "heart"
    slot: int = 0
    round: int = 0
    purpose: str = "cgm"
    cgm: Step = field(default_factory=lambda: Step(sigma1=2.0))
    asked: bool = True

    def asks(self, user_id: str) -> bool:
        return self.asked


def _device_at(path: Path, mu: float, create: bool = False, seed: int = 5) -> CgmDevice:
    return CgmDevice("u1", FileStore(path, create=create), GaussianPolicy(mu),
                     SeededRandomness(seed))  # fmt: skip


def test_a_server_asking_more_than_the_devices_mu_is_refused(tmp_path: Path) -> None:
    """σ̃₁ = 2 costs μ² = 1/4 a report: a device with μ = 1 sends 4 reports, refuses the 5th
    (``exhausted``), also after a restart, and a larger ``σ̃₁`` still fits what is left."""
    path = tmp_path / "cgm.json"
    device = _device_at(path, 1.0, create=True)
    answers = [device.answer(CgmFakeRequest(slot=t), 0.5) for t in range(5)]
    assert [a.v for a in answers[:4] if not isinstance(a, Refusal)] == pytest.approx(
        [1.0, 0.5525, 0.4055, 0.3336], abs=1e-4
    )
    assert all(a.mu2 == 0.25 for a in answers[:4] if not isinstance(a, Refusal))
    assert isinstance(answers[4], Refusal) and answers[4].reason == "exhausted"
    again = _device_at(path, 1.0)
    assert again.ledger.streams["heart"].spent == 1.0 and again.ledger.streams["heart"].reports == 4
    refused = again.answer(CgmFakeRequest(slot=9), 0.5)
    assert isinstance(refused, Refusal) and refused.reason == "exhausted"
    assert report_charge(Step(sigma1=1.0)) == 1.0
    fresh = _device_at(tmp_path / "b.json", 0.9, create=True)
    first = fresh.answer(CgmFakeRequest(cgm=Step(sigma1=1.0)), 0.5)
    assert isinstance(first, Refusal) and first.reason == "exhausted"  # μ² 1 > 0.81


def test_the_chain_survives_a_restart(tmp_path: Path) -> None:
    """The chain is written before a report leaves: a restarted device continues it (``v`` goes
    on down the schedule) and its next report equals an uninterrupted device's."""
    a = _device_at(tmp_path / "a.json", 10.0, create=True, seed=1)
    b = _device_at(tmp_path / "b.json", 10.0, create=True, seed=1)
    for t in range(2):
        assert a.answer(CgmFakeRequest(slot=t), 0.4) == b.answer(CgmFakeRequest(slot=t), 0.4)
    restarted = CgmDevice("u1", FileStore(tmp_path / "b.json"), GaussianPolicy(10.0),
                          b.randomness)  # fmt: skip
    one, two = a.answer(CgmFakeRequest(slot=2), 0.9), restarted.answer(CgmFakeRequest(slot=2), 0.9)
    assert one == two and not isinstance(one, Refusal) and one.v == pytest.approx(0.4055, abs=1e-4)
    chain = restarted.chains["heart"]["0"]
    assert chain.steps == 3 and chain.clipped == [
        pytest.approx(0.45)
    ]  # 0.4, 0.4, then 0.9 → 0.45 (C)


def test_replays_changes_and_bad_values_are_refused(tmp_path: Path) -> None:
    device = _device_at(tmp_path / "c.json", 10.0, create=True)
    assert not isinstance(device.answer(CgmFakeRequest(slot=3), 0.2), Refusal)
    reasons = [
        device.answer(CgmFakeRequest(slot=3, round=1), 0.2),  # one report per slot
        device.answer(CgmFakeRequest(slot=2), 0.2),
        device.answer(CgmFakeRequest(slot=4, cgm=Step(sigma1=2.0, bound=0.5)), 0.2),
        device.answer(CgmFakeRequest(slot=4), math.nan),
        device.answer(CgmFakeRequest(slot=4), [0.1, 0.2]),
        device.answer(CgmFakeRequest(slot=4, asked=False), 0.2),
    ]
    assert [r.reason for r in reasons if isinstance(r, Refusal)] == [
        "stale", "stale", "changed", "invalid", "invalid", "not-asked"]  # fmt: skip
    assert "nan" not in reasons[3].message.lower()  # type: ignore[union-attr]
    assert device.ledger.streams["heart"].reports == 1


def test_a_corrupt_or_missing_store_refuses(tmp_path: Path) -> None:
    path = tmp_path / "d.json"
    device = _device_at(path, 10.0, create=True)
    assert not isinstance(device.answer(CgmFakeRequest(), 0.2), Refusal)
    path.write_text(path.read_text().replace('"steps": 1', '"steps": 0'))
    for broken in (_device_at(path, 10.0), _device_at(tmp_path / "none.json", 10.0)):
        refusal = broken.answer(CgmFakeRequest(slot=1), 0.2)
        assert isinstance(refusal, Refusal) and refusal.reason == "store"


def test_the_step_state_is_the_protocol_cgm_step() -> None:
    """The device reads the schema's CgmStep as it is (same fields, same JSON)."""
    from privstream.schema.protocol import CgmStep

    step = CgmStep(sigma1=2.0, grid_bits=8, lag=1, bound=0.05)
    assert step_state(step) == step_state(Step(sigma1=2.0)) | {"center": None}
    assert {k: v for k, v in step_state(step).items() if v is not None} == step.to_json()
    report, _ = chain_step(Chain(), step, 0, 0.5, SeededRandomness(1))
    assert report.v == 1.0 and len(report.x) == 1
    assert replace(Step(), sigma1=1.0).sigma1 == 1.0


def test_a_huge_vector_lands_on_the_sphere_as_the_servers() -> None:
    """A value whose norm overflows is projected in its own direction, like ``ball_clip``."""
    from privstream.client.cgm import domain_clip
    from privstream.mechanisms.cgm_math import ball_clip

    step = Step(lower=None, upper=None, center=(0.0, 1.0), radius=2.0)
    for value in ([1e308, -1e308], [3.0, 1.0], [0.5, 1.5]):
        want = ball_clip(np.array(value), np.array([0.0, 1.0]), 2.0).tolist()
        assert domain_clip(value, step) == pytest.approx(want, rel=1e-12)
