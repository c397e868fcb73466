"""The key of every output record, at the bottom of the import graph (no import of ours): the
core's envelopes, the Kafka sink, the audit and the republish floors all build or read it here."""

from __future__ import annotations


def release_id(stream: str, mechanism: str, slot: int, *parts: str) -> str:
    """The release id ``stream/mechanism/slot`` — with a family's declared key parts
    (``Family.release_key``, e.g. DPI's ``query``) ``stream/mechanism/slot/part…``: the one
    place it is built (releases, ledger entries, halts and extra outputs are keyed by it on
    Kafka; the audit checks every release names its own). A part is never empty, holds no
    ``/`` and is not an integer, so ``split_release_id`` reads any id back unambiguously."""
    for part in parts:
        check_part(part)
    return "/".join((stream, mechanism, str(slot), *parts))


def check_part(part: str) -> None:
    """Refuse a key part a release id could not carry unambiguously."""
    if not part or "/" in part or part.lstrip("-").isdigit():
        raise ValueError(
            f"release-key part {part!r}: must be non-empty, hold no '/' and not be an integer "
            "(the slot is the id's last integer segment)"
        )


def split_release_id(key: str) -> tuple[str, str, int, tuple[str, ...]] | None:
    """``(stream, mechanism, slot, parts)`` of a release id, or None when ``key`` is none: the
    slot is the last integer segment (key parts are never integers), the mechanism the segment
    before it and the stream everything before that (a stream name may hold ``/``)."""
    segments = key.split("/")
    for i in range(len(segments) - 1, 1, -1):
        if segments[i].lstrip("-").isdigit() and segments[i]:
            return (
                "/".join(segments[: i - 1]),
                segments[i - 1],
                int(segments[i]),
                tuple(segments[i + 1 :]),
            )
    return None
