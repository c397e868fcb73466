"""What a parsed batch costs to cross a process (issue 26): ``python -m
privstream.experiments.exchange [--users N] [--slots T] [--partitions P] [--repeats R]``.

A flow keys every parsed ``EventBatch`` by its stream, so with P processes (P − 1)/P of the
batches go to another process, pickled by Bytewax (``pickle.dumps`` at the default protocol,
4 on Python 3.11) as a ``(key, batch)`` pair. This measures that round trip offline, on the
polls the Kafka benchmark's flow reads (``experiments.kafka._raw_batches``: the synthetic Sin
stream, ``users × slots`` events spread over ``partitions`` partitions, polls of 5,000
messages parsed by ``parse_raw_batch``), per event:

* ``bytes``: the pickled size;
* ``dumps_ns`` / ``loads_ns``: thread CPU time of pickling and of unpickling (the best of
  ``repeats`` passes over every batch: the least disturbed by other work on the machine);
* ``parse_ns``: thread CPU time of ``parse_raw_batch`` on the same polls (best of ``repeats``),
  so a change that moves work from the exchange into the parse shows on both sides.

Protocol 5 is measured beside the default (out-of-band buffers are not used by Bytewax).
"""

from __future__ import annotations

import argparse
import functools
import json
import pickle
import time
from collections.abc import Callable, Sequence
from typing import Any

from privstream.connectors.kafka import RawBatch, parse_raw_batch
from privstream.experiments.kafka import SEED, _raw_batches
from privstream.flows.io import resolve_source
from privstream.schema.events import EventBatch


def parsed_polls(users: int, slots: int, partitions: int, batch_size: int = 5000) -> list[RawBatch]:
    """The polls the one-stream Kafka benchmark's flow reads (``_raw_batches``)."""
    source = resolve_source("sin", users, slots, SEED)
    return list(_raw_batches(source, slots, batch_size, "bench-events", partitions))


def _best(run: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    """The least thread CPU time of ``repeats`` calls of ``run``, and its last result."""
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.thread_time()
        out = run()
        best = min(best, time.thread_time() - t0)
    return best, out


def _dumps(items: Sequence[Any], protocol: int) -> list[bytes]:
    return [pickle.dumps(x, protocol) for x in items]


def _loads(blobs: Sequence[bytes]) -> list[Any]:
    return [pickle.loads(x) for x in blobs]


def measure(polls: Sequence[RawBatch], repeats: int = 5) -> dict[str, Any]:
    """Per event: pickled bytes, pickle and unpickle CPU ns (protocols 4 and 5), parse CPU ns."""
    stream = ["sin"]
    parse_s, parsed = _best(lambda: [parse_raw_batch(p, streams=stream) for p in polls], repeats)
    batches = [b for items in parsed for b in items if isinstance(b, EventBatch)]
    events = sum(map(len, batches))
    pairs = [(b.stream, b) for b in batches]
    out: dict[str, Any] = {
        "events": events,
        "batches": len(batches),
        "messages": sum(len(p.values) for p in polls),
        "parse_ns": parse_s / events * 1e9,
    }
    for protocol in (4, 5):
        dumps_s, blobs = _best(functools.partial(_dumps, pairs, protocol), repeats)
        loads_s, back = _best(functools.partial(_loads, blobs), repeats)
        assert all(len(b[1]) == len(a[1]) for a, b in zip(pairs, back, strict=True))
        out[f"protocol_{protocol}"] = {
            "bytes": sum(map(len, blobs)) / events,
            "dumps_ns": dumps_s / events * 1e9,
            "loads_ns": loads_s / events * 1e9,
            "round_trip_ns": (dumps_s + loads_s) / events * 1e9,
        }
    return out


def main(argv: Sequence[str] | None = None) -> int:  # pragma: no cover - ad-hoc runs
    parser = argparse.ArgumentParser(prog="python -m privstream.experiments.exchange")
    parser.add_argument("--users", type=int, default=20000)
    parser.add_argument("--slots", type=int, default=10)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    polls = parsed_polls(args.users, args.slots, args.partitions)
    print(json.dumps(measure(polls, args.repeats), indent=2))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
