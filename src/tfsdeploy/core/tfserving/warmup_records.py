"""A SavedModel's warmup records (``assets.extra/tf_serving_warmup_requests``, TFRecord of
``PredictionLog``): the Predict requests they hold, read without TensorFlow. The load
generator sends them, the canary comparison samples them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from google.protobuf.message import DecodeError, Message

from tfsdeploy.core.tfserving import api as tfsapi
from tfsdeploy.core.tfserving.tfrecord import read_records

WARMUP_RELATIVE = Path("assets.extra") / "tf_serving_warmup_requests"


class WarmupError(ValueError):
    """A warmup file that is missing, unreadable or holds no Predict request."""


def warmup_file(path: Path) -> Path:
    """The warmup TFRecord of a SavedModel directory, or ``path`` itself if it is a file."""
    return path if path.is_file() else path / WARMUP_RELATIVE


def requests_from_warmup(path: Path) -> list[Message]:
    """The Predict requests recorded in a SavedModel's warmup file (other kinds skipped)."""
    file = warmup_file(path)
    if not file.is_file():
        raise WarmupError(f"no warmup records at {file}")
    log_class = tfsapi.message_class(tfsapi.PREDICTION_LOG)
    requests = []
    try:
        for record in read_records(file):
            log: Any = log_class.FromString(record)
            if log.HasField("predict_log"):
                requests.append(log.predict_log.request)
    except (ValueError, DecodeError) as err:
        raise WarmupError(f"{file}: {err}") from err
    if not requests:
        raise WarmupError(f"{file}: no Predict requests among the warmup records")
    return requests
