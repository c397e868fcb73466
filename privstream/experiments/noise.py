"""``privstream bench noise``: what the hardened randomness costs (design §6, §8).

Measured side by side in one run, as ratios:

1. **Random stream.** The keyed AES-CTR generator every mechanism now draws from against the
   PCG64 it replaced: derive one generator (the per-slot, per-purpose key) and draw what the
   simulated clients of ``n`` users draw in one slot (``n`` uniform doubles and ``n`` bounded
   integers, the per-user LocSan path), at ``n = 10⁶``.
2. **Central noise.** The exact discrete Laplace (integer arithmetic over the keyed bits)
   against NumPy's float ``laplace`` it replaced, per draw, for one slot of a ``d = 2``
   histogram (the call overhead dominates) and for a ``d = 10⁴`` one (the vectorised rounds).
3. **A whole slot.** PBD on ``n = 10⁶`` users in two privacy classes, one step (class
   histogram, SM sampling, DC and publication noise), absolute milliseconds.
"""

from __future__ import annotations

import secrets
import statistics
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from privstream.families.registry import PERSONALIZED
from privstream.mechanisms.client import Requirements, SimulatedCurator
from privstream.mechanisms.contract import Slot
from privstream.mechanisms.noise import discrete_laplace, public_scale
from privstream.mechanisms.personalized import PersonalizedConfig
from privstream.mechanisms.seeding import NoiseKey, SlotRandomness, derive_rng


def _median_seconds(run: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def _client_draws(rng: np.random.Generator, n: int) -> None:
    rng.random(n)
    rng.integers(0, 7, n)


def random_stream(n: int, repeats: int) -> dict[str, Any]:
    """Seconds per slot of client draws for ``n`` users: PCG64 against keyed AES-CTR."""
    key = NoiseKey.from_text(secrets.token_hex(32))
    counter = iter(range(10**9))

    def pcg() -> None:
        seq = np.random.SeedSequence([next(counter), 1, 2, 3, 4, 5, 6, 7])
        _client_draws(np.random.Generator(np.random.PCG64(seq)), n)

    def aes() -> None:
        _client_draws(derive_rng(key, "s", next(counter), "m1/client"), n)

    old, new = _median_seconds(pcg, repeats), _median_seconds(aes, repeats)
    return {"users": n, "pcg64_s": old, "aes_ctr_s": new, "ratio": new / old}


def central_noise(repeats: int) -> dict[str, Any]:
    """µs per draw of the discrete Laplace against float Laplace, at d = 2 and d = 10⁴."""
    out: dict[str, Any] = {}
    key = NoiseKey.from_text(secrets.token_hex(32))
    scale = public_scale(1 / 0.005)  # Uniform at ε = 0.6, w = 120
    for d in (2, 10_000):
        rng = derive_rng(key, "s", d, "noise")
        new = _median_seconds(partial(discrete_laplace, rng, scale, d), repeats * 20)
        old = _median_seconds(partial(rng.laplace, 0.0, 200.0, d), repeats * 20)
        out[f"d={d}"] = {
            "discrete_us_per_draw": 1e6 * new / d,
            "float_us_per_draw": 1e6 * old / d,
            "ratio": new / old,
        }
    return out


def pbd_slot(n: int, repeats: int) -> dict[str, Any]:
    """Milliseconds of one PBD step over ``n`` users in two classes."""
    config = PersonalizedConfig(population=n, epsilon=1.0, window=20)
    mech = PERSONALIZED.build("PBD", config)
    kind = np.arange(n) % 2
    requirements = Requirements(np.array([1.0, 2.0])[kind], np.array([20, 10])[kind], population=n)
    values = (np.random.default_rng(1).random(n) < 0.3).astype(np.float64)
    key = NoiseKey.from_text(secrets.token_hex(32))
    state = mech.initial_state()
    slots = iter(range(1, 10**6))

    def step() -> None:
        nonlocal state
        t = next(slots)
        port = SimulatedCurator(values, config.task, requirements)
        state, _ = mech.step(state, Slot("s", t, port, SlotRandomness(key, "s", t, "PBD")))

    return {"users": n, "ms_per_slot": 1e3 * _median_seconds(step, repeats)}


def bench_noise(users: int = 1_000_000, repeats: int = 5) -> dict[str, Any]:
    """All three measurements (see the module docstring)."""
    return {
        "random_stream": random_stream(users, repeats),
        "central_noise": central_noise(repeats),
        "pbd_slot": pbd_slot(users, repeats),
    }


def format_noise(result: dict[str, Any]) -> str:
    rs, slot = result["random_stream"], result["pbd_slot"]
    lines = [
        f"random stream, client draws of n = {rs['users']:,} users per slot: PCG64 "
        f"{1e3 * rs['pcg64_s']:.1f} ms, keyed AES-CTR {1e3 * rs['aes_ctr_s']:.1f} ms "
        f"(ratio {rs['ratio']:.2f})",
    ]
    for d, row in result["central_noise"].items():
        lines.append(
            f"central noise, {d}: discrete Laplace {row['discrete_us_per_draw']:.3f} µs/draw, "
            f"float Laplace {row['float_us_per_draw']:.3f} µs/draw (ratio {row['ratio']:.1f})"
        )
    lines.append(f"PBD, one slot of n = {slot['users']:,} users: {slot['ms_per_slot']:.1f} ms")
    return "\n".join(lines)
