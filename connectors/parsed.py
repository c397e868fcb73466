"""The typed split of parsed input: event batches one way, dead letters the other.

Every parser of privstream (``parse_json_lines``, ``parse_csv_lines``, ``parse_raw_batch``)
yields ``EventBatch | DeadLetter`` items. A Bytewax ``filter`` over that union does not narrow
the type (``mypy --strict`` rejects keying the result by stream); ``split_parsed`` is the one
split the flows and a user's own dataflow share.
"""

from __future__ import annotations

from typing import TypeGuard, cast

from bytewax import operators as op
from bytewax.dataflow import Stream

from privstream.schema.events import DeadLetter, EventBatch


def is_event_batch(item: EventBatch | DeadLetter) -> TypeGuard[EventBatch]:
    """Whether a parsed item is an event batch (else it is a dead letter)."""
    return isinstance(item, EventBatch)


def split_parsed(
    step_id: str, up: Stream[EventBatch | DeadLetter]
) -> tuple[Stream[EventBatch], Stream[DeadLetter]]:
    """Split parsed items (one Bytewax ``branch`` step named ``step_id``) into the stream of
    event batches and the stream of dead letters, each typed as what it holds. Guarantee:
    every item goes to exactly one of the two, in its order; nothing is dropped."""
    split = op.branch(step_id, up, is_event_batch)
    return split.trues, cast("Stream[DeadLetter]", split.falses)  # not a batch: a dead letter
