"""The key of every output record, at the bottom of the import graph (no import of ours): the
core's envelopes, the Kafka sink and the audit all build it here."""

from __future__ import annotations


def release_id(stream: str, mechanism: str, slot: int) -> str:
    """The release id ``stream/mechanism/slot``: the one place it is built (releases, ledger
    entries and halts are keyed by it on Kafka; the audit checks every release names its own)."""
    return f"{stream}/{mechanism}/{slot}"
