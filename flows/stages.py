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

import pickle
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import bytewax.operators as op
from bytewax.dataflow import Stream

from privstream.mechanisms.stages import Stage, check_chain


@dataclass(frozen=True)
class StageStreams:
    """The streams of a built chain: each stage's keyed input and keyed output (by stage name,
    for taps and tests) and the last stage's output records, unkeyed."""

    inputs: dict[str, Stream[tuple[str, Any]]]
    outputs: dict[str, Stream[tuple[str, Any]]]
    result: Stream[Any]


def _mapper(stage: Stage, roundtrip_state: bool) -> Callable[[Any, Any], tuple[Any, list[Any]]]:
    """The stage's step as a ``stateful_map`` mapper: a new key starts from the factory."""
    step = stage.step
    assert step is not None

    def mapper(state: Any, record: Any) -> tuple[Any, list[Any]]:
        new, batch = step(stage.state() if state is None else state, record)
        if roundtrip_state and new is not None:
            new = pickle.loads(pickle.dumps(new))
        return new, list(batch)

    return mapper


def build_stages(
    source: Stream[Any], stages: Sequence[Stage], *, roundtrip_state: bool = False
) -> StageStreams:
    """Chain ``stages`` after ``source`` (module docstring). Refuses a chain whose batch types
    do not meet (``check_chain``) or a stage without a step to run."""
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
        keyed = op.key_on(
            f"{stage.name}_by_{stage.key.name.replace(' ', '_')}", stream, stage.key.of
        )
        batches = op.stateful_map(f"{stage.name}_step", keyed, _mapper(stage, roundtrip_state))
        out = op.flat_map_value(f"{stage.name}_batch", batches, lambda batch: batch)
        inputs[stage.name], outputs[stage.name] = keyed, out
        stream = op.key_rm(f"{stage.name}_out", out)
    return StageStreams(inputs, outputs, stream)
