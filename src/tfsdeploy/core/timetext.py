"""Times given as text on the command line: `fab logs --since`, and durations (`fab bench
--duration`, the load generator's options). Pure; no I/O."""

from __future__ import annotations

import re

_SPAN = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h|d)")
_DATE_TIME = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}")
_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ns|us|µs|ms|s|m|h)?\s*$")
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def duration_seconds(text: str) -> float:
    """``10s``, ``500ms``, ``2m``, ``1.5h`` or a bare number of seconds, to seconds; raises
    ValueError naming the text otherwise."""
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"bad duration {text!r} (e.g. 30s, 500ms, 2m)")
    return float(match.group(1)) * _UNITS[match.group(2) or "s"]


def duration_text(seconds: float) -> str:
    """A whole number of seconds as the shortest duration text ``duration_seconds`` reads
    back (600 -> ``10m``, 5 -> ``5s``, 5400 -> ``90m``)."""
    for unit in ("h", "m"):
        if seconds and seconds % _UNITS[unit] == 0:
            return f"{seconds / _UNITS[unit]:g}{unit}"
    return f"{seconds:g}s"


def since_seconds(text: str, now: float) -> float:
    """``--since``: a span back from ``now`` (``30s``, ``10m``, ``2h``, ``1h30m``, ``1d``) or
    an RFC 3339 time (``2026-11-30T23:28:00Z``), as the Unix time the Docker Engine takes.
    Raises ValueError saying why ``text`` is neither (see SINCE_FIX)."""
    # pydantic only here: the load generator reads its durations through this module, and its
    # start-up (on every generator host and worker process) does without pydantic
    from pydantic import AwareDatetime, TypeAdapter, ValidationError

    cleaned = text.strip()
    if cleaned and _SPAN.sub("", cleaned) == "":
        back = sum(float(n) * _SECONDS[unit] for n, unit in _SPAN.findall(cleaned))
        if not back < now:  # 100000d: the Engine refuses a time before 1970 (inf too)
            raise ValueError(f"reaches back before 1970 (at most {int(now // 86400)}d back "
                             "from now): the Docker Engine takes later times only")
        return now - back
    try:
        if not _DATE_TIME.match(cleaned):  # pydantic would read a bare number as Unix time
            raise ValueError(cleaned)
        moment = TypeAdapter(AwareDatetime).validate_python(cleaned)
    except (ValueError, ValidationError):
        raise ValueError("is neither a time span nor an RFC 3339 time with its offset"
                         ) from None
    if moment.timestamp() <= 0:
        raise ValueError("is before 1970: the Docker Engine takes later times only")
    return moment.timestamp()


SINCE_FIX = "give a span back from now (30s, 10m, 2h, 1h30m, 1d) or a time such as " \
            "2026-11-30T23:28:00Z"
