"""Shared validation: constrained value types, and pydantic errors turned into Problems.

The inventory, the model catalog and the host vars are typed with these annotations and
checked by pydantic (v2): it checks types, ranges and enums in compiled code, reports every
error of a value at once and says where each one is (``loc``). ``problems_from`` turns such an
error into the project's located Problems, with a fix for each; playbooks, CLI arguments and
records read back from hosts can use the same types and the same function.

Scalars are strict: ``"8"`` is not a number and ``True`` is not an int (a quoted number in a
Python inventory is a mistake to point out, not to guess at). Containers are lax: a list is
accepted where a tuple is declared.
"""

from __future__ import annotations

import difflib
import ipaddress
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Annotated, Any, TypeVar

from pydantic import AfterValidator, Field, Strict, TypeAdapter, ValidationError
from pydantic_core import ErrorDetails, PydanticCustomError

from tfsdeploy.core.errors import Problem, shown

T = TypeVar("T")

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
ONE_DAY_S = 86_400.0
ONE_WEEK_S = 7 * ONE_DAY_S

# -- numbers --------------------------------------------------------------------------------

Port = Annotated[int, Strict(), Field(ge=1, le=65535)]
NonNegativeInt32 = Annotated[int, Strict(), Field(ge=0, le=INT32_MAX)]
PositiveInt32 = Annotated[int, Strict(), Field(ge=1, le=INT32_MAX)]
NonNegativeInt64 = Annotated[int, Strict(), Field(ge=0, le=INT64_MAX)]
# nan, inf and numbers too large for a float are refused by allow_inf_nan/Strict
Seconds = Annotated[float, Strict(), Field(ge=0, le=ONE_DAY_S, allow_inf_nan=False)]
PositiveSeconds = Annotated[float, Strict(), Field(gt=0, le=ONE_DAY_S, allow_inf_nan=False)]
Percent = Annotated[float, Strict(), Field(ge=0, le=100, allow_inf_nan=False)]
Flag = Annotated[bool, Strict()]


def rule(check: Callable[[Any], str | None], fix: str) -> AfterValidator:
    """A pydantic check with the project's wording: ``check`` returns why the value is
    wrong (or None); the error carries ``fix`` for ``problems_from``."""
    def validate(value: T) -> T:
        reason = check(value)
        if reason is not None:
            raise PydanticCustomError("tfsdeploy", "{reason}", {"reason": reason, "fix": fix})
        return value
    return AfterValidator(validate)


def pattern_rule(pattern: str, what: str, fix: str) -> AfterValidator:
    """A ``rule`` that the whole string matches ``pattern``; ``what`` describes it."""
    compiled = re.compile(pattern)
    return rule(lambda value: None if compiled.fullmatch(value) else f"is not {what}", fix)


# -- names ----------------------------------------------------------------------------------

# A model name becomes a directory on every host (layout.py), a container name, a label and a
# REST path. A leading '.' would hide it beside the `.staging-*` directories and a leading '-'
# reads as an option to the tools that receive it.
MODEL_NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}"
# Names the host layout (layout.py) uses beside or inside the model directories: a model with
# one of them would share its directory with the layout's own (`models` is the version store
# beside the model homes, `gpu` the host-wide GPU records every model shares).
RESERVED_MODEL_NAMES = frozenset({"models", "lock", "releases", "current", "proxy", "audit.log",
                                  "gpu"})


