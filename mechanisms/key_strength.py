"""Is a noise secret's text a random key? (issue 18: weak secrets were accepted.)

Entropy cannot be measured from one sample, so a key is accepted only in a form that random
generators produce and humans do not type, and only when nothing in it shows a human or a
formula made it:

* **Form.** Hex (``[0-9a-f]``, one case, at least 32 digits: 128 bits) or base64 / base64url
  (RFC 4648 standard ``+/`` or URL-safe ``-_`` alphabet, not both; ``=`` padding optional and
  only at the end) of at least 16 bytes (22 characters). Decimal-only text is refused whatever
  its length (3.3 bits a digit, and numbers such as π are guessable).
* **Structure.** Refused: a known constant (a 16-character stretch of the MD5/SHA-1/SHA-2/SHA-3/
  BLAKE2 digest of the empty string or of a common placeholder, in hex or base64, or of the
  digits of π, e, √2 or φ in decimal or hex); a repeated unit; keyboard or alphabet walks
  (``qwerty``, ``asdf``, ``12345``, ``abcd``, either direction) covering half the key or 10
  characters in a row; a placeholder word (``secret``, ``replace``, ``password``, ...) or
  common English words covering 10 characters; and character statistics no random key of that
  form and length shows: few distinct characters, one dominant character, repeated neighbours,
  or a character class (digits, letters, upper/lower case) far from its share of the alphabet.

**False refusals.** Each statistical test refuses a uniformly random key of the same form and
length with probability below ``ALPHA`` = 10⁻¹⁰ (exact binomial tails); the pattern tests are
bounded in ``docs/decisions.md`` (below 10⁻⁸ a key). The one larger rate is 32 hex digits that
happen to contain no letter (``token_hex(16)``: 3·10⁻⁷; ``token_hex(32)``: 10⁻¹³); the message
then says to generate another.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import itertools
import math
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

MIN_SECRET_BITS = 128
ALPHA = 1e-10
"""The largest probability with which a statistical test may refuse a random key."""
MAKE_ONE = "make one with: python -c 'import secrets; print(secrets.token_hex(32))'"

_HEX = re.compile(r"[0-9a-f]+|[0-9A-F]+")
_BASE64 = re.compile(r"[A-Za-z0-9+/]+=*")
_BASE64URL = re.compile(r"[A-Za-z0-9_-]+=*")
_WINDOW = 16  # characters of a known constant that identify it (64 bits of hex)
_WALK_RUN = 10  # a walk this long is refused wherever it is
_WALK_MIN = 5  # walks at least this long count towards half the key
_WORDS_MAX = 10  # characters of words a key may contain

_WALKS = (
    "abcdefghijklmnopqrstuvwxyz",
    "0123456789",
    "1234567890",
    "qwertyuiop",
    "asdfghjkl",
    "zxcvbnm",
    "1qaz2wsx3edc4rfv5tgb6yhn7ujm8ik9ol0p",
    "zaq1xsw2cde3vfr4bgt5nhy6mju7ki8lo9p0",
)
"""Rows of the alphabet, digits and a QWERTY keyboard, and its columns walked down or up."""
_PLACEHOLDERS = ("secret", "passwd", "password", "passphrase", "replace", "change", "changeme",
                 "example", "sample", "default", "placeholder", "insecure", "privstream")  # fmt: skip
_ENGLISH = """
about above after again against also always another answer away back because been before
being below best better between black blue body book both bring brown build call came cannot
change city close come could country cover dark data deploy deployment development does done
door down during each early earth east easy even ever every example face family father field
find fire first five follow food form found four free friend from front full game gave generate
give given going gone good great green ground group grow half hand hard have head hear heard
help here high hold home horse hour house important insert into just keep kind king know land
large last late later lazy learn leave left less letter life light like line list little live
local long look made main make many mark master mean might mind money more most mother mountain
move much music must name near need never new next night noise north nothing number often once
only open order other over page paper part party pass people place plan play please point power
private production public put quick random read real right river road rock room round same
school science second secret sentence server service should show side simple since small
snow some something song soon sound south space stand staple start state still stop story
stream strong study such summer sure system table take talk tell test testing than that their
them then there these they thing think this those though thought three through time today
together token told took tree true turn under until upon value very voice walk want warm watch
water welcome well went were west what when where which while white whole will wind winter
with without word work world would write year your
correct battery jump jumps hello world letmein admin root user dragon monkey shadow sunshine
master qwerty football baseball princess trustno superman iloveyou starwars whatever
"""


@dataclass(frozen=True)
class KeyText:
    """A key's characters without padding, in its alphabet (hex is read lower-case)."""

    form: str
    symbols: str
    alphabet: int

    @property
    def bits(self) -> int:
        """Bits the text can hold: 4 a hex digit; whole bytes of base64."""
        if self.alphabet == 16:
            return 4 * len(self.symbols)
        return (6 * len(self.symbols)) // 8 * 8


