"""The building blocks of a user's own dataflow (docs/composing.md): the noise key's
constructors, the typed split of parsed input, and the warning when a stream's batches all
claim partition 0 while the slotting expects several (Bytewax's own ``KafkaSource``)."""

from __future__ import annotations

import logging
import secrets
from dataclasses import replace
from pathlib import Path

import pytest

from privstream.dataflow import (
    Dataflow,
    DeadLetter,
    EventBatch,
    NoiseKey,
    SlottingConfig,
    TestingSink,
    TestingSource,
    op,
    parse_json_lines,
    run_main,
    split_parsed,
)
from privstream.mechanisms.seeding import SecretError
from privstream.operators.slotting import HELD_BACK_BATCHES

from .test_partitioned_flow import P, T, partition_batch, run

HELD = "every one from input partition 0, while the slotting expects 3 partitions"


def test_noise_key_from_env_file_and_generated(tmp_path: Path) -> None:
    """``from_env`` and ``from_file`` read the key as the CLI does and refuse a missing or weak
    one naming where it came from; ``generate`` makes a fresh private key each call."""
    key = secrets.token_hex(32)
    assert NoiseKey.from_env(environ={"PRIVSTREAM_SECRET": key}) == NoiseKey(key.encode())
    assert NoiseKey.from_env("MY_KEY", environ={"MY_KEY": f" {key}\n"}).material == key.encode()
    with pytest.raises(SecretError, match=r"^\$PRIVSTREAM_SECRET is not set; make one with"):
        NoiseKey.from_env(environ={})
    with pytest.raises(SecretError, match=r"^\$MY_KEY holds at most 16 bits of entropy"):
        NoiseKey.from_env("MY_KEY", environ={"MY_KEY": "1234"})
    path = tmp_path / "noise.key"
    path.write_text(key + "\n")
    assert NoiseKey.from_file(path) == NoiseKey(key.encode())
    with pytest.raises(SecretError, match=r"secret file .*missing\.key does not exist"):
        NoiseKey.from_file(tmp_path / "missing.key")
    a, b = NoiseKey.generate(), NoiseKey.generate()
    assert not a.insecure and a != b and len(a.material) == 64
    assert NoiseKey.from_text(a.material.decode()) == a  # passes the strength check
    assert NoiseKey.coerce(1234).insecure  # an int is a public seed


def test_split_parsed_sends_every_item_one_way_typed() -> None:
    """Good rows become event batches, every bad line one dead letter with its reason; nothing
    is dropped or duplicated."""
    good = [f'{{"stream": "s", "user": "u{u}", "slot": 1, "value": 1}}' for u in range(7)]
    lines = [*good, "not json", '{"stream": "s", "user": "x", "slot": "a", "value": 1}']
    flow = Dataflow("split")
    parsed = op.flat_map_batch("parse", op.input("in", flow, TestingSource(lines)),
                               parse_json_lines)  # fmt: skip
    batches, dead = split_parsed("split", parsed)
    got: list[EventBatch] = []
    letters: list[DeadLetter] = []
    op.output("b", batches, TestingSink(got))
    op.output("d", dead, TestingSink(letters))
    run_main(flow)
    assert all(isinstance(b, EventBatch) for b in got) and sum(len(b) for b in got) == 7
    assert [d.reason for d in letters] == ["malformed_json", "invalid_type"]


def test_batches_all_from_partition_zero_warn_once(caplog: pytest.LogCaptureFixture) -> None:
    """The loss of Bytewax's ``KafkaSource`` (every batch says partition 0) measured: with the
    slotting set to 3 partitions no slot closes and the operator warns once, naming the fix;
    the same batches from their real partitions release every slot and do not warn."""
    config = SlottingConfig(partitions=P, close_on_eof=False)
    spread = [partition_batch(p, t) for t in range(1, T + 1) for p in range(P)]
    assert len(spread) >= HELD_BACK_BATCHES
    with caplog.at_level(logging.WARNING, "privstream.operators.slotting"):
        right = run(spread, config)
    assert len(right["releases"]) == T and HELD not in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, "privstream.operators.slotting"):
        lost = run([replace(b, partition=0) for b in spread], config)
    assert lost["releases"] == []
    assert caplog.text.count(HELD) == 1
    assert "privstream.dataflow.KafkaEventSource and parse_raw_batch" in caplog.text


def test_few_batches_or_one_partition_do_not_warn(caplog: pytest.LogCaptureFixture) -> None:
    """Fewer than ``HELD_BACK_BATCHES`` batches (a partition's first polls may come first) do
    not warn; with one partition configured the loss cannot be seen and nothing warns."""
    zero = [partition_batch(0, t) for t in range(1, HELD_BACK_BATCHES)]
    with caplog.at_level(logging.WARNING, "privstream.operators.slotting"):
        run(zero, SlottingConfig(partitions=P, close_on_eof=False))
        one = run(zero + zero, SlottingConfig(close_on_eof=False))
    assert HELD not in caplog.text and "partition 0" not in caplog.text
    assert len(one["releases"]) == HELD_BACK_BATCHES - 1
