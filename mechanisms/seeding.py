"""Keyed cryptographic randomness per design §6: one generator per (key, stream, slot, purpose).

**Guarantee.** Every random draw of a mechanism comes from an AES-128 counter-mode stream
(``randomgen``'s ``AESCounter``, AES-NI where the CPU has it, the same bits without) whose key is
``BLAKE2b`` keyed with the run's secret over the length-prefixed tuple ``(stream, slot,
purpose)``. Keyed BLAKE2b is a PRF and AES-CTR a cryptographic pseudo-random generator, so without the secret the draws of one slot cannot be predicted from any other
slot's, any release, or any earlier output of the same generator (unlike PCG64, whose state is
recoverable from its output). A replayed slot derives the same key and draws exactly the same
noise, whatever happened before the crash; nothing of the generator lives in the snapshot.

**The secret** (``NoiseKey``) comes from a file or the environment, must carry at least 128 bits
of entropy (``NoiseKey.from_text`` refuses shorter or visibly patterned secrets) and is never
logged, exported or written to a snapshot: only its keyed ``fingerprint`` is, to bind a
recovery store to it. A reproducible run is an explicit choice, ``NoiseKey.insecure(seed)``: its
noise is public, and every release and metric of such a run says so.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
from randomgen import AESCounter

STREAM_LEVEL = -(2**62)  # the "slot" of randomness that belongs to a stream, not to one slot
MIN_SECRET_BITS = 128
_HEX = re.compile(r"[0-9a-fA-F]+")
_BASE64 = re.compile(r"[A-Za-z0-9+/_=-]+")
_FINGERPRINT_PERSON = b"privstream-fp"


class SecretError(ValueError):
    """The secret given for the noise key is missing, too short or visibly not random."""


def secret_bits(text: str) -> float:
    """An upper bound on the entropy ``text`` can hold: its length times the bits per
    character of the narrowest alphabet it is written in (hex 4, one-case letters log2(26),
    base64 6, printable ASCII log2(95), anything else 8). Words of a language hold far less
    than their letters could: generate secrets with ``secrets``, never type them."""
    if _HEX.fullmatch(text):
        per_char = 4.0
    elif text.isascii() and (text.islower() or text.isupper()) and text.isalpha():
        per_char = math.log2(26)
    elif _BASE64.fullmatch(text):
        per_char = 6.0
    else:
        per_char = math.log2(95) if text.isascii() else 8.0
    return per_char * len(text)


def _patterned(text: str) -> str | None:
    """Why ``text`` is visibly not random (None when no pattern is seen)."""
    counts = Counter(text)
    if len(counts) < min(8, len(text) // 2):
        return f"only {len(counts)} distinct characters"
    for period in range(1, len(text) // 2 + 1):
        if text == (text[:period] * (len(text) // period + 1))[: len(text)]:
            return f"it repeats a {period}-character pattern"
    top = counts.most_common(1)[0][1]
    if top > max(4, len(text) // 3):
        return f"one character makes up {top} of its {len(text)} characters"
    return None


@dataclass(frozen=True)
class NoiseKey:
    """The key every noise draw of a run derives from (never shown: ``repr`` hides it).

    ``insecure`` marks a public reproducible seed (benchmarks, reproductions, tests asking
    for one explicitly): its releases are marked and are not private output.
    """

    material: bytes = field(repr=False)
    insecure: bool = False
    incarnation: bytes = field(default=b"", repr=False)
    """The incarnation nonce mixed into every derivation (``privstream.incarnation``): a
    recovery store's own, a fresh one per run without a store; empty (the fixed public
    incarnation) for an insecure seed, whose noise is public anyway."""

    @classmethod
    def from_text(cls, text: str, *, origin: str = "the secret") -> NoiseKey:
        """A secret key from its text form (a file's content or an environment variable);
        refuses fewer than 128 bits or a visible pattern, naming ``origin`` but never the
        secret."""
        value = text.strip()
        if not value:
            raise SecretError(f"{origin} is empty")
        bits = secret_bits(value)
        if bits < MIN_SECRET_BITS:
            raise SecretError(
                f"{origin} holds at most {bits:.0f} bits of entropy; at least {MIN_SECRET_BITS} "
                "are required (make one with: python -c 'import secrets; "
                "print(secrets.token_hex(32))')"
            )
        pattern = _patterned(value)
        if pattern is not None:
            raise SecretError(f"{origin} is not random ({pattern}); generate one with secrets")
        return cls(value.encode())

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
