"""Seeded randomness per design §6: one generator per (secret seed, stream, slot, purpose).

Deriving every generator from the slot instead of carrying a generator's position in the
snapshot makes a replayed slot draw exactly the same noise, whatever happened before the crash,
and keeps the secret out of the recovery store: the seed is configuration, not state.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

_DIGEST_WORDS = 8  # 256 bits of entropy handed to SeedSequence
STREAM_LEVEL = -(2**62)  # the "slot" of randomness that belongs to a stream, not to one slot


def _words(*parts: bytes) -> list[int]:
    h = hashlib.blake2b(digest_size=4 * _DIGEST_WORDS)
    for part in parts:
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    digest = h.digest()
    return [int.from_bytes(digest[4 * i : 4 * i + 4], "little") for i in range(_DIGEST_WORDS)]


def derive_rng(secret: int | bytes, stream: str, slot: int, purpose: str) -> np.random.Generator:
    """Return a fresh generator for one use of randomness.

    The tuple ``(secret, stream, slot, purpose)`` is hashed with BLAKE2b; distinct tuples give
    independent streams, equal tuples give bit-identical ones.
    """
    secret_bytes = (
        secret if isinstance(secret, bytes) else int(secret).to_bytes(16, "little", signed=True)
    )
    entropy = _words(
        secret_bytes,
        stream.encode(),
        int(slot).to_bytes(8, "little", signed=True),
        purpose.encode(),
    )
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(entropy)))


@dataclass(frozen=True)
class SlotRandomness:
    """The generators available to one stream at one slot, one per named purpose.

    Mechanisms ask for ``randomness("m1/sample")``, ``randomness("m2/client")`` and so on; the
    purpose string is part of the persisted format (changing it changes replayed noise).
    """

    secret: int | bytes
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
