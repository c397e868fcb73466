"""Keyed cryptographic randomness per design §6: one generator per (key, stream, slot, purpose).

**Guarantee.** Every random draw of a mechanism comes from an AES-128 counter-mode stream
(``randomgen``'s ``AESCounter``, AES-NI where the CPU has it, the same bits without) whose key is
``BLAKE2b`` keyed with the run's secret over the length-prefixed tuple ``(stream, slot,
purpose)``. Keyed BLAKE2b is a PRF and AES-CTR a cryptographic pseudo-random generator, so without the secret the draws of one slot cannot be predicted from any other
slot's, any release, or any earlier output of the same generator (unlike PCG64, whose state is
recoverable from its output). A replayed slot derives the same key and draws exactly the same
noise, whatever happened before the crash; nothing of the generator lives in the snapshot.

**The secret** (``NoiseKey``) comes from a file or the environment, must be a random key of at
least 128 bits in hex or base64 (``NoiseKey.from_text`` refuses anything else, ``key_strength``)
and is never logged, exported or written to a snapshot: only its keyed ``fingerprint`` is, to
bind a recovery store to it. A reproducible run is an explicit choice, ``NoiseKey.insecure(seed)``: its
noise is public, and every release and metric of such a run says so.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from randomgen import AESCounter

from privstream.mechanisms.key_strength import MAKE_ONE, key_weakness

ENV_SECRET = "PRIVSTREAM_SECRET"
"""The environment variable holding a run's noise key (``NoiseKey.from_env``, the CLI)."""
STREAM_LEVEL = -(2**62)  # the "slot" of randomness that belongs to a stream, not to one slot
_FINGERPRINT_PERSON = b"privstream-fp"
_ENROLMENT_PERSON = b"privstream-enrol"
_CLOCK_PERSON = b"privstream-clk"
CLOCK_KEY_BYTES = 32


class SecretError(ValueError):
    """The secret given for the noise key is missing, too short or visibly not random."""


