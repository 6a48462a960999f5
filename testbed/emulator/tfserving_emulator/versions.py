"""Which version directories a model's policy asks for (file_system_storage_path_source.cc).

Children of the base path whose names parse as int64 are versions (``00000123`` is 123; ``v1``
is ignored; of ``1`` and ``01`` the server loads ``1``, the later name in sorted order).
``latest`` takes the top N (default 1; 0 means 1), ``all`` takes every one, ``specific`` takes
the listed ones that exist. A base path that cannot be listed fails the poll.
"""

from __future__ import annotations

import os
import re

from tensorflow_serving.config import model_server_config_pb2

from . import log
from .status import invalid_argument

_INT64 = re.compile(r"\s*[+-]?\d+\s*")
_WHERE = "file_system_storage_path_source.cc"


def parse_version(name: str) -> int | None:
    """absl::SimpleAtoi<int64>: the version number of a child name, or None."""
    if not _INT64.fullmatch(name):
        return None
    value = int(name)
    return value if -(2**63) <= value < 2**63 else None


def _children_by_version(name: str, base_path: str) -> dict[int, str]:
    """IndexChildrenByVersion: children in sorted order (a std::set), the last of two names that
    parse to the same number wins (``1`` over ``01``)."""
    try:
        children = sorted(os.listdir(base_path))
    except OSError as exc:
        raise invalid_argument(
            f"Could not find base path {base_path} for servable {name} with error "
            f"NOT_FOUND: {base_path} not found ({exc.strerror})") from exc
    found: dict[int, str] = {}
    for child in children:
        version = parse_version(child)
        if version is None:
            continue
        if version in found:
            log.warning(f"{_WHERE}:129",
                        f"Duplicate version directories detected. Version {version} will be "
                        f"loaded from {child}, {found[version]} will be ignored.")
        found[version] = child
    return found


def aspired_versions(config: model_server_config_pb2.ModelConfig) -> dict[int, str]:
    """Version -> path that the model's version policy aspires to, right now."""
    found = _children_by_version(config.name, config.base_path)
    policy = config.model_version_policy
    choice = policy.WhichOneof("policy_choice")
    if choice == "all":
        chosen = sorted(found)
    elif choice == "specific":
        wanted = list(policy.specific.versions)
        if not wanted:
            log.warning(_WHERE, f"No specific versions requested for servable {config.name}.")
        for version in wanted:
            if version not in found:
                log.warning(f"{_WHERE}:238",
                            f"Version {version} of servable {config.name}, which was requested "
                            "to be served as a 'specific' version in the servable's version "
                            "policy, was not found in the file system")
        chosen = [v for v in sorted(found) if v in set(wanted)]
    else:
        count = policy.latest.num_versions if choice == "latest" else 1
        chosen = sorted(found)[-max(1, count):] if found else []
    if not found:
        log.warning(f"{_WHERE}:314",
                    f"No versions of servable {config.name} found under base path "
                    f"{config.base_path}. Did you forget to name your leaf directory as a "
                    "number (eg. '/1/')?")
    return {v: os.path.join(config.base_path, found[v]) for v in chosen}