def key_weakness(text: str) -> str | None:
    """Why ``text`` (stripped) is not an acceptable noise key, or None when it is.

    Never quotes the text or a part of it: the reason names the rule that failed.
    """
    if any(word in _PLACEHOLDERS for word in _words(text)):
        return (
            "is a placeholder, not a key (it contains a word such as SECRET, REPLACE or PASSWORD)"
        )
    key = parse_key(text)
    if isinstance(key, str):
        return key
    if key.bits < MIN_SECRET_BITS:
        return (
            f"holds at most {key.bits} bits of entropy; at least {MIN_SECRET_BITS} are required "
            "(64 hex digits or 32 bytes of base64 are recommended)"
        )
    for check in (known_constant, repetition, decimal_only, skewed, walked, worded):
        why = check(key)
        if why is not None:
            return f"is not random ({why})"
    return None


def parse_key(text: str) -> KeyText | str:
    """The key's form (hex, base64 or base64url), or why it is in none of them."""
    if _HEX.fullmatch(text):
        return KeyText("hex", text.lower(), 16)
    for form, pattern in (("base64", _BASE64), ("base64url", _BASE64URL)):
        if pattern.fullmatch(text):
            body = text.rstrip("=")
            padding = len(text) - len(body)
            if padding > 2 or (padding and len(text) % 4) or len(body) % 4 == 1:
                return f"is not valid {form}: its length or '=' padding is wrong"
            return KeyText(form, body, 64)
    return (
        "is neither hex nor base64: it has characters outside 0-9a-f and the base64 alphabets "
        "(letters, digits, +/ or -_, = padding), e.g. spaces, punctuation or a mix of +/ and -_"
    )


def binomial_tail(n: int, p: float, k: int, *, upper: bool = True) -> float:
    """P(X ≥ k) (or P(X ≤ k) with ``upper=False``) for X ~ Binomial(n, p), exactly."""
    ks = range(k, n + 1) if upper else range(0, k + 1)
    return min(1.0, sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in ks))


@functools.cache
def refused_counts(n: int, p: float, tests: int) -> tuple[int, int]:
    """(low, high): a count ≤ low or ≥ high of Binomial(n, p) has tail probability below
    ``ALPHA / tests`` (low = -1 or high = n + 1 where no count is that unlikely)."""
    low = max((k for k in range(n + 1) if tests * binomial_tail(n, p, k, upper=False) < ALPHA),
              default=-1)  # fmt: skip
    high = min((k for k in range(n + 1) if tests * binomial_tail(n, p, k) < ALPHA), default=n + 1)
    return low, high


def known_constant(key: KeyText) -> str | None:
    """A 16-character stretch of a public constant: a digest of the empty string or of a
    placeholder (hex or base64), or digits of π, e, √2 or φ (decimal or hex)."""
    table = _constant_windows()
    text = _normalised(key.symbols)
    for i in range(len(text) - _WINDOW + 1):
        name = table.get(text[i : i + _WINDOW])
        if name is not None:
            return f"it contains {name}, a public constant"
    return None


