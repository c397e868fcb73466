"""Nothing raw crosses a process (issue 26, first item).

Before: every parsed Kafka batch kept each row's original message bytes, so that the stream's
owner could put them into the dead letters only it decides (late, duplicate, population full,
...); a batch going to the process owning its stream was pickled with them: 71 % of the 264 ns
per event of the round trip was those bytes, 30 % the user ids (``bench/README.md`` §3). Now a
parsed batch holds its columns and, per row, where its message is (topic, partition, offset,
length); an owner-decided dead letter carries that and the row's parsed fields, and the bytes
stay on the input topic. User ids cross as one string. Everything else is unchanged:
releases, ledger entries and parse-time dead letters (which still carry the bytes).
"""

from __future__ import annotations

import json
import pickle
from collections import Counter
from types import SimpleNamespace
from typing import Any

import numpy as np

from privstream.connectors.kafka import (
    DEAD_LETTER_PAYLOAD_HEADER,
    RawBatch,
    dead_letter_message,
    parse_raw_batch,
)
from privstream.families.registry import LDP_IDS
from privstream.flows.io import without_bytes
from privstream.mechanisms.ldp_ids import LdpIdsConfig
from privstream.operators.family import family_mechanisms
from privstream.operators.registration import Population
from privstream.operators.slotting import SlottingConfig
from privstream.runtime.republish import _split
from privstream.schema.events import (
    ALREADY_PUBLISHED,
    DUPLICATE,
    LATE,
    POPULATION_FULL,
    DeadLetter,
    EventBatch,
    Located,
    RowSources,
    held_line,
)
from tests.attacks.helpers import Outputs, run_operator

N = 5
SECRET = b"do-not-copy-me"  # an unknown field of some messages: it must reach no dead letter
OWNER_DECIDED = {LATE, DUPLICATE, POPULATION_FULL}


def event(user: str, slot: int, value: int, extra: bool = False) -> bytes:
    line = b'{"stream":"s","user":"%s","slot":%d,"value":%d' % (user.encode(), slot, value)
    return line + (b',"note":"%s"}' % SECRET if extra else b"}")


def marker(slot: int) -> bytes:
    return b'{"stream":"s","end_of_slot":%d}' % slot


def messages() -> list[bytes]:
    """Slot 1: N + 1 newcomers (one finds the population full), a repeat of u1 (duplicate);
    slot 2: the N enrolled users, a repeat of u2; then a slot-1 event after slot 1 closed
    (late). Every owner-decided rejection carries ``SECRET``; so do some accepted events."""
    out = [event(f"u{u}", 1, u % 2, extra=u == 3) for u in range(N + 1)]
    out += [event("u1", 1, 0, extra=True), marker(1)]
    out += [event(f"u{u}", 2, 1, extra=u == 0) for u in range(N + 1)]
    out += [event("u2", 2, 0, extra=True), event("u4", 1, 1, extra=True), marker(2)]
    return out


