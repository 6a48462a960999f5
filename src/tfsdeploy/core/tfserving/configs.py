"""TFServing's config messages: the root message of each file the toolkit renders.

From the toolkit's own definitions (``definitions.py``, the same private pool as the API
messages), so that ``text_format`` rejects exactly what ``TextFormat::ParseFromString`` in the
server rejects: unknown fields, JSON, and ``max_batch_size: 8`` where the wrapper form
``max_batch_size { value: 8 }`` is required. No TensorFlow on this path.
"""

from __future__ import annotations

from google.protobuf.message import Message

from tfsdeploy.core.tfserving.api import message_class

# --model_config_file
ModelServerConfig: type[Message] = message_class("tensorflow.serving.ModelServerConfig")
# --batching_parameters_file
BatchingParameters: type[Message] = message_class("tensorflow.serving.BatchingParameters")
# --monitoring_config_file
PrometheusConfig: type[Message] = message_class("tensorflow.serving.PrometheusConfig")
MonitoringConfig: type[Message] = message_class("tensorflow.serving.MonitoringConfig")
# --platform_config_file
PlatformConfigMap: type[Message] = message_class("tensorflow.serving.PlatformConfigMap")