@dataclass(frozen=True)
class NoiseKey:
    """The key every noise draw of a run derives from (never shown: ``repr`` hides it).

    ``insecure`` marks a public reproducible seed (benchmarks, reproductions, tests asking
    for one explicitly): its releases are marked and are not private output.
    """

    material: bytes = field(repr=False)
    insecure: bool = False
    incarnation: bytes = field(default=b"", repr=False)
    """The incarnation nonce mixed into every derivation (``privstream.runtime.incarnation``): a
    recovery store's own, a fresh one per run without a store; empty (the fixed public
    incarnation) for an insecure seed, whose noise is public anyway."""

    @classmethod
    def from_text(cls, text: str, *, origin: str = "the secret") -> NoiseKey:
        """A secret key from its text form (a file's content or an environment variable):
        hex of at least 32 digits or base64/base64url of at least 16 bytes, with no visible
        structure (``key_strength.key_weakness``: placeholders, words, known digests and
        constants, walks, repeats, skewed characters). A refusal names ``origin`` and the rule
        that failed, never the secret, and says how to make a key."""
        value = text.strip()
        if not value:
            raise SecretError(f"{origin} is empty; {MAKE_ONE}")
        why = key_weakness(value)
        if why is not None:
            raise SecretError(f"{origin} {why}; {MAKE_ONE}")
        return cls(value.encode())

    @classmethod
    def from_env(
        cls, variable: str = ENV_SECRET, environ: Mapping[str, str] | None = None
    ) -> NoiseKey:
        """The secret key held by the environment variable ``variable`` (default
        ``$PRIVSTREAM_SECRET``, as the CLI reads it), checked as ``from_text`` checks it; an
        unset or empty variable is refused (``SecretError``) with how to make a key."""
        value = (os.environ if environ is None else environ).get(variable, "")
        if not value.strip():
            raise SecretError(f"${variable} is not set; {MAKE_ONE}, and export it")
        return cls.from_text(value, origin=f"${variable}")

    @classmethod
    def from_file(cls, path: str | Path) -> NoiseKey:
        """The secret key held by the file ``path`` (as ``--secret-file`` reads it), checked
        as ``from_text`` checks it; a missing file is refused (``SecretError``)."""
        file = Path(path)
        if not file.is_file():
            raise SecretError(f"secret file {file} does not exist")
        return cls.from_text(file.read_text("utf-8", "replace"), origin=f"secret file {file}")

    @classmethod
    def generate(cls) -> NoiseKey:
        """A fresh random 256-bit key of this process only (``secrets.token_hex(32)``): private
        releases, but no later process can have it, so a recovery store bound to it cannot be
        resumed (refused by its fingerprint). For tests and throwaway in-process runs; a service
        reads its key with ``from_env`` or ``from_file``."""
        return cls.from_text(secrets.token_hex(32), origin="a generated key")

    @classmethod
    def insecure_seed(cls, seed: int) -> NoiseKey:
        """A public, reproducible key: releases drawn with it are not private."""
        return cls(b"insecure-seed:" + int(seed).to_bytes(16, "little", signed=True), True)

    @classmethod
    def coerce(cls, key: NoiseKey | int | bytes) -> NoiseKey:
        """Operators take a ``NoiseKey``; an ``int`` is an insecure seed, ``bytes`` a secret."""
        if isinstance(key, NoiseKey):
            return key
        if isinstance(key, bytes):
            return cls.from_text(key.decode("utf-8", "replace"))
        if isinstance(key, int) and not isinstance(key, bool):
            return cls.insecure_seed(key)
        raise TypeError(f"a noise key must be a NoiseKey, bytes or an int seed, got {type(key)}")

    def with_incarnation(self, nonce: bytes) -> NoiseKey:
        """This key in the incarnation ``nonce``: every draw differs from any other
        incarnation's, so a second computation of a release id never repeats its noise. An
        insecure key stays in the fixed public incarnation (its noise is public anyway; its
        runs reproduce byte for byte)."""
        if self.insecure:
            return self
        return NoiseKey(self.material, self.insecure, bytes(nonce))

    def incarnation_id(self) -> str:
        """A short public id of the incarnation (a digest, never the nonce): ``public`` for
        the fixed public incarnation, ``none`` for a key not placed in one."""
        if self.insecure:
            return "public"
        if not self.incarnation:
            return "none"
        digest = hashlib.blake2b(self.incarnation, digest_size=8, person=b"privstream-inc")
        return digest.hexdigest()

    @property
    def prf_key(self) -> bytes:
        """The BLAKE2b key: the material itself, or its digest when longer than 64 bytes."""
        m = self.material
        return m if len(m) <= 64 else hashlib.blake2b(m, person=b"privstream-key").digest()

    def fingerprint(self) -> str:
        """A keyed fingerprint that identifies the key without revealing it (snapshots)."""
        h = hashlib.blake2b(key=self.prf_key, digest_size=16, person=_FINGERPRINT_PERSON)
        h.update(b"fingerprint")
        return ("insecure:" if self.insecure else "") + h.hexdigest()

    def clock_key(self) -> bytes:
        """The key that authenticates end-of-slot markers (``events.marker_tag``): BLAKE2b keyed with
        the secret under its own personalisation, a PRF output. Handing it to whoever writes
        the slot clock lets them close slots, and reveals nothing of the noise secret."""
        h = hashlib.blake2b(key=self.prf_key, digest_size=CLOCK_KEY_BYTES, person=_CLOCK_PERSON)
        h.update(b"slot clock")
        return h.digest()

    def selection_key(self) -> bytes:
        """The key of ``ldp-reports``' population selections (``protocol.derive_salt``): a
        PRF output under its own label, so who a later round asks cannot be told in advance
        by anyone without the secret, and a replay after a crash asks the same devices."""
        h = hashlib.blake2b(key=self.prf_key, digest_size=32, person=_CLOCK_PERSON)
        h.update(b"report selection")
        return h.digest()


def clock_key_from_text(text: str, *, origin: str = "the clock key") -> bytes:
    """A clock key from its hex text form (``privstream clock key`` prints it)."""
    value = text.strip()
    try:
        key = bytes.fromhex(value)
    except ValueError:
        key = b""
    if len(key) != CLOCK_KEY_BYTES:
        raise SecretError(
            f"{origin} must be {2 * CLOCK_KEY_BYTES} hex digits (print it from the secret "
            "with: privstream clock key --secret-file FILE)"
        )
    return key