def polls(values: list[bytes], size: int) -> list[RawBatch]:
    """Polls of partition 2 of topic ``in`` whose offsets start at 1000 and skip every tenth
    (as on a compacted topic), so offsets are not positions."""
    offsets = [1000 + i + i // 9 for i in range(len(values))]
    return [
        RawBatch("in", 2, offsets[i], values[i : i + size], offsets[i : i + size])
        for i in range(0, len(values), size)
    ]


def run(batches: list[EventBatch]) -> Outputs:
    config = LdpIdsConfig(epsilon=1.0, window=4, population=N)
    slotting = SlottingConfig(close_on_eof=True, partitions=3)  # (its input: partition 2)
    return run_operator(
        batches,
        lambda keyed: family_mechanisms(
            "mech", keyed, family=LDP_IDS, mechanism="LBU", config=config, secret=3,
            slotting=slotting,
        ),
    )  # fmt: skip


def parsed(values: list[bytes], size: int, cross: bool) -> list[EventBatch]:
    """The batches of ``values`` cut into polls of ``size``; ``cross``: each pickled and
    unpickled, as when it goes to the process owning its stream."""
    out = []
    for poll in polls(values, size):
        for item in parse_raw_batch(poll, streams=["s"]):
            assert isinstance(item, EventBatch)
            out.append(pickle.loads(pickle.dumps(item)) if cross else item)
    return out


def fields(line: bytes) -> dict[str, Any]:
    event = json.loads(line)
    return {"stream": "s", "user": event["user"], "slot": event["slot"],
            "value": float(event["value"])}  # fmt: skip


def test_a_parsed_poll_holds_columns_and_where_each_row_is_never_its_bytes() -> None:
    values = messages()
    (poll,) = polls(values, len(values))
    batches = parse_raw_batch(poll, streams=["s"])
    assert all(isinstance(b, EventBatch) for b in batches)
    rows = 0
    for batch in batches:
        assert isinstance(batch, EventBatch) and batch.raw is None and batch.lines is None
        assert (batch.topic, batch.partition) == ("in", 2)
        assert batch.offsets is not None and batch.lengths is not None
        for i, offset in enumerate(batch.offsets.tolist()):
            message = values[poll.offsets.index(offset)]  # type: ignore[union-attr]
            assert batch.lengths[i] == len(message)
            assert (batch.users[i], batch.slots[i]) == (json.loads(message)["user"],
                                                        json.loads(message)["slot"])  # fmt: skip
            rows += 1
    assert rows == len(values) - 2  # every event, not the markers
    # the line-by-line path (a blank message sends the poll there) locates rows alike
    slow = RawBatch("in", 2, poll.first_offset, [b" ", *values], [999, *poll.offsets])  # type: ignore[misc]
    located = [(b.offsets.tolist(), b.lengths.tolist()) for b in batches]  # type: ignore[union-attr]
    again = parse_raw_batch(slow, streams=["s"])
    assert [(b.offsets.tolist(), b.lengths.tolist())  # type: ignore[union-attr]
            for b in again if isinstance(b, EventBatch)] == located  # fmt: skip


def test_a_crossing_batch_pickles_users_as_one_string_and_no_message_bytes() -> None:
    (batch,) = [b for b in parse_raw_batch(polls(messages(), 7)[0], streams=["s"])]
    assert isinstance(batch, EventBatch)
    blob = pickle.dumps(batch)
    assert SECRET not in blob and b'"value"' not in blob  # no message crossed
    assert b"u0\x00u1\x00u2\x00u3\x00u4\x00u5\x00u1" in blob  # user ids: one string
    back = pickle.loads(blob)
    for name in ("slots", "users", "values", "offsets", "lengths"):
        assert np.array_equal(getattr(back, name), getattr(batch, name)), name
    assert back.users.dtype == object and back.topic == "in" and back.partition == 2
    # a user id holding the separator, numbers, dense indices: pickled as they are
    for users in (["a\x00b", "c"], [1, 2], np.arange(2)):
        odd = EventBatch("s", np.arange(2), np.asarray(users, dtype=object), np.zeros(2))
        assert pickle.loads(pickle.dumps(odd)).users.tolist() == odd.users.tolist()


def test_owner_decided_dead_letters_identify_their_message_and_hold_no_raw_line() -> None:
    values = messages()
    offsets = {o: values[i] for i, o in enumerate(polls(values, len(values))[0].offsets or [])}
    outputs = {(size, cross): run(parsed(values, size, cross)) for size in (1, 7, 100)
               for cross in (False, True)}  # fmt: skip
    first = outputs[(100, False)]
    for got in outputs.values():  # the same outputs whatever the polls and the crossing
        assert got["releases"] == first["releases"] and got["ledger"] == first["ledger"]
        assert Counter(map(repr, got["dead_letters"])) == Counter(map(repr, first["dead_letters"]))
    letters: list[DeadLetter] = first["dead_letters"]
    # (the user refused a seat in slot 1 is refused again in slot 2)
    assert Counter(d.reason for d in letters) == {DUPLICATE: 2, POPULATION_FULL: 2, LATE: 1}
    assert len({json.loads(d.payload)["user"] for d in letters if d.reason == POPULATION_FULL}) == 1
    for letter in letters:
        assert letter.located and letter.original is None
        assert (letter.topic, letter.partition) == ("in", 2)
        message = offsets[letter.offset]  # type: ignore[index]
        assert letter.original_length == len(message)
        assert json.loads(letter.payload) == fields(message)
        assert SECRET not in letter.payload_bytes()  # the parsed fields, never the line
    late = next(d for d in letters if d.reason == LATE)
    assert fields(offsets[late.offset]) == fields(event("u4", 1, 1))  # type: ignore[index]
    duplicates = {json.loads(d.payload)["user"] for d in letters if d.reason == DUPLICATE}
    assert duplicates == {"u1", "u2"}  # the later report of each (the first one wins)
    assert all(SECRET in offsets[d.offset] for d in letters if d.reason != POPULATION_FULL)  # type: ignore[index]


def test_a_new_incarnations_skip_keeps_the_bytes_it_decides_on_and_passes_none_on() -> None:
    """``already_published`` is decided where the bytes are (before the exchange): as before,
    its dead letters carry them; the batch that goes on to the owner does not."""
    values = [event("u1", 1, 1, extra=True), event("u2", 2, 0)]
    (poll,) = polls(values, 2)
    (batch,) = parse_raw_batch(poll, streams=["s"], keep_bytes=True)
    assert isinstance(batch, EventBatch) and list(batch.raw or ()) == values
    letter, rest = _split(batch, {"s": 1})
    assert isinstance(letter, DeadLetter) and letter.reason == ALREADY_PUBLISHED
    assert letter.payload_bytes() == values[0] and not letter.located
    assert isinstance(rest, EventBatch) and rest.users.tolist() == ["u2"]
    crossing = without_bytes(rest)
    assert crossing.raw is None and crossing.offsets is not None
    assert crossing.offsets.tolist() == [poll.offset(1)] and crossing.lengths is not None
    assert crossing.lengths.tolist() == [len(values[1])]


def test_a_located_dead_letter_message_carries_fields_and_source_no_bytes_no_digest() -> None:
    located = DeadLetter.of(LATE, "s", '{"user": "u1"}', "late", Located("in", 2, 1042, 61))
    message = dead_letter_message(located)
    headers = dict(message.headers)
    assert message.value == b'{"user": "u1"}'
    assert headers[DEAD_LETTER_PAYLOAD_HEADER] == b"fields"
    assert headers["privstream-original-length"] == b"61"
    assert (headers["privstream-source-topic"], headers["privstream-source-partition"],
            headers["privstream-source-offset"]) == (b"in", b"2", b"1042")  # fmt: skip
    assert "privstream-original-sha256" not in headers
    assert located.to_dict()["source"] == {"topic": "in", "partition": 2, "offset": 1042,
                                           "length": 61}  # fmt: skip
    # a letter with the bytes (the parser's, or a newcomer held by an earlier version's
    # state) is as before: no payload header, its digest
    for source in (b" raw ", None):
        plain = dead_letter_message(DeadLetter.of(LATE, "s", "raw", "late", source))
        names = [k for k, _ in plain.headers]
        assert DEAD_LETTER_PAYLOAD_HEADER not in names and "privstream-original-sha256" in names
        assert plain.value == (source or b"raw")


def test_a_held_newcomer_makes_its_dead_letter_text_only_if_it_becomes_one(
    monkeypatch: Any,
) -> None:
    """Newcomers wait for their slot to close with their batch's ``RowSources`` and row, not a
    ready-made dead letter: making the text of every newcomer's report (a JSON dump each) was
    a third of a flow-file run's CPU (issue 26, ``bench/README.md`` §3)."""
    made: list[int] = []
    real = RowSources._fields

    def counted(self: RowSources, *args: Any, **kwargs: Any) -> str:
        made.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(RowSources, "_fields", counted)
    letters = run(parsed(messages(), 100, cross=True))["dead_letters"]
    assert len(made) == len(letters) == 5  # 2 duplicates, 2 population full, 1 late


def test_a_held_report_of_an_earlier_state_version_keeps_its_text() -> None:
    """A snapshot taken before the lazy hold holds ``(value, text, source)``: it resumes."""
    where = Located("in", 2, 1001, 40)
    assert held_line((np.float64(1.0), '{"user": "u1"}', where), "u1", 3) == (
        '{"user": "u1"}',
        where,
    )
    batch = parsed(messages(), 100, cross=False)[0]
    assert held_line(
        (batch.values[0], batch.row_sources, 0), batch.users[0], int(batch.slots[0])
    ) == batch.row_line(0)


def _held_batch(
    users: list[str], values: Any, rows: list[int]
) -> tuple[EventBatch, dict[int, Any]]:
    """A poll of ``users`` at slot 3 over Kafka, and what ``hold_newcomers`` holds of its
    ``rows`` (an open population, nobody seated)."""
    n = len(users)
    batch = EventBatch("s", np.full(n, 3, dtype=np.int64), np.asarray(users, dtype=object),
                       np.asarray(values), topic="in", offsets=np.arange(n, dtype=np.int64),
                       lengths=np.full(n, 50, np.int32))  # fmt: skip
    state = SimpleNamespace(newcomers={})
    population = Population.__new__(Population)
    population.trust = SimpleNamespace(members=None)  # type: ignore[assignment]
    population.hold_newcomers(state, batch, np.asarray(rows), np.zeros(n, dtype=np.int8))  # type: ignore[arg-type]
    return batch, state.newcomers


def test_a_held_report_pins_only_its_own_row_of_the_batch() -> None:
    """One newcomer in a poll of 5,000 keeps its own offset and length, not the poll's."""
    n = 5000
    batch, newcomers = _held_batch([f"u{i}" for i in range(n)], np.ones(n), [4321])
    (held,) = newcomers[3].values()
    assert held_line(held, "u4321", 3) == batch.row_line(4321)
    assert len(pickle.dumps(newcomers)) < 1000  # the poll's columns: 60,000 bytes
    assert type(held[0]) is float  # a NumPy scalar pickled 5× slower at every snapshot
    value, sources, row = held
    assert held_line((np.float64(value), sources, row), "u4321", 3) == held_line(held, "u4321", 3)


def test_a_held_vector_report_keeps_its_text() -> None:
    """A vector task's held report holds its value as a list, and its dead letter is the
    row's own text, as from a NumPy row of an earlier state."""
    values = np.asarray([[0.25, 0.75], [1.0, 0.0], [0.5, 0.5]])
    batch, newcomers = _held_batch(["a", "b", "c"], values, [0, 2])
    held = newcomers[3]["c"]
    assert held[0] == [0.5, 0.5]
    assert held_line(held, "c", 3) == batch.row_line(2)
    assert held_line((values[2], held[1], held[2]), "c", 3) == batch.row_line(2)
