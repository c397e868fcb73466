"""Where a run's noise key comes from: a secret file, ``$PRIVSTREAM_SECRET``, or an explicit
insecure seed (design §6).

A production run must have a secret of at least 128 bits that nobody outside the operator
knows: with a public key, anybody can redraw the noise and subtract it (the audit recovered
exact histograms from the releases of a run keyed by the old default seed 1). Nothing here
prints, logs or exports the secret; errors name where it came from, never what it is.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from privstream.mechanisms.seeding import ENV_SECRET as ENV_SECRET
from privstream.mechanisms.seeding import NoiseKey, SecretError, clock_key_from_text

ENV_CLOCK_KEY = "PRIVSTREAM_CLOCK_KEY"
HOW_TO = (
    "give one with --secret-file FILE or $PRIVSTREAM_SECRET (make it with: python -c "
    "'import secrets; print(secrets.token_hex(32))' > FILE; chmod 600 FILE), or ask for a "
    "reproducible, NOT private run with --insecure-seed N"
)
log = logging.getLogger(__name__)


def resolve_noise_key(
    secret: NoiseKey | str | bytes | None = None,
    insecure_seed: int | None = None,
    secret_file: str | Path | None = None,
) -> NoiseKey:
    """The run's noise key: ``secret`` (a key or its text), else ``secret_file``'s content,
    else ``$PRIVSTREAM_SECRET``, else the explicit ``insecure_seed``; refuses to go on
    without one of them (``SecretError``) and refuses a secret (of any source, the environment
    included) and a seed together: a seed never silently replaces a secret the operator set."""
    if insecure_seed is not None:
        _refuse_secret_and_seed(secret, secret_file)
    if isinstance(secret, NoiseKey):
        return secret
    if secret is not None:
        text = secret.decode("utf-8", "replace") if isinstance(secret, bytes) else secret
        return NoiseKey.from_text(text)
    if secret_file is not None:
        return NoiseKey.from_file(secret_file)
    if insecure_seed is not None:
        log.warning(
            "noise from the public seed %d: releases are reproducible by anyone and NOT private; "
            "they are marked insecure_seed",
            insecure_seed,
        )
        return NoiseKey.insecure_seed(insecure_seed)
    if os.environ.get(ENV_SECRET):
        return NoiseKey.from_env(ENV_SECRET)
    raise SecretError(f"refusing to start without a secret noise key: {HOW_TO}")


def _refuse_secret_and_seed(secret: object, secret_file: object) -> None:
    """An insecure seed asked for while a secret is given: refused, naming the secret's source
    (a public seed would replace it and publish noise anyone can subtract)."""
    if secret is not None:
        source, undo = "a secret", "leave the secret out"
    elif secret_file is not None:
        source, undo = f"the secret file {secret_file}", "leave the secret file out"
    elif os.environ.get(ENV_SECRET):
        source, undo = f"${ENV_SECRET}", f"unset ${ENV_SECRET}"
    else:
        return
    raise SecretError(
        f"give either a secret or an insecure seed, not both: {source} is given together with "
        "--insecure-seed, whose public noise would replace it and make every release NOT "
        f"private; drop --insecure-seed for a private run, or {undo} for a reproducible one"
    )


def resolve_clock_key(
    clock_key_file: str | Path | None = None,
    secret_file: str | Path | None = None,
    insecure_seed: int | None = None,
) -> bytes | None:
    """The key that tags end-of-slot markers (``NoiseKey.clock_key``): ``clock_key_file``,
    else ``$PRIVSTREAM_CLOCK_KEY`` (hex, as ``privstream clock-key`` prints it), else derived
    from the noise secret (``secret_file``, ``$PRIVSTREAM_SECRET`` or ``insecure_seed``); None
    when none is given. Give clock writers the clock key, never the secret: it closes slots
    and reveals nothing of the noise."""
    if clock_key_file is not None:
        path = Path(clock_key_file)
        if not path.is_file():
            raise SecretError(f"clock key file {path} does not exist")
        return clock_key_from_text(
            path.read_text("utf-8", "replace"), origin=f"clock key file {path}"
        )
    env = os.environ.get(ENV_CLOCK_KEY)
    if env and secret_file is None and insecure_seed is None:
        return clock_key_from_text(env, origin=f"${ENV_CLOCK_KEY}")
    if secret_file is None and insecure_seed is None and not os.environ.get(ENV_SECRET):
        return None
    return resolve_noise_key(insecure_seed=insecure_seed, secret_file=secret_file).clock_key()
