"""TFServing's messages and file formats without TensorFlow: API messages, config messages,
TFRecord framing, warmup records, golden requests (pure)."""
