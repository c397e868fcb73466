"""Trust modes: who may see a user's raw value (design §4). One concept for the whole core.

- ``cdp`` — a trusted curator: events carry raw values, the mechanism sees them through a
  ``CuratorPort`` (the registered users' values and privacy requirements) and adds noise to
  aggregates.
- ``ldp-simulated`` — events carry raw values, and privstream's own client code answers for each
  asked user behind a ``ClientPort``: the server logic of a mechanism only ever receives
  perturbed reports or their aggregate (``Aggregate``), never a value.
- ``ldp-reports`` — devices run the client side themselves and events are already-perturbed
  reports; the server never sees a raw value.
- ``ldp-shuffled`` — devices randomise, a shuffler (its own trust domain) strips who sent what
  and forwards each batch's counts; the server reads only those batches (SaO2, issue 25).

Every mechanism declares the modes it supports (``Mechanism.trust_modes``); the operator builds
the port of the mode a run uses from that declaration, and a slot refuses the other mode's port.

Per-user client state (decision, ``docs/decisions.md``): when the client side of a protocol keeps
state per user across slots (CGM's noise chain), that state is a dense array per user index in
the stream's snapshotted operator state, next to the mechanism's server state but held apart
from it: it is created by ``Mechanism.client_state()``, handed only to the client port, and
snapshotted and restored with the stream. One keyed stage per stream keeps a slot one batch of
NumPy work and makes a recovery round trip restore server and client state at the same epoch;
a user-keyed stage would cost a Bytewax state per user and a second exchange per slot.
"""

from __future__ import annotations

from typing import Final, Literal

TrustMode = Literal["cdp", "ldp-simulated", "ldp-reports", "ldp-shuffled"]
TRUST_MODES: Final[tuple[TrustMode, ...]] = ("cdp", "ldp-simulated", "ldp-reports", "ldp-shuffled")
LOCAL_MODES: Final[frozenset[TrustMode]] = frozenset(
    {"ldp-simulated", "ldp-reports", "ldp-shuffled"}
)


def is_local(mode: TrustMode) -> bool:
    """True when the server never sees a raw value (every mode but ``cdp``)."""
    return mode in LOCAL_MODES


def needs_registration(mode: TrustMode) -> bool:
    """True when a trusted curator holds the registered users' values and privacy requirements
    (``cdp``): a stream of this mode counts only registered users and takes a registration
    table."""
    return mode == "cdp"


def simulates_clients(mode: TrustMode) -> bool:
    """True when privstream's own client code answers for each asked user
    (``ldp-simulated``): the run chooses how users' reports are simulated (``--client-path``)."""
    return mode == "ldp-simulated"
