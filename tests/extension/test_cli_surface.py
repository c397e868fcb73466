"""The command line's surface for a family it does not ship (what the old worked example,
``tests/test_family_template.py``, checked on a family patched into the registry): an external
family registered by entry point (``site/example_measure``) is offered by ``privstream run`` and
``bench`` with its defaults, its mechanisms and its own options in ``--help``, and an unknown
family is refused by name — by the registry, and by the command line with the families it
knows, the external ones included."""

from __future__ import annotations

import pytest

from privstream.cli import main
from privstream.families import registry


def _help(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as done:
        main([*argv, "--help"])
    assert done.value.code == 0
    return " ".join(capsys.readouterr().out.split())


def test_run_offers_an_external_family_with_its_defaults(
    external_site: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    text = _help(capsys, "run", "example-measure")
    assert "registered population size n (default 4000)" in text  # Family.users
    assert "a lifetime (default 5.0)" in text and "window size w (default 5)" in text
    assert "one or more of RGM, comma separated (default RGM)" in text
    assert "--charge-scale CHARGE_SCALE each slot charges charge_scale·ε/w" in text
    assert "(default 1.0)" in text  # the family's own option, with its default
    # LDP families take a registration table too (a closed population, issue 18 §4)
    assert "--registrations" in text


def test_bench_offers_an_external_family(
    external_site: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    text = _help(capsys, "bench", "example-measure")
    assert "--seeds" in text and "--charge-scale" in text


def test_an_unknown_family_is_refused_by_name(
    external_site: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ValueError, match="unknown family 'nope'"):
        registry.family("nope")
    for command in ("run", "bench"):
        with pytest.raises(SystemExit) as done:
            main([command, "nope"])
        assert done.value.code == 2
        err = capsys.readouterr().err
        assert "invalid choice: 'nope'" in err and "'example-measure'" in err
