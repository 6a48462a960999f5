"""A half_plus_two version that is slow at serving time (test equipment).

The testbed's models (docs/models.md) are all fast at serving time; the slow one
(half_plus_two_bad/13) is slow only while it warms up. This one answers every Predict of
``serving_default`` with y = 0.5 x + b after a fixed sleep inside the graph (a tf.data sleep,
so it costs no CPU on the shared machine): with batching, every batch waits about twice
``sleep_ms`` (the sleep applies to each element fetch, and the end-of-data check is one).
``times_two`` (y = 2 x) is fast, as in half_plus_two, whose golden requests use both. Its
warmup file holds the first of a good version's warmup records: the server replays each record
at load, through the slow signature (about 2 x ``sleep_ms`` each), so one record keeps the load
short while still warming up the way a good version does.

Run with the project's venv: ``python tests/accept/slowmodel.py OUT_DIR B SLEEP_MS WARMUP_FROM``.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path


def save(out: Path, b: float, sleep_ms: int, warmup_from: Path) -> None:
    """Write the SavedModel to ``out`` (which must not exist)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf
    from tensorflow.python.data.experimental.ops import testing

    module = tf.Module()
    module.a = tf.Variable(0.5, name="a")
    module.b = tf.Variable(b, name="b")

    def serve(x: tf.Tensor) -> dict[str, tf.Tensor]:
        y = module.a * x + module.b
        slow = tf.data.Dataset.from_tensors(y).apply(testing.sleep(sleep_ms * 1000))
        return {"y": slow.get_single_element()}

    def times_two(x: tf.Tensor) -> dict[str, tf.Tensor]:
        return {"y": 2.0 * x}

    spec = [tf.TensorSpec([None, 1], tf.float32, name="x")]
    tf.saved_model.save(module, str(out), signatures={
        "serving_default": tf.function(serve, input_signature=spec),
        "times_two": tf.function(times_two, input_signature=spec)})
    shutil.copytree(warmup_from / "assets.extra", out / "assets.extra")
    records = out / "assets.extra" / "tf_serving_warmup_requests"
    first = next(iter(tf.data.TFRecordDataset(str(records)).take(1))).numpy()
    with tf.io.TFRecordWriter(str(records)) as writer:
        writer.write(first)


if __name__ == "__main__":
    save(Path(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]))
