"""Issue 18 §4, "weak secrets accepted": the audit's weak keys started a private run.

Reproduced (before the fix ``NoiseKey.from_text`` accepted all of them): a placeholder, the
SHA-256 of the empty string, an English sentence, a keyboard walk and 40 digits of π; anyone who
guesses such a key redraws the noise and subtracts it (``test_public_key``). Fixed: a key is hex
of ≥ 32 digits or base64/base64url of ≥ 16 bytes with no visible structure
(``mechanisms/key_strength.py``), and every refusal says how to make one. Keys made by
``secrets`` are never refused: 60,000 of them are checked here, and each statistical test's
false-refusal probability is below ``ALPHA`` by construction.
"""

from __future__ import annotations

import base64
import hashlib
import os
import random
import secrets
from collections.abc import Callable

import pytest

from privstream.flows.secret import ENV_SECRET, resolve_noise_key
from privstream.mechanisms import key_strength
from privstream.mechanisms.key_strength import ALPHA, binomial_tail, refused_counts
from privstream.mechanisms.seeding import NoiseKey, SecretError

HOW_TO = "python -c 'import secrets; print(secrets.token_hex(32))'"
PI_40 = "3141592653589793238462643383279502884197"

AUDIT_WEAK = {  # the five keys of the audit, each accepted before the fix
    "placeholder": "REPLACE_ME_WITH_A_REAL_SECRET_KEY",
    "sha256 of ''": hashlib.sha256(b"").hexdigest(),
    "English sentence": "TheQuickBrownFoxJumpsOverTheLazyDog",
    "keyboard walk": "qwertyuiopasdfghjklzxcvbnm1234567890QWERTY",
    "40 digits of pi": PI_40,
}
MORE_WEAK = {
    "placeholder, 4-aligned": "REPLACE_ME_WITH_A_REAL_SECRET_KEY_",
    "placeholder, kebab case": "your-secret-key-here-0123456789abcdef",
    "placeholder word in random hex": "changeme" + secrets.token_hex(32),
    "sha1 of ''": hashlib.sha1(b"").hexdigest(),
    "md5 of ''": hashlib.md5(b"").hexdigest(),
    "sha256 of '' upper-case": hashlib.sha256(b"").hexdigest().upper(),
    "sha256 of '' in base64": base64.b64encode(hashlib.sha256(b"").digest()).decode(),
    "sha256 of 'password'": hashlib.sha256(b"password").hexdigest(),
    "sha512 of '' in base64url": base64.urlsafe_b64encode(hashlib.sha512(b"").digest()).decode(),
    "sentence with spaces": "the quick brown fox jumps over the lazy dog",
    "sentence in one case": "thequickbrownfoxjumpsoverthelazydog",
    "passphrase": "correcthorsebatterystaple1",
    "digits of e": "2718281828459045235360287471352662497757",
    "hex digits of pi": "243f6a8885a308d313198a2e03707344a4093822299f31d0",
    "pi in the middle": "xK9" + PI_40[:20] + "Qzw",
    "a long decimal number": "".join(random.Random(1).choices("0123456789", k=60)),
    "all zero": "0" * 64,
    "a repeated unit": "a1b2" * 16,
    "a repeated random unit": secrets.token_hex(8) * 3,
    "the alphabet": "abcdefghijklmnopqrstuvwxyz0123456789ABCDEF",
    "keyboard columns": "1qaz2wsx3edc4rfv5tgb6yhn7ujm8ik9",
    "hex letters only": "abcdefabcdefabcdeffedcbafedcbaabcdefabcd",
    "too short": "hunter2",
    "124 bits of hex": "0123456789abcdef0123456789abcde",
    "15 bytes of base64": base64.b64encode(bytes(range(1, 16))).decode(),
    "mixed base64 alphabets": secrets.token_urlsafe(32)[:40] + "+/_-",
    "padding in the middle": "Zm9v=" + secrets.token_urlsafe(32),
}


@pytest.mark.parametrize("name", list(AUDIT_WEAK) + list(MORE_WEAK))
def test_weak_secrets_are_refused_and_say_how_to_make_one(name: str) -> None:
    text = {**AUDIT_WEAK, **MORE_WEAK}[name]
    with pytest.raises(SecretError) as refused:
        NoiseKey.from_text(text, origin="secret file s.key")
    message = str(refused.value)
    assert message.startswith("secret file s.key ") and HOW_TO in message
    assert text not in message and text[:12] not in message  # never shown, not even a part


