"""Finding 1 of the privacy audit: the noise key was public by default (``--seed 1``).

Reproduced: whoever knows the key redraws every noise value and subtracts it from the releases,
recovering the exact histograms. Fixed: runs refuse to start without a secret of ≥ 128 bits
unless a reproducible run is asked for explicitly (and then every output says so), and the
random stream is AES-CTR keyed per (secret, stream, slot, purpose), so a guessed key gives
nothing.
"""

from __future__ import annotations

import pickle
import secrets
from typing import Any

import numpy as np
import pytest
from prometheus_client import REGISTRY
from randomgen import AESCounter

from privstream.cli.commands import main
from privstream.families.registry import PERSONALIZED
from privstream.flows import ldp_ids as ldp_flow
from privstream.flows import personalized as pers_flow
from privstream.flows.secret import resolve_noise_key
from privstream.mechanisms import personalized
from privstream.mechanisms.personalized import PersonalizedConfig
from privstream.mechanisms.seeding import NoiseKey, SecretError, SlotRandomness, derive_rng
from privstream.operators.family import family_mechanisms
from privstream.operators.registration import Preferences
from privstream.schema.events import EventBatch
from tests.attacks.helpers import run_operator

N, T, W, EPS = 300, 12, 4, 1.0


def batches() -> list[EventBatch]:
    rng = np.random.default_rng(5)
    return [
        EventBatch("s", np.full(N, t), np.arange(N), (rng.random(N) < 0.4).astype(float), None, t)
        for t in range(1, T + 1)
    ]


def true_counts() -> list[np.ndarray]:
    return [np.bincount(b.values.astype(int), minlength=2) for b in batches()]


def uniform_releases(key: NoiseKey | int) -> list[dict[str, Any]]:
    config = PersonalizedConfig(population=N, epsilon=EPS, window=W)
    out = run_operator(
        batches(),
        lambda keyed: family_mechanisms(
            "p",
            keyed,
            family=PERSONALIZED,
            mechanism="Uniform",
            config=config,
            secret=key,
            registration=Preferences(),
        ),
    )
    return out["releases"]


def attacker_recovers(releases: list[dict[str, Any]], guessed: NoiseKey | int) -> np.ndarray:
    """Redraw Uniform's noise with a guessed key and subtract it from every release."""
    recovered = []
    for r in releases:
        randomness = SlotRandomness(guessed, "s", r["slot"], scope="Uniform")
        noise = personalized.discrete_noise(randomness("pub/noise"), EPS / W, 2)
        recovered.append(np.asarray(r["estimate"]) - noise)
    return np.array(recovered)


def test_a_public_seed_gives_the_exact_histograms_away() -> None:
    """The attack, reproduced on an explicit insecure seed: exact recovery, error 0."""
    releases = uniform_releases(1)
    assert all(r["insecure_seed"] for r in releases)
    assert np.array_equal(attacker_recovers(releases, 1), np.array(true_counts()))


def test_a_secret_key_defeats_the_same_attack() -> None:
    key = NoiseKey.from_text(secrets.token_hex(32))
    releases = uniform_releases(key)
    assert not any(r["insecure_seed"] for r in releases)
    guess = attacker_recovers(releases, 1)  # the old default key
    wrong = np.abs(guess - np.array(true_counts())).mean()
    assert wrong > 0.5 * W / EPS  # as far off as the noise itself (E|DLap(b)| ≈ b = w/ε = 4)


def test_flows_refuse_to_build_without_a_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PRIVSTREAM_SECRET", raising=False)
    with pytest.raises(SecretError, match="refusing to start without a secret"):
        ldp_flow.build(dataset="sin", users=200, slots=3)
    with pytest.raises(SecretError, match="refusing to start without a secret"):
        pers_flow.build(dataset="sin", users=200, slots=3)


def test_the_cli_refuses_to_run_without_a_secret(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Any
) -> None:
    monkeypatch.delenv("PRIVSTREAM_SECRET", raising=False)
    out = tmp_path / "r.jsonl"
    argv = ["run", "ldp-ids", "--users", "200", "--slots", "3", "--out", str(out)]
    assert main([*argv, "--no-progress"]) == 2
    assert "refusing to start without a secret" in capsys.readouterr().err
    assert not out.exists()


def test_an_insecure_seed_is_marked_everywhere(tmp_path: Any) -> None:
    out, ledger = tmp_path / "r.jsonl", tmp_path / "l.jsonl"
    code = main(
        ["run", "ldp-ids", "--users", "300", "--slots", "4", "--insecure-seed", "9",
         "--out", str(out), "--ledger-out", str(ledger), "--no-progress"]
    )  # fmt: skip
    assert code == 0
    lines = out.read_text().splitlines() + ledger.read_text().splitlines()
    assert len(lines) == 8 and all('"insecure_seed":true' in line for line in lines)
    assert REGISTRY.get_sample_value("privstream_insecure_seed") == 1.0


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("hunter2", "bits of entropy"),
        ("0123456789abcdef0123456789abcde", "bits of entropy"),  # 124 bits of hex
        ("a" * 64, "not random"),
        ("abcd" * 16, "not random"),
        ("correcthorsebatterystaple", "not valid base64"),  # 25 characters: no encoding
        ("correcthorsebatterystaple1", "words make up"),
    ],
)
def test_weak_secrets_are_refused(text: str, why: str) -> None:
    with pytest.raises(SecretError, match=why) as err:
        NoiseKey.from_text(text, origin="secret file s.txt")
    assert text not in str(err.value)  # an error never shows the secret


def test_strong_secrets_are_accepted_and_never_shown(tmp_path: Any) -> None:
    text = secrets.token_hex(16)  # exactly 128 bits
    path = tmp_path / "secret"
    path.write_text(text + "\n")
    key = resolve_noise_key(secret_file=path)
    assert key == NoiseKey.from_text(text) and not key.insecure
    assert text not in repr(key) and text not in key.fingerprint()
    assert resolve_noise_key(secret=secrets.token_urlsafe(24)).material  # base64 ≥ 128 bits
    with pytest.raises(SecretError, match="not both"):
        resolve_noise_key(secret_file=path, insecure_seed=3)


def test_the_snapshot_holds_a_fingerprint_never_the_secret() -> None:
    from privstream.operators.stream_state import StreamState

    key = NoiseKey.from_text(secrets.token_hex(32))
    state = StreamState("s", {}, np.zeros(2), binding={"noise key": key.fingerprint()})
    blob = pickle.dumps(state)
    assert key.material not in blob and key.prf_key not in blob
    assert key.fingerprint().encode() in blob


def test_the_noise_stream_is_keyed_aes_ctr_not_pcg64() -> None:
    key = NoiseKey.from_text(secrets.token_hex(32))
    rng = derive_rng(key, "s", 1, "p")
    assert isinstance(rng.bit_generator, AESCounter)
    # Equal tuples replay bit-identically; a different key or slot gives another stream.
    assert np.array_equal(
        rng.integers(0, 2**62, 8), derive_rng(key, "s", 1, "p").integers(0, 2**62, 8)
    )
    other = NoiseKey.from_text(secrets.token_hex(32))
    assert not np.array_equal(
        derive_rng(key, "s", 1, "p").integers(0, 2**62, 8),
        derive_rng(other, "s", 1, "p").integers(0, 2**62, 8),
    )