def repetition(key: KeyText) -> str | None:
    """A repeated unit, or fewer distinct characters than a random key would show."""
    s, n = key.symbols, len(key.symbols)
    for period in range(1, n // 2 + 1):
        if s[period:] == s[:-period]:
            return f"it repeats a {period}-character unit"
    distinct = len(set(s))
    chance = math.comb(key.alphabet, distinct) * (distinct / key.alphabet) ** n
    if chance < ALPHA:
        return f"only {distinct} distinct characters in {n}"
    return None


def decimal_only(key: KeyText) -> str | None:
    """Digits only: 3.3 bits a character, and typed numbers (dates, π) are guessable."""
    if key.symbols.isdigit():
        return "digits only: write the key in hex or base64"
    return None


def skewed(key: KeyText) -> str | None:
    """Character statistics of a random key: the most frequent character, neighbours that
    repeat, and each character class's share (binomial tails, union-bounded, below ALPHA)."""
    s, n, a = key.symbols, len(key.symbols), key.alphabet
    count = Counter(s).most_common(1)[0][1]
    if count >= refused_counts(n, 1 / a, a)[1]:
        return f"one character makes up {count} of its {n}"
    repeats = sum(s[i] == s[i - 1] for i in range(1, n))
    if repeats >= refused_counts(n - 1, 1 / a, 1)[1]:
        return f"{repeats} characters repeat the one before"
    classes = _classes(key)
    for name, (share, hits) in classes.items():
        low, high = refused_counts(n, share, 2 * len(classes))
        if not low < hits < high:
            return f"{hits} of its {n} characters are {name}, about {share * n:.0f} expected"
    return None


def walked(key: KeyText) -> str | None:
    """Keyboard or alphabet walks (qwerty, asdf, 12345, abcd, either direction, any case)."""
    walks = [w for w in _walks(key.symbols.lower()) if w >= _WALK_MIN]
    if walks and (max(walks) >= _WALK_RUN or 2 * sum(walks) >= len(key.symbols)):
        return (
            f"keyboard or alphabet walks make up {sum(walks)} of its {len(key.symbols)} characters"
        )
    return None


def worded(key: KeyText) -> str | None:
    """Common English words covering ``_WORDS_MAX`` characters."""
    found = list(_words(key.symbols))
    covered = sum(map(len, found))
    if covered >= _WORDS_MAX:
        return f"words make up {covered} of its {len(key.symbols)} characters"
    return None


def _classes(key: KeyText) -> dict[str, tuple[float, int]]:
    """Each character class's share of the alphabet and its count in the key."""
    s = key.symbols
    digits = sum(c.isdigit() for c in s)
    if key.alphabet == 16:
        return {"digits": (10 / 16, digits), "letters": (6 / 16, len(s) - digits)}
    lower = sum(c.islower() for c in s)
    upper = sum(c.isupper() for c in s)
    return {
        "lower-case letters": (26 / 64, lower),
        "upper-case letters": (26 / 64, upper),
        "digits": (10 / 64, digits),
        "symbols": (2 / 64, len(s) - lower - upper - digits),
    }


def _walks(text: str) -> list[int]:
    """Lengths of the maximal walks: runs whose every step goes the same way along one of
    ``_WALKS`` (a run of length 1 is no walk and is left out)."""
    lengths, length, ways = [], 1, set[tuple[int, int]]()
    for prev, char in itertools.pairwise(text):
        steps = _steps().get((prev, char), set())
        ways = ways & steps if length > 1 else steps
        if ways:
            length += 1
            continue
        if length > 1:
            lengths.append(length)
        ways, length = steps, 2 if steps else 1
    if length > 1:
        lengths.append(length)
    return lengths


@functools.cache
def _steps() -> dict[tuple[str, str], set[tuple[int, int]]]:
    """(a, b) → the (walk, direction) pairs in which b follows a."""
    steps: dict[tuple[str, str], set[tuple[int, int]]] = {}
    for w, row in enumerate(_WALKS):
        for a, b in itertools.pairwise(row):
            steps.setdefault((a, b), set()).add((w, 1))
            steps.setdefault((b, a), set()).add((w, -1))
    return steps


@functools.lru_cache(maxsize=8)
def _words(text: str) -> tuple[str, ...]:
    """Listed words in the text, leftmost-longest without overlap; a word counts when written
    lower-case, upper-case or capitalised (random text rarely keeps one case)."""
    forms, lengths, prefixes = _word_forms()
    found, i = [], 0
    while i < len(text):
        if text[i : i + 4] in prefixes:
            word = next((w for n in lengths if (w := forms.get(text[i : i + n]))), None)
            if word is not None:
                found.append(word)
                i += len(word)
                continue
        i += 1
    return tuple(found)


@functools.cache
def _word_forms() -> tuple[dict[str, str], tuple[int, ...], frozenset[str]]:
    """Each listed word's three written forms → the word; the word lengths, longest first;
    the forms' first four letters."""
    forms = {f: w for w in _vocabulary() for f in (w, w.upper(), w.capitalize())}
    lengths = tuple(sorted({len(w) for w in _vocabulary()}, reverse=True))
    return forms, lengths, frozenset(f[:4] for f in forms)


@functools.cache
def _vocabulary() -> tuple[str, ...]:
    """Placeholders and common English words of at least 4 letters; words made only of a-f
    are left out (they occur in random hex by chance)."""
    words = set(_PLACEHOLDERS) | set(_ENGLISH.split())
    return tuple(sorted(w for w in words if len(w) >= 4 and not set(w) <= set("abcdef")))


def _normalised(text: str) -> str:
    """Lower case, URL-safe base64 read as standard: how constants are compared."""
    return text.lower().replace("-", "+").replace("_", "/")


@functools.cache
def _constant_windows() -> dict[str, str]:
    """Every 16-character window of the public constants, normalised, → its name."""
    table: dict[str, str] = {}
    for name, text in _constants():
        text = _normalised(text)
        for i in range(len(text) - _WINDOW + 1):
            table.setdefault(text[i : i + _WINDOW], name)
    return table


def _constants() -> Iterator[tuple[str, str]]:
    """Digests of the empty string and of placeholders, and digits of π, e, √2 and φ."""
    messages = ("", "\n", "0", "1", "123456", "password", "secret", "changeme", "test",
                "admin", "key", "null", "privstream")  # fmt: skip
    for algorithm in ("md5", "sha1", "sha224", "sha256", "sha384", "sha512", "sha3_256",
                      "sha3_512", "blake2b", "blake2s"):  # fmt: skip
        for message in messages:
            digest = hashlib.new(algorithm, message.encode()).digest()
            name = f"the {algorithm} digest of {message!r}"
            yield name, digest.hex()
            yield name, base64.b64encode(digest).decode().rstrip("=")
    for name, value in _irrational_digits().items():
        yield name, value


@functools.cache
def _irrational_digits(digits: int = 200) -> dict[str, str]:
    """Decimal and hex digits of π, e, √2 and φ (integer part included), computed here."""
    bits = 4 * digits + 64
    one = 1 << bits
    root5 = math.isqrt(5 << (2 * bits))
    values = {"π": _pi(bits), "e": _e(bits), "√2": math.isqrt(2 << (2 * bits)),
              "φ": (one + root5) // 2}  # fmt: skip
    out = {}
    for name, scaled in values.items():
        out[f"digits of {name}"] = str((scaled * 10**digits) >> bits)
        out[f"hex digits of {name}"] = format(scaled >> 64, "x")
    return out


def _arctan_inverse(x: int, bits: int) -> int:
    """arctan(1/x) × 2^bits, by its Taylor series in integers."""
    total, term, k, sign = 0, (1 << bits) // x, 1, 1
    while term:
        total += sign * (term // k)
        term //= x * x
        k, sign = k + 2, -sign
    return total


def _pi(bits: int) -> int:
    """π × 2^bits (Machin's formula, 8 guard bits)."""
    g = bits + 8
    return (16 * _arctan_inverse(5, g) - 4 * _arctan_inverse(239, g)) >> 8


def _e(bits: int) -> int:
    """e × 2^bits (Σ 1/k!, 8 guard bits)."""
    g = bits + 8
    total, term, k = 0, 1 << g, 0
    while term:
        total += term
        k += 1
        term //= k
    return total >> 8
