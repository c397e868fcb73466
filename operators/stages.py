"""Wire a family's stages (``mechanisms.stages``) into a Bytewax dataflow (design §13).

``build_stages(source, stages)`` chains the stages in order: each stage's input is keyed by the
stage's key (``Stage.key.of(record)``), its step runs as a stateful operator with one state per
key (created by the stage's state factory, snapshotted by Bytewax like any ``stateful_map``
state, so it must be picklable), and every record of the output batch it returns goes on to
the next stage, keyed again by that stage's key.

**Guarantee.** A record reaches only the state of its key in each stage, and only what a
stage outputs crosses to the next one: a shuffler that strips user ids keeps them out of every
later stage. A step that returns ``None`` as its state ends its key's state (a shuffler's epoch
once its batch is out). ``roundtrip_state=True`` pickles and unpickles every state after every
step, a check that the states are snapshot-safe (tests).
"""

from __future__ import annotations

import functools
import pickle
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import bytewax.operators as op
from bytewax.dataflow import Stream
from bytewax.operators import KeyedStream

from privstream.mechanisms.stages import (
    Piece,
    Stage,
    check_chain,
    complete,
    merge,
    piece_of,
    split,
    step_piece,
)


@dataclass(frozen=True)
class StageStreams:
    """The streams of a built chain: each stage's keyed input and keyed output (by stage name,
    for taps and tests) and the last stage's output records, unkeyed."""

    inputs: dict[str, Stream[tuple[str, Any]]]
    outputs: dict[str, Stream[tuple[str, Any]]]
    result: Stream[Any]


Split = Callable[[Stage, Any], list[tuple[str, Any]]]
"""How a record is cut for a stage: its parts, each with its key (default: the record whole,
keyed by ``stage.key.of``)."""
Run = Callable[[Stage, Any, Any], tuple[Any, list[Any]]]
"""How a stage's step runs on one part: ``(stage, state, part) -> (state, outputs)``."""


def _whole(stage: Stage, record: Any) -> list[tuple[str, Any]]:
    return [(stage.key.of(record), record)]


def _own_step(stage: Stage, state: Any, record: Any) -> tuple[Any, list[Any]]:
    assert stage.step is not None
    new, batch = stage.step(state, record)
    return new, list(batch)


def _mapper(
    stage: Stage, roundtrip_state: bool, run: Run = _own_step
) -> Callable[[Any, Any], tuple[Any, list[Any]]]:
    """The stage's step as a ``stateful_map`` mapper: a new key starts from the factory."""

    def mapper(state: Any, record: Any) -> tuple[Any, list[Any]]:
        new, batch = run(stage, stage.state() if state is None else state, record)
        if roundtrip_state and new is not None:
            new = pickle.loads(pickle.dumps(new))
        return new, list(batch)

    return mapper


def build_stages(
    source: Stream[Any],
    stages: Sequence[Stage],
    *,
    roundtrip_state: bool = False,
    split_by: Split | None = None,
    run: Run = _own_step,
) -> StageStreams:
    """Chain ``stages`` after ``source`` (module docstring). Refuses a chain whose batch types
    do not meet (``check_chain``) or a stage without a step to run. ``split_by`` cuts each
    record into keyed parts for a stage (event batches: by row, ``chain_events``)."""
    check_chain(stages)
    inputs: dict[str, Stream[tuple[str, Any]]] = {}
    outputs: dict[str, Stream[tuple[str, Any]]] = {}
    stream: Stream[Any] = source
    for stage in stages:
        if stage.step is None:
            raise ValueError(
                f"stage {stage.name!r} ({stage.role}) has no step to run in a dataflow; "
                "declare its step or run it outside the flow (a simulated device port)"
            )
        by = f"{stage.name}_by_{stage.key.name.replace(' ', '_')}"
        keyed: Stream[tuple[str, Any]] = (
            op.key_on(by, stream, stage.key.of)
            if split_by is None
            else op.flat_map(by, stream, functools.partial(split_by, stage))
        )
        mapper = _mapper(stage, roundtrip_state, run)
        batches = op.stateful_map(f"{stage.name}_step", keyed, mapper)
        out = op.flat_map_value(f"{stage.name}_batch", batches, lambda batch: batch)
        inputs[stage.name], outputs[stage.name] = keyed, out
        stream = op.key_rm(f"{stage.name}_out", out)
    return StageStreams(inputs, outputs, stream)


def _cut(stage: Stage, piece: Piece) -> list[tuple[str, Piece]]:
    return [(p.key, p) for p in split(piece, stage.key)]


def _step(stage: Stage, state: Any, piece: Piece) -> tuple[Any, list[Piece]]:
    new, moved = step_piece(stage, state, piece)
    return new, [moved]


def _number(count: int | None, batch: Any) -> tuple[int, Piece]:
    """The next sequence number of a (stream, partition)'s batches (a snapshotted count)."""
    sequence = count or 0
    return sequence + 1, piece_of(batch, sequence)


Waiting = dict[int, tuple[int, dict[int, list[Piece]]]]
"""A stream's reassembly: per partition, the next batch to hand on and the pieces held."""


def _reassemble(waiting: Waiting | None, piece: Piece) -> tuple[Waiting | None, list[Any]]:
    """Hold ``piece`` until every row of its batch is back, then hand on, in each partition's
    order, every batch whose rows are all back (marker last, as it came)."""
    waiting = waiting or {}
    _stream, partition, sequence = piece.origin
    following, held = waiting.get(partition, (0, {}))
    held.setdefault(sequence, []).append(piece)
    out = []
    while following in held and complete(held[following]):
        out.append(merge(held.pop(following)))
        following += 1
    waiting[partition] = (following, held)
    return waiting, out


def chain_events(
    up: KeyedStream[Any], stages: Sequence[Stage], *, roundtrip_state: bool = False
) -> KeyedStream[Any]:
    """The stages before the server (``mechanisms.stages.pre_server``) between a stream's
    keyed event batches and its slotted operator: each batch is numbered per (stream,
    partition) (``stages_sequence``), its rows are cut by every stage's key and stepped in
    that key's state (``build_stages``), and the stream puts every batch back together in its
    order, marker last (``stages_reassemble``), keyed by stream again. A batch without rows
    (a marker) waits in the reassembly for the batches before it."""
    batches = op.key_rm("stages_in", up)
    by_partition = op.key_on("stages_by_partition", batches, lambda b: f"{b.stream}/{b.partition}")
    pieces = op.key_rm("stages_numbered", op.stateful_map("stages_sequence", by_partition, _number))
    rows = op.branch("stages_rows", pieces, lambda p: p.total > 0)
    chain = build_stages(rows.trues, stages, roundtrip_state=roundtrip_state,
                         split_by=_cut, run=_step)  # fmt: skip
    back = op.merge("stages_back", rows.falses, chain.result)
    by_stream = op.key_on("stages_by_stream", back, lambda p: p.origin[0])
    done = op.stateful_map("stages_reassemble", by_stream, _reassemble)
    return op.flat_map_value("stages_out", done, lambda batches: batches)


STATEFUL_MAP: Final = ".stateful_flat_map.stateful.stateful_batch"
"""Where a ``stateful_map`` step keeps its state (the persisted step id's tail)."""


def persisted_steps(stages: Sequence[Stage]) -> list[str]:
    """The persisted step ids ``chain_events`` adds (relative to the operator it sits in), in
    the dataflow's order: part of the recovery format of a stream with these stages."""
    names = ["stages_sequence", *(f"{s.name}_step" for s in stages), "stages_reassemble"]
    return [name + STATEFUL_MAP for name in names] if stages else []
