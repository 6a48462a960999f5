"""A TFServing-compatible model server for tests and demos ("the emulator").

It behaves like ``tensorflow_model_server`` wherever a deploy toolkit depends on it: flags,
text-proto config files, version policies and states, labels, gRPC and REST APIs, warmup,
batching limits, Prometheus metric names, start-up and shutdown behaviour, and GPU memory on
a simulated GPU. It loads real SavedModels with TensorFlow. See docs/emulator.md.
"""

SERVING_VERSION = "2.21.0"
