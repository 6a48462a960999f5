"""The private protobuf pool of TFServing's messages is one per process, whichever thread asks
first: a run gates its hosts in parallel, and a message built from another pool's classes is
refused ("Parameter to CopyFrom() must be instance of same class")."""

from __future__ import annotations

import importlib.util
import threading
from typing import Any


def _fresh_copy() -> Any:
    """A copy of the module with nothing built yet, as in a new fab process (not the one in
    sys.modules, which the other tests use)."""
    spec = importlib.util.find_spec("tfsdeploy.core.tfserving.api")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_threads_asking_at_once_get_the_same_classes_and_can_mix_their_messages() -> None:
    fresh = _fresh_copy()
    names = ("tensorflow.TensorProto", "tensorflow.serving.PredictRequest")
    start = threading.Barrier(8)
    seen: list[tuple[Any, ...]] = []
    errors: list[BaseException] = []

    def ask() -> None:
        start.wait()
        try:
            seen.append(tuple(fresh.message_class(n) for n in names))
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert len(set(seen)) == 1, f"{len(set(seen))} sets of classes for one process"
    tensor_class, request_class = seen[0]
    request = request_class()
    request.inputs["x"].CopyFrom(tensor_class(dtype=fresh.dtype_value("DT_FLOAT")))
    assert request.inputs["x"].dtype == fresh.dtype_value("DT_FLOAT")
