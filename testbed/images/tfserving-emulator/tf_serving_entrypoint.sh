#!/bin/bash
# Fallback used only while testbed/emulator/ ships no tf_serving_entrypoint.sh of its own;
# the same as tensorflow/serving's: flags after the image name are appended (last one wins).
set -e
exec tensorflow_model_server --port=8500 --rest_api_port=8501 \
  --model_name="${MODEL_NAME}" --model_base_path="${MODEL_BASE_PATH}/${MODEL_NAME}" "$@"
