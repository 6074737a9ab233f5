"""Content nobody vouches for: parse it strictly, check it against its format's schema, count what is refused.

Every file or stream an agent or a command reads (verdict files of other agents, saved detector
state, site files, experiment specs, reports, the counts feed) goes through here before any of it is
used: JSON without ``NaN``/``Infinity`` (Python's ``json`` accepts them, no schema number check
refuses a NaN), no non-finite number anywhere (YAML has ``.nan`` and ``.inf``), then its JSON
Schema. A refusal is a :class:`BadInput` (a ``ValueError``) whose message names where the content
is wrong; a reader that runs unattended counts it (:data:`REFUSED`, exported as
``flowpulse_bad_input_total``), logs one line, and goes on without it.
"""
from __future__ import annotations

import json
import logging
import math
import threading
from collections import Counter
from functools import lru_cache
from pathlib import Path

log = logging.getLogger("flowpulse.input")


class BadInput(ValueError):
    """Content that does not hold to its format; the message says where and what."""


def _no_constant(name: str):
    raise BadInput(f"{name} is not a number JSON allows")


def loads(text: str | bytes):
    """JSON text, refusing ``NaN``, ``Infinity`` and ``-Infinity`` (BadInput)."""
    try:
        return json.loads(text, parse_constant=_no_constant)
    except BadInput:
        raise
    except (ValueError, RecursionError) as e:
        raise BadInput(f"not JSON ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None


def text_of(data: bytes, limit: int) -> str:
    """``data`` (read up to ``limit + 1`` bytes) as text: BadInput if it is larger than ``limit`` or not
    UTF-8. Files and peers' answers alike."""
    if len(data) > limit:
        raise BadInput(f"larger than {limit} bytes")
    try:
        return data.decode()
    except UnicodeDecodeError as e:
        raise BadInput(f"not UTF-8 text (byte {e.start})") from None


def one_line(text: str) -> str:
    """``text`` with every character that is not printable (a newline in a key, an escape sequence)
    written as its escape: messages about content are one line, and say nothing to the terminal."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def finite(v: int | float) -> bool:
    """A number that is finite as a float. A JSON or YAML integer has no bound (10**400 parses) and
    ``math.isfinite`` raises OverflowError on one beyond a float's range: it is not finite here."""
    try:
        return math.isfinite(v)
    except OverflowError:
        return False


def nonfinite(obj, where: str = "") -> str | None:
    """The location of the first NaN or infinity in a parsed document (``weights.leaf0->spine1``), or None."""
    stack = [(obj, where)]
    while stack:
        o, at = stack.pop()
        if isinstance(o, float) and not math.isfinite(o):
            return one_line(at) or "top level"
        if isinstance(o, dict):
            stack.extend((v, f"{at}.{k}" if at else str(k)) for k, v in o.items())
        elif isinstance(o, (list, tuple)):
            stack.extend((v, f"{at}[{i}]") for i, v in enumerate(o))
    return None


@lru_cache(maxsize=None)
def _validator(schema_path: Path):
    import jsonschema

    schema = json.loads(schema_path.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def problem(schema_path: Path, data) -> str | None:
    """The first problem of ``data`` against the JSON Schema at ``schema_path`` (with where it is), or
    None if it holds. Non-finite numbers are a problem wherever they are."""
    at = nonfinite(data)
    if at is not None:
        return f"{at}: not a finite number"
    return _first(_validator(schema_path), data)


def _first(validator, data) -> str | None:
    import jsonschema

    try:
        err = jsonschema.exceptions.best_match(validator.iter_errors(data))
    except RecursionError:
        return "top level: nested too deeply"
    if err is None:
        return None
    where = one_line(".".join(str(p) for p in err.absolute_path)) or "top level"
    msg = one_line(err.message)
    if err.validator == "additionalProperties" and isinstance(err.instance, dict) and "properties" in err.schema:
        extra = sorted(str(k) for k in err.instance if k not in err.schema["properties"])
        msg = f"unknown field(s) {extra}: allowed are {sorted(err.schema['properties'])}"
    return f"{where}: {msg if len(msg) < 300 else msg[:300] + '...'}"


def check(schema_path: Path, data) -> None:
    """Raise :class:`BadInput` with :func:`problem`'s message if ``data`` does not hold to the schema."""
    p = problem(schema_path, data)
    if p is not None:
        raise BadInput(p)


def check_parts(schema_path: Path, data, parts: tuple[str, ...]) -> None:
    """:func:`check` of only the top-level ``parts`` of an object (each required, each against its own
    subschema in the schema's ``properties``)."""
    if not isinstance(data, dict):
        raise BadInput(f"top level: {type(data).__name__} is not an object")
    at = nonfinite({k: data.get(k) for k in parts})
    if at is not None:
        raise BadInput(f"{at}: not a finite number")
    full = _validator(schema_path).schema
    for k in parts:
        if k not in data:
            raise BadInput(f"top level: {k!r} is a required property")
        sub = {"$defs": full.get("$defs", {}), **full["properties"][k]}
        p = problem_in(sub, data[k])
        if p is not None:
            raise BadInput(f"{k}.{p}" if not p.startswith("top level") else f"{k}{p[len('top level'):]}")


def problem_in(schema: dict, data) -> str | None:
    """:func:`problem` against a schema given as a mapping."""
    import jsonschema

    return _first(jsonschema.Draft202012Validator(schema), data)


class Refusals:
    """Bad content refused by readers that run unattended, counted by source (``verdict``, ``state``,
    ``feed``). Each origin (a file) gets one warning line when it turns bad, and one more only after
    it was good again in between: a file rewritten bad every pulse does not flood the log."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self._bad: set[str] = set()

    def refuse(self, source: str, origin: str, why: str) -> None:
        with self.lock:
            self.counts[source] += 1
            first = origin not in self._bad
            self._bad.add(origin)
        if first:
            log.warning("%s %s refused: %s", source, origin, why)

    def accepted(self, origin: str) -> None:
        if origin in self._bad:
            with self.lock:
                self._bad.discard(origin)

    def snapshot(self) -> dict[str, int]:
        with self.lock:
            return dict(self.counts)


REFUSED = Refusals()
