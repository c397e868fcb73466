"""``privstream run FAMILY --trust ldp-shuffled`` (issue 25): the server stage behind a shuffler
(``flows.shuffled``). It publishes the public tasks, then reads only the shuffled topic."""

from __future__ import annotations

import argparse
import sys
from typing import Any

SHUFFLED = "ldp-shuffled"


def check_run(args: argparse.Namespace, family: Any) -> None:
    """Refuse a server stage that could see who sent what, naming what is wrong: a central-DP
    family, an event or report topic as its input, a missing topic. SaO2 (which declares
    ``ldp-shuffled``) runs its own stage; any other local family runs its ``ldp-reports``
    rounds on the shuffler's counts."""
    if not family.local:
        raise ValueError(f"--trust {SHUFFLED} is a local-DP mode; the {family.name} family runs "
                         f"as {family.trust} (a trusted curator sees raw values)")  # fmt: skip
    for flag, value in (("--input-topic", args.input_topic), ("--report-topic", args.report_topic)):
        if value:
            raise ValueError(
                f"in {SHUFFLED} mode the server reads only the shuffler's batches (--shuffled-"
                f"topic): {flag} would let it see who sent what; only the shuffler reads the "
                "devices' report topic"
            )
    needed = {"--shuffled-topic": args.shuffled_topic, "--request-topic": args.request_topic,
              "--output-topic": args.output_topic}  # fmt: skip
    missing = [flag for flag, value in needed.items() if not value]
    if missing:
        raise ValueError(f"--trust {SHUFFLED} needs {', '.join(missing)}")
    if args.shuffled_topic == args.request_topic:
        raise ValueError("--shuffled-topic and --request-topic must be two topics")


def prepare(args: argparse.Namespace, family: Any, settings: Any, task: Any, secret: Any) -> Any:
    """Check the run, publish the tasks to the request topic and return the server stage's
    flow (shuffled topic in)."""
    from privstream.connectors.kafka import require_topics
    from privstream.flows.io import KafkaIO
    from privstream.flows.shuffled import build_shuffled, publish_tasks, server_tasks

    check_run(args, family)
    if SHUFFLED not in next(iter(family.mechanisms.values())).trust_modes:
        return _rounds(args, family, settings, task, secret)
    slots = args.slots or 1 << 30  # unbounded: every horizon the lifetime budget holds
    stream = args.stream or args.dataset
    options = {o.name: getattr(args, o.name) for o in family.options}
    mech, tasks = server_tasks(
        family.name, task=task, users=args.users, epsilon=args.epsilon,
        window=args.window or family.window, stream=stream, secret=secret, slots=slots,
        **options,
    )  # fmt: skip
    kafka = KafkaIO(
        settings, args.shuffled_topic, args.output_topic, args.dead_letter_topic,
        args.ledger_topic, until_slot=args.slots, stall_warning_seconds=args.stall_warning_seconds,
        request_topic=args.request_topic,
    )  # fmt: skip
    kafka = kafka.with_partitions(require_topics(settings, kafka.topics()))
    publish_tasks(settings, args.request_topic, tasks)
    print(f"published {len(tasks)} task(s) of {stream} on {args.request_topic}", file=sys.stderr)
    return build_shuffled(mech, tasks, kafka, stream)


def _rounds(args: argparse.Namespace, family: Any, settings: Any, task: Any, secret: Any) -> Any:
    """An ``ldp-reports`` family behind the shuffler: its server stage reading the shuffler's
    counts per request (GRR and OUE reports) and the forwarded round markers."""
    from privstream.connectors.kafka import require_topics
    from privstream.flows.io import KafkaIO
    from privstream.flows.reports import build_reports

    kafka = KafkaIO(
        settings, args.shuffled_topic, args.output_topic, args.dead_letter_topic,
        args.ledger_topic, until_slot=args.slots, stall_warning_seconds=args.stall_warning_seconds,
        request_topic=args.request_topic,
    )  # fmt: skip
    kafka = kafka.with_partitions(require_topics(settings, kafka.topics()))
    options = {o.name: getattr(args, o.name) for o in family.options}
    return build_reports(
        family.name, kafka, task=task, mechanisms=args.mechanism, users=args.users,
        epsilon=args.epsilon, window=args.window, stream=args.stream or args.dataset,
        secret=secret, budget_split=args.budget_split, shuffled=True, **options,
    )  # fmt: skip
