"""Hostile host-side records: whatever a host answers (container labels, manifests, the lock
file, the current link, the proxy's stats), reading it never raises, and nothing unsafe comes
out of it: every release id the toolkit will use in a path is one it makes, and a broken record
is reported, never silently dropped nor allowed to hide the others."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tfsdeploy.core.inventory.layout import is_release_id
from tfsdeploy.core.rollout.records import parse_audit, parse_lock
from tfsdeploy.hosts.commands.files import UnsafePath, remove_tree
from tfsdeploy.hosts.dockerapi import container_fact
from tfsdeploy.hosts.facts import parse_facts
from tfsdeploy.run.operations.finalize import protected_releases

GOOD_ID = st.builds(lambda d, t, v: f"r{d:08d}-{t:09d}-v{v}",
                    st.integers(20200101, 20991231), st.integers(0, 235959999),
                    st.integers(1, 10**6))
HOSTILE_TEXT = st.one_of(
    st.text(max_size=40),
    st.sampled_from(["../../../../etc", "/etc/passwd", "..", ".", "", "r1/../..",
                     "r20261130-220605818-v1/../../x", "\x00", "a\nb", "$(reboot)", "*"]))
ID = st.one_of(GOOD_ID, HOSTILE_TEXT)
JSONISH = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() |
                       st.text(max_size=20),
                       lambda inner: st.lists(inner, max_size=3) |
                       st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=8)


@st.composite
def manifests(draw: Any) -> tuple[str, str]:
    """(path, text) of a release record as a host might hold it."""
    release = draw(ID)
    record = {"id": draw(st.one_of(st.just(release), ID)), "model": "m",
              "version": draw(st.one_of(st.integers(-3, 9), st.text(max_size=3))),
              "image": draw(st.text(max_size=10)), "slot": draw(st.sampled_from(
                  ["blue", "green", "", "x"])),
              "status": draw(st.sampled_from(["serving", "failed", "rolled_back", "starting",
                                              "bogus", ""])),
              "previous": draw(st.one_of(st.none(), ID))}
    extra = draw(st.dictionaries(st.text(max_size=8), JSONISH, max_size=3))
    text = json.dumps({**record, **extra})
    cut = draw(st.integers(0, len(text)))
    text = draw(st.sampled_from([text, text[:cut], "", "null", "[]", "{", text + "garbage"]))
    return f"/srv/tfsdeploy/m/releases/{release}/manifest.json", text


def stat_rows(draw: Any) -> str:
    rows = ["# pxname,svname,scur,status,weight"]
    for _ in range(draw(st.integers(0, 6))):
        rows.append(",".join([draw(st.sampled_from(["grpc", "rest", "stats", ""])),
                              draw(st.sampled_from(["i0-blue", "i0-green", "i1-blue", "blue",
                                                    "i-x", "i9999999-green"])),
                              draw(st.sampled_from(["0", "3", "-1", "x", ""])),
                              draw(st.sampled_from(["UP", "DRAIN", "MAINT", "no check", ""])),
                              draw(st.sampled_from(["1", "0", "256", "x"]))]))
    return "\n".join(rows)


@st.composite
def facts_outputs(draw: Any) -> str:
    """The facts command's output as a (possibly hostile or damaged) host might print it."""
    parts = ["@@current", draw(st.one_of(st.just("releases/") .map(str) , ID.map(
        lambda r: f"releases/{r}")))]
    for path, text in draw(st.lists(manifests(), max_size=5)):
        parts += [f"@@record {path}", text]
    parts += ["@@live", draw(st.text(max_size=30)), "@@lock",
              draw(st.one_of(st.text(max_size=30), st.just(json.dumps(
                  {"token": "ab" * 8, "who": "x", "machine": "m", "pid": 1,
                   "started": "t", "command": "c"})))),
              "@@versions", draw(st.text(max_size=30)), "@@disk", draw(st.text(max_size=30)),
              "@@gpus", draw(st.text(max_size=30)), "@@listen", draw(st.text(max_size=30)),
              "@@proxy", stat_rows(draw), "@@boot", draw(st.text(max_size=40)),
              "@@proxycfg", draw(st.one_of(st.text(max_size=60), st.just(
                  "  server i0-blue 127.0.0.1:8510 proto h2 weight 100 disabled"))),
              "@@tools", "socat flock", "@@end"]
    return "\n".join(parts)


@st.composite
def containers(draw: Any) -> list[Any]:
    found = []
    for _ in range(draw(st.integers(0, 4))):
        labels = {"tfsdeploy.model": "m", "tfsdeploy.release": draw(ID),
                  "tfsdeploy.slot": draw(st.sampled_from(["blue", "green", "", "x"])),
                  "tfsdeploy.version": draw(st.sampled_from(["1", "x", "", "-1"])),
                  "tfsdeploy.instance": draw(st.sampled_from(["0", "1", "x"]))}
        if draw(st.booleans()):
            labels = {"tfsdeploy.core.render.host_proxy": "m", "tfsdeploy.role": "proxy"}
        fact = container_fact({"Names": [f"/c{len(found)}"], "Labels": labels,
                               "State": draw(st.sampled_from(["running", "exited", ""])),
                               "Status": "Up", "Image": "img"})
        if fact is not None:
            found.append(fact)
    return found


@settings(max_examples=600)
@given(facts_outputs(), containers())
def test_reading_a_hostile_host_never_raises_and_keeps_only_safe_ids(text: str,
                                                                     found: list[Any]) -> None:
    facts = parse_facts("h", text, found)
    for record in facts.releases:
        assert is_release_id(record.id)
        assert record.previous is None or is_release_id(record.previous)
    for container in facts.servers:
        assert is_release_id(container.release)
    assert facts.current is None or is_release_id(facts.current)
    ids = {r.id for r in facts.releases} | {c.release for c in facts.servers}
    for release in ids:  # every id read back can be removed safely, inside the data root
        remove_tree(f"/srv/tfsdeploy/m/releases/{release}", root="/srv/tfsdeploy/m")
    records_in = text.count("@@record ")
    assert len(facts.releases) + len(facts.broken) == records_in
    facts.serving(0), facts.serving_release, facts.proxy.serving_slot(0)
    # what prune protects is named by safe ids only; a boot id is a boot id or unknown
    assert all(is_release_id(r) for r in protected_releases(facts))
    assert facts.boot_id == "" or len(facts.boot_id) == 36
    assert all(len(d) == 64 for d in facts.versions.values() if d)


@settings(max_examples=200)
@given(st.text(max_size=200))
def test_lock_and_audit_text_never_raise(text: str) -> None:
    parse_lock(text)
    entries = parse_audit(text)
    assert all(e.event for e in entries)


@settings(max_examples=200)
@given(HOSTILE_TEXT)
def hostile_name(outcomes: Counter[str], name: str) -> None:
    """One generated release name removed under the root, counted in ``outcomes``."""
    path = f"/srv/tfsdeploy/m/releases/{name}"
    try:
        checked = remove_tree(path, root="/srv/tfsdeploy/m/releases")
    except UnsafePath:
        outcomes["refused"] += 1
        return
    outcomes["removed"] += 1
    assert checked[-1].startswith("/srv/tfsdeploy/m/releases/")
    assert ".." not in checked[-1].split("/")


def test_a_hostile_name_never_leaves_the_root() -> None:
    outcomes: Counter[str] = Counter()
    hostile_name(outcomes)
    # the early return is the refusal: the battery must reach the check of what it removes
    # (about 190 of 200 cases do; 8-10 are refused)
    assert outcomes["removed"] > outcomes["refused"], outcomes
