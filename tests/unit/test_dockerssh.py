"""Pull progress folded from the engine's pull stream (tfsdeploy.hosts.dockerssh.advance): tables of
real event streams, and the properties every stream keeps."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from tfsdeploy.hosts.dockerssh import LayerPhase, PullProgress, PullState, advance

IMAGE = "10.87.0.1:5000/dockerssh-test-pull:1"
SMALL, BIG = 2097938, 6293523

# Recorded from Docker 20.10.24 on a testbed host pulling a two-layer image from the testbed
# registry (progress bars dropped; the engine sends them as text beside progressDetail).
FRESH_PULL: list[dict[str, Any]] = [
    {"status": "Pulling from dockerssh-test-pull", "id": "1"},
    {"status": "Pulling fs layer", "progressDetail": {}, "id": "9b5aef391941"},
    {"status": "Pulling fs layer", "progressDetail": {}, "id": "71948bd71e47"},
    {"status": "Downloading", "progressDetail": {"current": 32768, "total": SMALL},
     "id": "71948bd71e47"},
    {"status": "Downloading", "progressDetail": {"current": 69213, "total": BIG},
     "id": "9b5aef391941"},
    {"status": "Verifying Checksum", "progressDetail": {}, "id": "71948bd71e47"},
    {"status": "Download complete", "progressDetail": {}, "id": "71948bd71e47"},
    {"status": "Verifying Checksum", "progressDetail": {}, "id": "9b5aef391941"},
    {"status": "Download complete", "progressDetail": {}, "id": "9b5aef391941"},
    {"status": "Extracting", "progressDetail": {"current": 65536, "total": BIG},
     "id": "9b5aef391941"},
    {"status": "Extracting", "progressDetail": {"current": BIG, "total": BIG},
     "id": "9b5aef391941"},
    {"status": "Pull complete", "progressDetail": {}, "id": "9b5aef391941"},
    {"status": "Extracting", "progressDetail": {"current": 32768, "total": SMALL},
     "id": "71948bd71e47"},
    {"status": "Extracting", "progressDetail": {"current": SMALL, "total": SMALL},
     "id": "71948bd71e47"},
    {"status": "Pull complete", "progressDetail": {}, "id": "71948bd71e47"},
    {"status": "Digest: sha256:62f3748da65899de766ecc05e4625799ae491f21d63e0ed2756c1acbbcb3294b"},
    {"status": f"Status: Downloaded newer image for {IMAGE}"},
]

UP_TO_DATE: list[dict[str, Any]] = [
    {"status": "Pulling from dockerssh-test-pull", "id": "1"},
    {"status": "Digest: sha256:62f3748da65899de766ecc05e4625799ae491f21d63e0ed2756c1acbbcb3294b"},
    {"status": f"Status: Image is up to date for {IMAGE}"},
]


def fold(events: Sequence[dict[str, Any]]) -> tuple[PullState, list[PullProgress]]:
    state = PullState(image=IMAGE)
    seen = []
    for event in events:
        state = advance(state, event)
        seen.append(state.progress())
    return state, seen


def test_a_fresh_pull_ends_with_every_layer_and_byte() -> None:
    state, seen = fold(FRESH_PULL)
    last = seen[-1]
    assert (last.layers_done, last.layers_total) == (2, 2)
    assert last.bytes_done == last.bytes_total == last.bytes_extracted == SMALL + BIG
    assert last.status == f"Status: Downloaded newer image for {IMAGE}"
    assert last.layer is None
    assert {layer.phase for layer in state.layers.values()} == {LayerPhase.DONE}
    assert state.error is None


def test_a_fresh_pull_reports_progress_on_the_way() -> None:
    _, seen = fold(FRESH_PULL)
    figures = [(p.layers_done, p.layers_total, p.bytes_done, p.bytes_total) for p in seen]
    assert figures[:5] == [(0, 0, 0, 0), (0, 1, 0, 0), (0, 2, 0, 0),
                           (0, 2, 32768, SMALL), (0, 2, 32768 + 69213, SMALL + BIG)]
    # a layer downloaded in full counts its size even when its last Downloading line is partial
    assert figures[6] == (0, 2, SMALL + 69213, SMALL + BIG)
    assert seen[6].layer == "71948bd71e47" and seen[6].status == "Download complete"
    # extraction is reported apart from the download
    assert seen[9].bytes_extracted == 65536 and seen[9].bytes_done == SMALL + BIG
    assert [p.layers_done for p in seen[10:15]] == [0, 1, 1, 1, 2]


def test_layers_already_on_the_host_count_as_done_without_bytes() -> None:
    events: list[dict[str, Any]] = [
        {"status": "Pulling from tfserving-emulator", "id": "2.21.0"},
        {"status": "Already exists", "progressDetail": {}, "id": "aaaaaaaaaaaa"},
        {"status": "Pulling fs layer", "progressDetail": {}, "id": "bbbbbbbbbbbb"},
        {"status": "Downloading", "progressDetail": {"current": 100, "total": 400},
         "id": "bbbbbbbbbbbb"},
    ]
    _, seen = fold(events)
    assert (seen[1].layers_done, seen[1].layers_total, seen[1].bytes_total) == (1, 1, 0)
    assert (seen[-1].layers_done, seen[-1].layers_total) == (1, 2)
    assert (seen[-1].bytes_done, seen[-1].bytes_total) == (100, 400)


def test_an_image_up_to_date_has_no_layers_to_fetch() -> None:
    state, seen = fold(UP_TO_DATE)
    assert state.layers == {}
    assert (seen[-1].layers_done, seen[-1].layers_total, seen[-1].bytes_total) == (0, 0, 0)
    assert seen[-1].status.startswith("Status: Image is up to date")


def test_an_error_line_is_kept_with_its_message() -> None:
    state, _ = fold([
        {"status": "Pulling from dockerssh-test-pull", "id": "1"},
        {"errorDetail": {"message": "manifest unknown: manifest unknown"},
         "error": "manifest unknown: manifest unknown"},
    ])
    assert state.error == "manifest unknown: manifest unknown"
    state, _ = fold([{"error": "unauthorized"}])
    assert state.error == "unauthorized"


def test_a_retry_puts_the_layer_back_to_downloading() -> None:
    state, _ = fold([
        {"status": "Downloading", "progressDetail": {"current": 10, "total": 50}, "id": "c"},
        {"status": "Retrying in 5 seconds", "progressDetail": {}, "id": "c"},
    ])
    assert state.layers["c"].phase is LayerPhase.DOWNLOADING
    assert (state.layers["c"].downloaded, state.layers["c"].size) == (10, 50)


def test_progress_is_a_json_event() -> None:
    _, seen = fold(FRESH_PULL[:5])
    event = json.loads(json.dumps(seen[-1].as_event()))
    assert event == {"event": "image_pull", "image": IMAGE, "layer": "9b5aef391941",
                     "status": "Downloading", "layers_done": 0, "layers_total": 2,
                     "bytes_done": 32768 + 69213, "bytes_total": SMALL + BIG,
                     "bytes_extracted": 0}


STATUSES = ["Pulling fs layer", "Waiting", "Downloading", "Verifying Checksum",
            "Download complete", "Extracting", "Pull complete", "Already exists",
            "Retrying in 1 second", "Digest: sha256:00", "Pulling from x"]
EVENTS = st.fixed_dictionaries({
    "status": st.sampled_from(STATUSES),
    "id": st.sampled_from(["l1", "l2", "l3"]),
    "progressDetail": st.fixed_dictionaries({
        "current": st.integers(0, 1000), "total": st.integers(0, 1000)}),
})


@given(st.lists(EVENTS, max_size=40))
def test_a_finished_layer_stays_finished(events: list[dict[str, Any]]) -> None:
    _, seen = fold(events)
    done = [p.layers_done for p in seen]
    assert done == sorted(done)
    assert all(p.layers_done <= p.layers_total <= 3 for p in seen)


def test_the_progress_lines_say_a_finished_pull_once() -> None:
    import io

    from tfsdeploy.cli.output import LineReporter

    stream = io.StringIO()
    reporter = LineReporter(stream)
    for update in fold(FRESH_PULL)[1]:  # every event at once: only the end passes the 1 s bound
        reporter.progress("tb1", update)
    for update in fold(UP_TO_DATE)[1]:  # a later pull of it, as the engine streams it
        reporter.progress("tb1", update)
    lines = stream.getvalue().splitlines()
    assert sum("2/2 layers" in line for line in lines) == 1, lines
    assert [e["layers_done"] for e in reporter.events].count(2) == 1
    reporter.progress("tb2", fold(FRESH_PULL)[1][-1])  # another host's end is its own
    assert "tb2: pull" in stream.getvalue().splitlines()[-1]
