"""The built-in task types (``spec.TaskType``): a histogram over ``d`` categories, the mean of
numbers in a range and the mean of vectors in an L2 ball — their flow-file keys (``domain``,
``range``, ``ball``), the ``--mean-range`` flag, and how each value parses. A family lists the
ones it releases in ``Family.tasks``; generic code asks these, never a shape flag."""

from __future__ import annotations

import argparse
import json
from typing import Any, Final

from privstream.families.spec import FlowTable, TaskType
from privstream.mechanisms.tasks import BallTask, FrequencyTask, MeanTask


def parse_mean_range(text: str) -> tuple[float, float]:
    """``LOWER:UPPER``: the public range of a numeric mean (``--mean-range``)."""
    try:
        lower, upper = (float(x) for x in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LOWER:UPPER, got {text}") from None
    return lower, upper


def _domain(t: FlowTable) -> int:
    return t.integer("domain", 2)


def _range(t: FlowTable) -> tuple[float, float]:
    bounds = t.numbers("range", "[lower, upper] (two finite numbers)")
    if len(bounds) != 2:
        raise t.error(
            "range",
            f"must be [lower, upper] (two finite numbers), got {json.dumps(t.data['range'], default=str)}",
        )
    return bounds[0], bounds[1]


def _ball(t: FlowTable) -> tuple[tuple[float, ...], float]:
    ball = t.table("ball")
    ball.only(("center", "radius"))
    return ball.numbers("center", "an array of finite numbers"), ball.number("radius")


def _show_range(value: Any) -> str:
    return f"range [{value[0]:g}, {value[1]:g}]"


def _show_ball(value: Any) -> str:
    return f"ball center ({', '.join(f'{c:g}' for c in value[0])}) radius {value[1]:g}"


FREQUENCY: Final = TaskType(
    name="frequency",
    key="domain",
    describe="domain = d (a histogram over d categories)",
    parse_flow=_domain,
    classes=(FrequencyTask,),
    show=lambda d: f"d = {d}",
)
"""A histogram over ``d`` categories (``FrequencyTask``): ``domain = d``, ``--domain d``."""

MEAN: Final = TaskType(
    name="mean",
    key="range",
    describe="range = [lower, upper] (the mean of numbers)",
    parse_flow=_range,
    classes=(MeanTask,),
    flag="--mean-range",
    help="LOWER:UPPER: a file dataset is numeric, clipped to it",
    parse_flag=parse_mean_range,
    keyword="mean_range",
    show=_show_range,
)
"""The mean of numbers clipped to a public range (``MeanTask``): ``range = [lo, hi]``,
``--mean-range LO:HI`` or ``--domain LO:HI``."""

BALL: Final = TaskType(
    name="ball",
    key="ball",
    describe="ball = { center = [...], radius = r } (the mean of vectors)",
    parse_flow=_ball,
    classes=(BallTask,),
    show=_show_ball,
)
"""The mean of vectors in an L2 ball (``BallTask``): ``ball = {center, radius}`` or
``--domain ball:C1,…,Cd:R``; reported through a family's own client protocol."""
