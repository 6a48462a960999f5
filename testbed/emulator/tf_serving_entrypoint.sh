#!/bin/bash
# Same behaviour as tensorflow/serving's /usr/bin/tf_serving_entrypoint.sh: no exec, so bash
# stays PID 1 and SIGTERM from `docker stop` never reaches the server.

tensorflow_model_server --port=8500 --rest_api_port=8501 --model_name=${MODEL_NAME} --model_base_path=${MODEL_BASE_PATH}/${MODEL_NAME} "$@"