def model_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a model name, or None."""
    if not re.fullmatch(MODEL_NAME_PATTERN, name):
        return (f"model name {name!r} must be 1-64 of [A-Za-z0-9_.-], starting with a letter "
                "or digit")
    if ".." in name:
        return f"model name {name!r} would escape its directory"
    if name in RESERVED_MODEL_NAMES:
        return (f"model name {name!r} is a name the host layout uses "
                f"({', '.join(sorted(RESERVED_MODEL_NAMES))})")
    return None


ModelName = Annotated[str, Strict(), rule(
    model_name_problem, "rename the model: 1-64 letters, digits, '_', '.' and '-', starting "
    "with a letter or digit, not a name of the host layout")]
# TFServing's REST API addresses labels as /labels/<label> and accepts [a-zA-Z0-9_]+
LabelName = Annotated[str, Strict(), pattern_rule(
    r"[A-Za-z0-9_]{1,64}", "1-64 of [A-Za-z0-9_] (TFServing's REST label paths)",
    "rename the label: letters, digits and '_' only")]
# host and group names are matched by --hosts: ',' separates and '*?[' are globs
NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}"
HostName = Annotated[str, Strict(), pattern_rule(
    NAME_PATTERN, "1-128 of [A-Za-z0-9_.-] starting with a letter or digit",
    "use letters, digits, '.', '_' and '-' (no ',' or glob characters)")]
GroupName = HostName
Text = Annotated[str, Strict(), Field(min_length=1, max_length=4096)]
ShortName = Annotated[str, Strict(), pattern_rule(
    r"[A-Za-z0-9_.-]{1,64}", "1-64 of [A-Za-z0-9_.-]",
    "use letters, digits, '.', '_' and '-'")]

# -- addresses, paths, images -------------------------------------------------------------

_HOSTNAME_LABEL = r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)"
_HOSTNAME = re.compile(rf"{_HOSTNAME_LABEL}(\.{_HOSTNAME_LABEL})*\.?")


def address_problem(value: str) -> str | None:
    """Why ``value`` is neither an IP address nor a DNS name (RFC 1123), or None."""
    try:
        ipaddress.ip_address(value)
        return None
    except ValueError:
        pass
    if len(value) <= 253 and _HOSTNAME.fullmatch(value) and not value.replace(".", "").isdigit():
        return None
    return "is neither an IP address nor a DNS name"


Address = Annotated[str, Strict(), rule(
    address_problem, "write the host's IP address (10.0.0.5) or DNS name (gpu-a01.example)")]


def absolute_dir_problem(value: str) -> str | None:
    """Why ``value`` is not a clean absolute directory below / (or None)."""
    if not value.startswith("/"):
        return "is not an absolute path"
    parts = value.rstrip("/").split("/")[1:]
    if not parts:
        return "is the root directory itself"
    if any(p in ("", ".", "..") for p in parts):
        return "has an empty, '.' or '..' component"
    if not all(re.fullmatch(r"[A-Za-z0-9_.+-]+", p) for p in parts):
        return "has characters outside [A-Za-z0-9_.+-]"
    return None


AbsoluteDir = Annotated[str, Strict(), rule(
    absolute_dir_problem, "use an absolute directory below /, e.g. /srv/tfsdeploy")]
# an absolute URL path (Prometheus metrics path); the characters a path needs, no escapes
UrlPath = Annotated[str, Strict(), pattern_rule(
    r"/[A-Za-z0-9._~/-]{0,255}", "an absolute URL path of [A-Za-z0-9._~/-]",
    "use a path such as /monitoring/prometheus/metrics")]

# The grammar of an image reference (distribution/reference, reference.go):
#   reference := name [":" tag] ["@" digest]; name := [domain "/"] path-component ["/" ...]
#   domain := host [":" port]; path-component := [a-z0-9]+ ([_.]|__|-+ [a-z0-9]+)*
#   tag := [\w][\w.-]{0,127}; digest := algorithm ":" hex{32,}; name at most 255 characters.
_DOMAIN_PART = r"(?:[A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9-]*[A-Za-z0-9])"
_DOMAIN = rf"(?:{_DOMAIN_PART}(?:\.{_DOMAIN_PART})*|\[[0-9A-Fa-f:.]+\])(?::[0-9]+)?"
_COMPONENT = r"[a-z0-9]+(?:(?:[_.]|__|-+)[a-z0-9]+)*"
_NAME = rf"(?:{_DOMAIN}/)?{_COMPONENT}(?:/{_COMPONENT})*"
_REFERENCE = re.compile(
    rf"(?P<name>{_NAME})(?::[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}})?"
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?")


def image_problem(value: str) -> str | None:
    """Why ``value`` is not a docker image reference, or None."""
    match = _REFERENCE.fullmatch(value)
    if match is None:
        return "is not a docker image reference (registry/name:tag)"
    if len(match["name"]) > 255:
        return "has a name longer than 255 characters"
    return None


ImageReference = Annotated[str, Strict(), rule(
    image_problem, "write an image reference such as registry:5000/tensorflow/serving:2.21.0-gpu "
    "(lowercase name, optional :tag and @sha256:digest)")]

# -- rollout steps ----------------------------------------------------------------------------


def serial_step_problem(step: object) -> str | None:
    """Why ``step`` is not a batch size: a positive count or a percentage in (0, 100]."""
    if isinstance(step, int) and not isinstance(step, bool) and 0 < step <= 1_000_000:
        return None
    if isinstance(step, str) and re.fullmatch(r"[0-9]{1,3}(\.[0-9]{1,6})?%", step) \
            and 0 < float(step[:-1]) <= 100:
        return None
    return f"serial step {step!r} is neither a positive count nor a percentage in (0, 100]"


SerialStep = Annotated[int | str, rule(serial_step_problem, "write e.g. serial=(1, '25%', '100%')")]


# -- pydantic errors as Problems --------------------------------------------------------------

def adapter(kind: Any) -> TypeAdapter[Any]:
    """A cached TypeAdapter for ``kind`` (building one costs milliseconds)."""
    cached = _ADAPTERS.get(kind)
    if cached is None:
        cached = _ADAPTERS[kind] = TypeAdapter(kind)
    return cached


_ADAPTERS: dict[Any, TypeAdapter[Any]] = {}


def check(kind: Any, value: object, *, file: str | None, host: str | None = None,
          prefix: str = "", known: Iterable[str] = (), unknown: str = "key"
          ) -> tuple[Any, list[Problem]]:
    """Validate ``value`` as ``kind``: (the validated value, []) or (None, its problems)."""
    try:
        return adapter(kind).validate_python(value), []
    except ValidationError as error:
        return None, problems_from(error, file=file, host=host, prefix=prefix, known=known,
                                   unknown=unknown)


def problems_from(error: ValidationError, *, file: str | None, host: str | None = None,
                  prefix: str = "", known: Iterable[str] = (), unknown: str = "key"
                  ) -> list[Problem]:
    """One located Problem per error in ``error``.

    ``prefix`` is the field path of the validated value (``models.resnet50``); ``known`` are
    the accepted keys, suggested when a key is ``unknown`` (a ``var``, a ``key``)."""
    choices = sorted(known)
    details = error.errors(include_url=False)
    # a container whose items failed also fails its length check: say it once
    failed = {tuple(d["loc"][:-1]) for d in details if d["loc"]}
    return [_problem(detail, file=file, host=host, prefix=prefix, known=choices,
                     unknown=unknown)
            for detail in details
            if not (detail["type"] == "too_short" and tuple(detail["loc"]) in failed)]


def _problem(detail: ErrorDetails, *, file: str | None, host: str | None, prefix: str,
             known: Sequence[str], unknown: str) -> Problem:
    loc = detail["loc"]
    path = field_path(prefix, loc)
    names = [str(p) for p in loc if isinstance(p, str) and p != "[key]"]
    leaf = names[-1] if names else (prefix.rsplit(".", 1)[-1] or "value")
    kind = detail["type"]
    if kind in ("unexpected_keyword_argument", "extra_forbidden"):
        close = difflib.get_close_matches(leaf, known, n=1)
        return Problem(f"unknown {unknown} {leaf!r}",
                       fix=f"did you mean {close[0]!r}?" if close else "remove it",
                       host=host, file=file, field=path)
    if loc and loc[-1] == "[key]":  # a dict key, not its value, is wrong
        container = names[-2] if len(names) > 1 else prefix.rsplit(".", 1)[-1]
        leaf = f"{container} key" if container else "key"
    reason, fix = explain(detail, leaf)
    value = shown(detail["input"])
    if kind in ("missing", "missing_argument"):
        message = f"{leaf} {reason}"  # the input shown would be its container
    elif kind != "tfsdeploy":
        message = f"{leaf} is {value}: {reason}"
    elif reason.startswith(_PREDICATES):
        message = f"{leaf} {value} {reason}"
    else:
        message = reason  # a whole sentence that names the value itself
    return Problem(message, fix=fix, host=host, file=file, field=path)


# the start of a reason that reads after "<field> <value>"
_PREDICATES = ("is ", "has ", "defines ", "must ")


def field_path(prefix: str, loc: Sequence[int | str]) -> str:
    """``models.m`` + ("batching", "max_batch_size") -> ``models.m.batching.max_batch_size``;
    list positions print as ``[i]``."""
    text = prefix
    for part in loc:
        if part == "[key]":
            continue
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            part = _without_credentials(part)
            text += f".{part}" if text else str(part)
    return text


def _without_credentials(key: str) -> str:
    """A key as a field path may show it: what stands before an '@' (``user:password@host``,
    a credential written where a name belongs) is never shown."""
    return "***@" + key.rpartition("@")[2] if "@" in key else key


_TYPE_WORDS = {
    "int_type": ("must be a whole number", "write {leaf} as a plain integer (no quotes)"),
    "int_parsing": ("must be a whole number", "write {leaf} as a plain integer (no quotes)"),
    "int_from_float": ("must be a whole number", "write {leaf} as a plain integer"),
    "float_type": ("must be a finite number", "write {leaf} as a plain number (no quotes)"),
    "float_parsing": ("must be a finite number", "write {leaf} as a plain number (no quotes)"),
    "finite_number": ("must be a finite number (not nan or inf)",
                      "write {leaf} as a plain number"),
    "bool_type": ("must be True or False", "write {leaf}=True or {leaf}=False"),
    "bool_parsing": ("must be True or False", "write {leaf}=True or {leaf}=False"),
    "string_type": ("must be a string", "write {leaf} in quotes"),
    "dict_type": ("must be a dict", "write {leaf} as a dict: {{'key': value}}"),
    "list_type": ("must be a list", "write {leaf} as a list: [...]"),
    "tuple_type": ("must be a list", "write {leaf} as a list or tuple: (...)"),
    "sequence_str": ("must be a list, not a string", "write {leaf} as a list: ['...']"),
    "string_too_short": ("must not be empty", "give {leaf} a value"),
    "missing": ("is required", "add {leaf}"),
    "missing_argument": ("is required", "add {leaf}"),
}


def explain(detail: ErrorDetails, leaf: str) -> tuple[str, str]:
    """(reason, fix) for one pydantic error, in the project's words."""
    kind = detail["type"]
    ctx: Mapping[str, Any] = detail.get("ctx") or {}
    if kind == "tfsdeploy":
        return str(ctx["reason"]), str(ctx["fix"])
    if kind in _TYPE_WORDS:
        reason, fix = _TYPE_WORDS[kind]
        return reason, fix.format(leaf=leaf)
    bounds = {"greater_than_equal": ("at least", "ge", "or more"),
              "greater_than": ("greater than", "gt", "or more"),
              "less_than_equal": ("at most", "le", "or less"),
              "less_than": ("less than", "lt", "or less")}
    if kind in bounds:
        words, key, direction = bounds[kind]
        limit = ctx[key]
        return f"must be {words} {limit}", f"set {leaf} to {limit} {direction}" \
            if key in ("ge", "le") else f"set {leaf} {words} {limit}"
    if kind == "literal_error":
        expected = str(ctx.get("expected", ""))
        options = re.findall(r"'([^']*)'", expected)
        given = detail["input"]
        close = difflib.get_close_matches(given, options, n=1) if isinstance(given, str) else []
        return (f"must be one of {expected}",
                f"did you mean {close[0]!r}?" if close else f"use one of {expected}")
    if kind in ("dataclass_type", "dataclass_exact_type", "model_type", "is_instance_of"):
        name = str(ctx.get("class_name") or ctx.get("class") or "the expected type")
        return f"must be a {name}", f"write {name}(...) here"
    if kind == "too_short":
        least = ctx.get("min_length")
        return f"must have at least {least} item(s)", f"give {leaf} at least {least} item(s)"
    if kind in ("too_long", "string_too_long"):
        most = ctx.get("max_length")
        return f"is longer than {most}", f"shorten {leaf} to at most {most}"
    return detail["msg"], f"see docs/inventory.md for {leaf}"
