"""Seeded randomness per (secret, stream, slot, purpose) (design §6, spec §1.6 item 4)."""

from __future__ import annotations

import dataclasses
import hashlib
import math
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from privstream.mechanisms.contract import Slot
from privstream.mechanisms.seeding import STREAM_LEVEL, EnrolmentOrder, SlotRandomness, derive_rng

Key = tuple[int | bytes, str, int, str]

BASE: Key = (123456789, "orders/country", 42, "m1/client")
Z_CORR = 4.0  # standard errors allowed for a sample correlation of independent draws


def draws(key: Key, n: int = 8) -> np.ndarray:
    return derive_rng(*key).random(n)


keys = st.tuples(
    st.one_of(st.integers(-(2**100), 2**100), st.binary(min_size=0, max_size=24)),
    st.text(max_size=12),
    st.integers(-(2**62), 2**62),
    st.text(max_size=12),
)


@settings(max_examples=100, deadline=None)
@given(key=keys)
def test_same_tuple_same_stream(key: Key) -> None:
    assert np.array_equal(draws(key, 32), draws(key, 32))
    a, b = derive_rng(*key), derive_rng(*key)
    assert np.array_equal(a.integers(0, 2**62, 50), b.integers(0, 2**62, 50))


@settings(max_examples=100, deadline=None)
@given(key=keys, other=keys)
def test_different_tuples_different_streams(key: Key, other: Key) -> None:
    if key == other or (isinstance(key[0], int) != isinstance(other[0], int)):
        return  # an int secret is its 16-byte encoding; do not compare across the two forms
    assert not np.array_equal(draws(key), draws(other))


@pytest.mark.parametrize("field", range(4))
def test_each_component_changes_the_stream(field: int) -> None:
    secret, stream, slot, purpose = BASE
    changed: Key = [
        (123456790, stream, slot, purpose),
        (secret, "orders/city", slot, purpose),
        (secret, stream, 43, purpose),
        (secret, stream, slot, "m2/client"),
    ][field]
    assert not np.array_equal(draws(BASE), draws(changed))


def test_components_are_framed() -> None:
    # Moving characters between stream and purpose must not give the same input to the hash.
    assert not np.array_equal(draws((1, "ab", 0, "c")), draws((1, "a", 0, "bc")))
    assert not np.array_equal(draws((1, "", 0, "x")), draws((1, "x", 0, "")))
    assert not np.array_equal(draws((b"\x01", "s", 0, "p")), draws((b"\x01\x00", "s", 0, "p")))
    # A bytes secret is followed directly by the stream name: the boundary must be encoded.
    assert not np.array_equal(draws((b"key", "stream", 0, "p")), draws((b"keys", "tream", 0, "p")))


def test_independence_across_slots_and_purposes() -> None:
    """First draws over many (slot, purpose) keys are uniform and mutually uncorrelated."""
    slots = 4000
    first = np.array(
        [[derive_rng(7, "s", t, p).random() for p in ("m1", "m2")] for t in range(slots)]
    )
    for column in first.T:
        assert stats.kstest(column, "uniform").pvalue > 1e-3
    bound = Z_CORR / math.sqrt(slots)
    assert abs(float(np.corrcoef(first[:, 0], first[:, 1])[0, 1])) < bound  # across purposes
    assert abs(float(np.corrcoef(first[:-1, 0], first[1:, 0])[0, 1])) < bound  # adjacent slots
    secrets = np.array([derive_rng(s, "s", 1, "m1").random() for s in range(slots)])
    assert stats.kstest(secrets, "uniform").pvalue > 1e-3
    assert abs(float(np.corrcoef(secrets, first[:, 0])[0, 1])) < bound


def test_slot_randomness_delegates_to_derive_rng() -> None:
    r = SlotRandomness(BASE[0], BASE[1], BASE[2])
    assert np.array_equal(r(BASE[3]).random(8), draws(BASE))
    level = r.stream_level("lpu/groups").random(8)
    assert np.array_equal(level, derive_rng(BASE[0], BASE[1], STREAM_LEVEL, "lpu/groups").random(8))
    # Stream-level randomness does not depend on the slot; per-slot randomness does.
    other_slot = SlotRandomness(BASE[0], BASE[1], 7)
    assert np.array_equal(other_slot.stream_level("lpu/groups").random(8), level)
    assert not np.array_equal(other_slot(BASE[3]).random(8), draws(BASE))
    assert not np.array_equal(r("lpu/groups").random(8), level)


@pytest.mark.parametrize(
    "secret", [987654321987654321, -31337, b"sup3r-s3cret-bytes", 2**100 + 12345]
)
def test_repr_never_shows_the_secret(secret: int | bytes) -> None:
    r = SlotRandomness(secret, "clicks", 12)
    shown = [repr(r), str(r), f"{r}", f"{r!r}", repr([r]), repr(Slot("clicks", 12, None, r))]  # type: ignore[arg-type]
    needle = secret.decode() if isinstance(secret, bytes) else str(secret)
    for text in shown:
        assert needle not in text
        assert "clicks" in text
    assert repr(r) == "SlotRandomness(stream='clicks', slot=12, scope='')"
    if isinstance(secret, bytes):
        for text in shown:
            assert repr(secret) not in text and secret.hex() not in text
    else:
        for text in shown:
            assert hex(secret) not in text


def test_slot_randomness_is_frozen_and_picklable() -> None:
    r = SlotRandomness(5, "s", 3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.slot = 4  # type: ignore[misc]
    again = pickle.loads(pickle.dumps(r))
    assert again == r
    assert np.array_equal(again("x").random(4), r("x").random(4))


@settings(max_examples=50, deadline=None)
@given(stream=st.text(max_size=12), users=st.lists(st.text(max_size=10), max_size=8, unique=True))
def test_the_enrolment_rank_is_keyed_blake2b_of_the_length_prefixed_stream_and_user(
    stream: str, users: list[str]
) -> None:
    """The rank, made from a per-stream prefix copied per user (issue 26: a keyed BLAKE2b per
    user was a fifth of a flow file's CPU), is the documented PRF, and ``sort`` orders by it."""
    order = EnrolmentOrder(b"k" * 32)

    def reference(user: str) -> bytes:
        h = hashlib.blake2b(key=order.key, digest_size=16, person=b"privstream-enrol")
        for part in (stream.encode(), user.encode("utf-8", "surrogatepass")):
            h.update(len(part).to_bytes(8, "little"))
            h.update(part)
        return h.digest()

    assert [order.rank(stream, u) for u in users] == [reference(u) for u in users]
    assert order.sort(stream, users) == sorted(users, key=lambda u: (reference(u), u))