def test_the_audit_keys_are_refused_for_what_they_are() -> None:
    why = {name: key_strength.key_weakness(text) for name, text in AUDIT_WEAK.items()}
    assert why["placeholder"] is not None and "placeholder" in why["placeholder"]
    assert "sha256 digest of ''" in str(why["sha256 of ''"])
    assert "words make up 23 of its 35" in str(why["English sentence"])
    assert "walks make up 42 of its 42" in str(why["keyboard walk"])
    assert "digits of π" in str(why["40 digits of pi"])
    decimal = MORE_WEAK["a long decimal number"]  # no known constant: refused as digits
    assert "digits only" in str(key_strength.key_weakness(decimal))


def _forms(rng: random.Random) -> dict[str, Callable[[], str]]:
    """The keys ``secrets`` makes, from a seeded generator so that the test is reproducible:
    ``token_hex(n)`` is ``token_bytes(n).hex()``, ``token_urlsafe(n)`` is the unpadded
    base64url of ``token_bytes(n)``; and the padded base64 of ``token_bytes(n)``."""
    return {
        f"{form}({n})": _maker(encode, rng, n)
        for n in (16, 32)
        for form, encode in (("token_hex", _hex), ("token_urlsafe", _url), ("b64encode", _b64))
    }


def _maker(encode: Callable[[bytes], str], rng: random.Random, n: int) -> Callable[[], str]:
    return lambda: encode(rng.randbytes(n))


def _hex(raw: bytes) -> str:
    return raw.hex()


def _url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def test_keys_made_by_secrets_are_never_refused() -> None:
    """10,000 keys of each of six forms: zero refusals."""
    rng = random.Random(18)
    refused = {}
    for form, make in _forms(rng).items():
        keys = [make() for _ in range(10_000)]
        refused[form] = sum(key_strength.key_weakness(k) is not None for k in keys)
    assert refused == dict.fromkeys(refused, 0)
    # the seeded forms are the ones secrets makes (same length and alphabet)
    for n in (16, 32):
        assert len(secrets.token_hex(n)) == len(_hex(os.urandom(n)))
        assert len(secrets.token_urlsafe(n)) == len(_url(os.urandom(n)))
        assert NoiseKey.from_text(secrets.token_urlsafe(n)) and NoiseKey.from_text(
            _b64(os.urandom(n))
        )


@pytest.mark.parametrize(
    ("n", "share", "tests"), [(32, 1 / 16, 16), (43, 26 / 64, 8), (22, 10 / 64, 8)]
)
def test_each_statistical_test_refuses_a_random_key_below_alpha(
    n: int, share: float, tests: int
) -> None:
    """The refused counts are the extreme ones: tails beyond them, union-bounded over the
    ``tests`` counts a key is checked on, are below ALPHA; one count inwards they are not."""
    low, high = refused_counts(n, share, tests)
    assert (
        tests * binomial_tail(n, share, high) < ALPHA <= tests * binomial_tail(n, share, high - 1)
    )
    if low >= 0:
        assert tests * binomial_tail(n, share, low, upper=False) < ALPHA
    assert tests * binomial_tail(n, share, low + 1, upper=False) >= ALPHA


def test_the_keys_tests_and_docs_use_are_accepted() -> None:
    for text in (
        "3f9a0c5e7b2d48e1a6c4f0b9d2e7a153",  # tests/flows/test_ldp_ids_flow.py
        "c81d6e02f94b37a5e0d9b2c6a17f845e",
        "8c1f4e6a92b3d5704ef1a2c9b68d3e57",  # tests/flows/test_personalized_flow.py
        "5b0e9d47c2a81f36e4d7b0a95c18f2e3",  # tests/integration/test_demo.py
        "7f3a9c1e5b2d8f4a6c0e9b1d3f5a7c2e",  # tests/attacks/test_floating_point_attack.py
        "RaRI3ATqVl9AinbJ3RJ88GkURnYsncB7QKAXKcvvY_c",  # tests/integration/test_metrics_privacy.py
        "590cf64da29fd26398fc4f386277c1379c5a91481a959de3d86159b217a6b507",  # test_prometheus
    ):
        assert key_strength.key_weakness(text) is None, text


def test_an_insecure_seed_never_replaces_the_environments_secret(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 18 §4: with ``$PRIVSTREAM_SECRET`` set, ``insecure_seed`` used to win silently."""
    monkeypatch.setenv(ENV_SECRET, secrets.token_hex(32))
    with pytest.raises(SecretError, match=r"not both: \$PRIVSTREAM_SECRET .* unset \$PRIVSTREAM"):
        resolve_noise_key(insecure_seed=3)
    assert not resolve_noise_key().insecure  # the secret alone is used
    monkeypatch.setenv(ENV_SECRET, "")  # set but empty is no secret: the seed is the key
    assert resolve_noise_key(insecure_seed=3).insecure