@dataclass(frozen=True)
class EnrolmentOrder:
    """The order in which a slot's newcomers take the seats of an open LDP population.

    **Guarantee.** Each user id is ranked by ``BLAKE2b`` keyed with a sub-key of the run's
    secret (its own personalisation, so no rank equals any other derived value) over the
    length-prefixed ``(stream, user)``: a PRF, so without the secret nobody can choose ids
    that rank first — the sender of an id no longer decides who is enrolled before whom —
    and under replay (same secret) the order is the same. It only orders the newcomers of
    one slot: users first seen in an earlier slot were enrolled before (see
    ``docs/decisions.md``, "Enrolment order is keyed")."""

    key: bytes = field(repr=False)

    @classmethod
    def of(cls, secret: NoiseKey) -> EnrolmentOrder:
        """The order under ``secret`` (a sub-key: the secret itself is never used directly)."""
        h = hashlib.blake2b(key=secret.prf_key, digest_size=32, person=_ENROLMENT_PERSON)
        h.update(b"enrolment order")
        return cls(h.digest())

    def rank(self, stream: str, user: str) -> bytes:
        """The keyed rank of ``user`` in ``stream``: 16 bytes, compared as bytes."""
        return self._ranker(stream)(user)

    def _ranker(self, stream: str) -> Callable[[str], bytes]:
        """``rank`` of ``stream``'s users: the keyed hash over the stream's part is made once
        and copied per user (a keyed BLAKE2b costs a compression of its key block)."""
        h = hashlib.blake2b(key=self.key, digest_size=16, person=_ENROLMENT_PERSON)
        part = stream.encode()
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)

        def rank(user: str) -> bytes:
            mine = h.copy()
            part = str(user).encode("utf-8", "surrogatepass")
            mine.update(len(part).to_bytes(8, "little"))
            mine.update(part)
            return mine.digest()

        return rank

    def sort(self, stream: str, users: Iterable[str]) -> list[str]:
        """``users`` in keyed order (ties, which a 128-bit PRF all but never makes, by id)."""
        rank = self._ranker(stream)
        return sorted(users, key=lambda user: (rank(user), user))


def _aes_key(key: bytes, *parts: bytes) -> int:
    h = hashlib.blake2b(key=key, digest_size=16, person=b"privstream-rng")
    for part in parts:
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return int.from_bytes(h.digest(), "little")


def derive_rng(
    secret: NoiseKey | int | bytes, stream: str, slot: int, purpose: str
) -> np.random.Generator:
    """Return a fresh generator for one use of randomness.

    The tuple ``(stream, slot, purpose[, incarnation])`` is hashed with BLAKE2b keyed by the
    secret into a 128-bit AES-CTR key; distinct tuples give independent streams, equal tuples
    bit-identical ones. The key's incarnation nonce is a fourth length-prefixed part when it
    is set (the fixed public incarnation of an insecure seed is empty and adds none, so
    insecure runs reproduce byte for byte). An ``int`` secret is an insecure seed and ``bytes``
    raw key material (engine-level callers: benchmarks and tests; the operators validate
    secrets first).
    """
    if isinstance(secret, NoiseKey):
        key, incarnation = secret.prf_key, secret.incarnation
    elif isinstance(secret, bytes):
        key, incarnation = NoiseKey(secret).prf_key, b""
    else:
        key, incarnation = NoiseKey.insecure_seed(secret).prf_key, b""
    parts = [stream.encode(), int(slot).to_bytes(8, "little", signed=True), purpose.encode()]
    if incarnation:
        parts.append(incarnation)
    aes = _aes_key(key, *parts)
    return np.random.Generator(AESCounter(key=aes))


@dataclass(frozen=True)
class SlotRandomness:
    """The generators available to one stream at one slot, one per named purpose.

    Mechanisms ask for ``randomness("m1/sample")``, ``randomness("m2/client")`` and so on; the
    purpose string is part of the persisted format (changing it changes replayed noise).
    """

    secret: NoiseKey | int | bytes
    stream: str
    slot: int
    scope: str = ""
    """Who draws: the mechanism's name, so mechanisms sharing a stream draw independent noise."""

    def _purpose(self, purpose: str) -> str:
        return f"{self.scope}:{purpose}" if self.scope else purpose

    def __call__(self, purpose: str) -> np.random.Generator:
        return derive_rng(self.secret, self.stream, self.slot, self._purpose(purpose))

    def stream_level(self, purpose: str) -> np.random.Generator:
        """A generator fixed for the whole stream (e.g. LPU's group assignment)."""
        return derive_rng(self.secret, self.stream, STREAM_LEVEL, self._purpose(purpose))

    def __repr__(self) -> str:  # never show the secret
        return f"SlotRandomness(stream={self.stream!r}, slot={self.slot}, scope={self.scope!r})"
