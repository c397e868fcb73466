"""Release ids with a family's key parts (``privstream/schema/keys.py``): one builder, read
back unambiguously, so a key part cannot make one release's id name another release."""

from __future__ import annotations

import pytest

from privstream.schema.keys import release_id, split_release_id


def test_an_id_without_parts_is_the_old_one_and_reads_back() -> None:
    assert release_id("sin", "LBU", 7) == "sin/LBU/7"
    assert split_release_id("sin/LBU/7") == ("sin", "LBU", 7, ())


def test_key_parts_follow_the_slot_and_read_back_even_under_a_stream_with_slashes() -> None:
    rid = release_id("eu/clicks", "DPI", 12, "q-3", "top")
    assert rid == "eu/clicks/DPI/12/q-3/top"
    assert split_release_id(rid) == ("eu/clicks", "DPI", 12, ("q-3", "top"))


@pytest.mark.parametrize("part", ["", "a/3", "3", "-4", "007"])
def test_a_part_that_could_forge_another_id_is_refused(part: str) -> None:
    """``sin/LBU/2/3`` would read as slot 3 of mechanism ``2``; ``a/3`` as two parts."""
    with pytest.raises(ValueError, match="release-key part"):
        release_id("sin", "LBU", 2, part)


def test_a_key_without_a_slot_is_not_a_release_id() -> None:
    assert split_release_id("sin/LBU") is None
    assert split_release_id("no-slot-here/x/y") is None
