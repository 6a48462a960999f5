"""The TFServing and TensorFlow messages the toolkit uses, declared from their wire facts.

Each entry gives what decides the wire and the text format of a message: field names, numbers,
types, labels (repeated, proto3 ``optional``), oneofs, maps, enum values and reserved numbers,
under the .proto file and package that declare it upstream (so that the full names, the type
URLs of ``google.protobuf.Any`` and the text format are TFServing's own). Facts of TFServing
2.21 (tensorflow-serving-api 2.21.0 and the TensorFlow 2.21 protos it imports); the two config
files that no wheel ships (batching and monitoring) from TFServing's sources at 9d981c5.

What is declared: everything reachable from the messages the toolkit renders, parses, sends
or reads (ModelServerConfig, PlatformConfigMap, BatchingParameters, MonitoringConfig,
PredictRequest/Response, GetModelStatus*, GetModelMetadata*, SignatureDefMap, PredictionLog),
complete, so that a file or a message TFServing accepts parses here and one it rejects fails
here. One cut, listed in ``TRIMMED``: the log kinds of PredictionLog other than Predict's, whose
messages (classification, regression, multi-inference, session run) reach most of TensorFlow's
config protos; a warmup record of those kinds parses with the kind kept as unknown bytes.

``tests/loadtest/test_protos.py`` compares every message here with tensorflow-serving-api's
own descriptors where TensorFlow is installed, and renders and parses the same files and
messages both ways.
"""

from __future__ import annotations

from tfsdeploy.core.tfserving.schema import (
    File,
    enum,
    f,
    mapf,
    msg,
    oneof,
    opt,
    packed,
    proto_file,
    rep,
    reserved,
)

TF = "tensorflow"
SERVING = "tensorflow.serving"
ERROR = "tensorflow.error"
_INT64 = ".google.protobuf.Int64Value"
_ANY = ".google.protobuf.Any"
_TENSOR = ".tensorflow.TensorProto"
_POLICY = "FileSystemStoragePathSourceConfig.ServableVersionPolicy"
_OPTIONS = "PredictRequest.RequestOptions"

# message full name -> the upstream fields deliberately left out (see the docstring)
TRIMMED: dict[str, frozenset[str]] = {
    "tensorflow.serving.PredictionLog": frozenset(
        {"classify_log", "regress_log", "multi_inference_log", "session_run_log"}),
}

FILES: tuple[File, ...] = (
    proto_file(
        "xla/tsl/protobuf/error_codes.proto", ERROR,
        enum("Code", "OK=0 CANCELLED=1 UNKNOWN=2 INVALID_ARGUMENT=3 DEADLINE_EXCEEDED=4 "
             "NOT_FOUND=5 ALREADY_EXISTS=6 PERMISSION_DENIED=7 UNAUTHENTICATED=16 "
             "RESOURCE_EXHAUSTED=8 FAILED_PRECONDITION=9 ABORTED=10 OUT_OF_RANGE=11 "
             "UNIMPLEMENTED=12 INTERNAL=13 UNAVAILABLE=14 DATA_LOSS=15 "
             "DO_NOT_USE_RESERVED_FOR_FUTURE_EXPANSION_USE_DEFAULT_IN_SWITCH_INSTEAD_=20")),
    proto_file(
        "tensorflow/core/framework/types.proto", TF,
        enum("DataType", "DT_INVALID=0 DT_FLOAT=1 DT_DOUBLE=2 DT_INT32=3 DT_UINT8=4 "
             "DT_INT16=5 DT_INT8=6 DT_STRING=7 DT_COMPLEX64=8 DT_INT64=9 DT_BOOL=10 "
             "DT_QINT8=11 DT_QUINT8=12 DT_QINT32=13 DT_BFLOAT16=14 DT_QINT16=15 "
             "DT_QUINT16=16 DT_UINT16=17 DT_COMPLEX128=18 DT_HALF=19 DT_RESOURCE=20 "
             "DT_VARIANT=21 DT_UINT32=22 DT_UINT64=23 DT_FLOAT8_E5M2=24 DT_FLOAT8_E4M3FN=25 "
             "DT_FLOAT8_E4M3FNUZ=26 DT_FLOAT8_E4M3B11FNUZ=27 DT_FLOAT8_E5M2FNUZ=28 "
             "DT_INT4=29 DT_UINT4=30 DT_INT2=31 DT_UINT2=32 DT_FLOAT4_E2M1FN=33 "
             "DT_FLOAT_REF=101 DT_DOUBLE_REF=102 DT_INT32_REF=103 DT_UINT8_REF=104 "
             "DT_INT16_REF=105 DT_INT8_REF=106 DT_STRING_REF=107 DT_COMPLEX64_REF=108 "
             "DT_INT64_REF=109 DT_BOOL_REF=110 DT_QINT8_REF=111 DT_QUINT8_REF=112 "
             "DT_QINT32_REF=113 DT_BFLOAT16_REF=114 DT_QINT16_REF=115 DT_QUINT16_REF=116 "
             "DT_UINT16_REF=117 DT_COMPLEX128_REF=118 DT_HALF_REF=119 DT_RESOURCE_REF=120 "
             "DT_VARIANT_REF=121 DT_UINT32_REF=122 DT_UINT64_REF=123 DT_FLOAT8_E5M2_REF=124 "
             "DT_FLOAT8_E4M3FN_REF=125 DT_FLOAT8_E4M3FNUZ_REF=126 "
             "DT_FLOAT8_E4M3B11FNUZ_REF=127 DT_FLOAT8_E5M2FNUZ_REF=128 DT_INT4_REF=129 "
             "DT_UINT4_REF=130 DT_INT2_REF=131 DT_UINT2_REF=132 DT_FLOAT4_E2M1FN_REF=133")),
    proto_file(
        "tensorflow/core/framework/tensor_shape.proto", TF,
        msg("TensorShapeProto",
            rep("dim", 2, "TensorShapeProto.Dim"),
            f("unknown_rank", 3, "bool"),
            msg("Dim", f("size", 1, "int64"), f("name", 2, "string")))),
    proto_file(
        "tensorflow/core/framework/resource_handle.proto", TF,
        msg("ResourceHandleProto",
            f("device", 1, "string"),
            f("container", 2, "string"),
            f("name", 3, "string"),
            f("hash_code", 4, "uint64"),
            f("maybe_type_name", 5, "string"),
            rep("dtypes_and_shapes", 6, "ResourceHandleProto.DtypeAndShape"),
            msg("DtypeAndShape", f("dtype", 1, "DataType"), f("shape", 2, "TensorShapeProto")),
            reserved((7, 8)))),
    proto_file(
        "tensorflow/core/framework/tensor.proto", TF,
        msg("TensorProto",
            f("dtype", 1, "DataType"),
            f("tensor_shape", 2, "TensorShapeProto"),
            f("version_number", 3, "int32"),
            f("tensor_content", 4, "bytes"),
            packed("half_val", 13, "int32"),
            packed("float_val", 5, "float"),
            packed("double_val", 6, "double"),
            packed("int_val", 7, "int32"),
            rep("string_val", 8, "bytes"),
            packed("scomplex_val", 9, "float"),
            packed("int64_val", 10, "int64"),
            packed("bool_val", 11, "bool"),
            packed("dcomplex_val", 12, "double"),
            rep("resource_handle_val", 14, "ResourceHandleProto"),
            rep("variant_val", 15, "VariantTensorDataProto"),
            packed("uint32_val", 16, "uint32"),
            packed("uint64_val", 17, "uint64"),
            f("float8_val", 18, "bytes")),
        msg("VariantTensorDataProto",
            f("type_name", 1, "string"),
            f("metadata", 2, "bytes"),
            rep("tensors", 3, "TensorProto"))),
    proto_file(
        "tensorflow/core/protobuf/struct.proto", TF,
        msg("StructuredValue",
            oneof("kind",
                  f("none_value", 1, "NoneValue"),
                  f("float64_value", 11, "double"),
                  f("int64_value", 12, "sint64"),
                  f("string_value", 13, "string"),
                  f("bool_value", 14, "bool"),
                  f("tensor_shape_value", 31, "TensorShapeProto"),
                  f("tensor_dtype_value", 32, "DataType"),
                  f("tensor_spec_value", 33, "TensorSpecProto"),
                  f("type_spec_value", 34, "TypeSpecProto"),
                  f("bounded_tensor_spec_value", 35, "BoundedTensorSpecProto"),
                  f("list_value", 51, "ListValue"),
                  f("tuple_value", 52, "TupleValue"),
                  f("dict_value", 53, "DictValue"),
                  f("named_tuple_value", 54, "NamedTupleValue"),
                  f("tensor_value", 55, "TensorProto"),
                  f("numpy_value", 56, "TensorProto"))),
        msg("NoneValue"),
        msg("ListValue", rep("values", 1, "StructuredValue")),
        msg("TupleValue", rep("values", 1, "StructuredValue")),
        msg("DictValue", mapf("fields", 1, "string", "StructuredValue")),
        msg("PairValue", f("key", 1, "string"), f("value", 2, "StructuredValue")),
        msg("NamedTupleValue", f("name", 1, "string"), rep("values", 2, "PairValue")),
        msg("TensorSpecProto",
            f("name", 1, "string"),
            f("shape", 2, "TensorShapeProto"),
            f("dtype", 3, "DataType")),
        msg("BoundedTensorSpecProto",
            f("name", 1, "string"),
            f("shape", 2, "TensorShapeProto"),
            f("dtype", 3, "DataType"),
            f("minimum", 4, "TensorProto"),
            f("maximum", 5, "TensorProto")),
        msg("TypeSpecProto",
            f("type_spec_class", 1, "TypeSpecProto.TypeSpecClass"),
            f("type_state", 2, "StructuredValue"),
            f("type_spec_class_name", 3, "string"),
            f("num_flat_components", 4, "int32"),
            enum("TypeSpecClass", "UNKNOWN=0 SPARSE_TENSOR_SPEC=1 INDEXED_SLICES_SPEC=2 "
                 "RAGGED_TENSOR_SPEC=3 TENSOR_ARRAY_SPEC=4 DATA_DATASET_SPEC=5 "
                 "DATA_ITERATOR_SPEC=6 OPTIONAL_SPEC=7 PER_REPLICA_SPEC=8 VARIABLE_SPEC=9 "
                 "ROW_PARTITION_SPEC=10 REGISTERED_TYPE_SPEC=12 EXTENSION_TYPE_SPEC=13"))),
    proto_file(
        "tensorflow/core/protobuf/meta_graph.proto", TF,
        msg("TensorInfo",
            oneof("encoding",
                  f("name", 1, "string"),
                  f("coo_sparse", 4, "TensorInfo.CooSparse"),
                  f("composite_tensor", 5, "TensorInfo.CompositeTensor")),
            f("dtype", 2, "DataType"),
            f("tensor_shape", 3, "TensorShapeProto"),
            msg("CooSparse",
                f("values_tensor_name", 1, "string"),
                f("indices_tensor_name", 2, "string"),
                f("dense_shape_tensor_name", 3, "string")),
            msg("CompositeTensor",
                f("type_spec", 1, "TypeSpecProto"),
                rep("components", 2, "TensorInfo"))),
        msg("SignatureDef",
            mapf("inputs", 1, "string", "TensorInfo"),
            mapf("outputs", 2, "string", "TensorInfo"),
            f("method_name", 3, "string"),
            mapf("defaults", 4, "string", "TensorProto"))),
    proto_file(
        "tensorflow_serving/apis/model.proto", SERVING,
        msg("ModelSpec",
            f("name", 1, "string"),
            oneof("version_choice",
                  f("version", 2, _INT64),
                  f("version_label", 4, "string")),
            f("signature_name", 3, "string"))),
    proto_file(
        "tensorflow_serving/apis/status.proto", SERVING,
        msg("StatusProto",
            f("error_code", 1, ".tensorflow.error.Code"),
            f("error_message", 2, "string"))),
    proto_file(
        "tensorflow_serving/apis/predict.proto", SERVING,
        msg("PredictRequest",
            f("model_spec", 1, "ModelSpec"),
            mapf("inputs", 2, "string", _TENSOR),
            rep("output_filter", 3, "string"),
            f("predict_streamed_options", 5, "PredictStreamedOptions"),
            opt("client_id", 6, "bytes"),
            opt("request_options", 7, _OPTIONS),
            msg("RequestOptions",
                opt("client_id", 1, "bytes"),
                opt("deterministic_mode", 2, f"{_OPTIONS}.DeterministicMode"),
                opt("return_additional_arrays_from_prefill", 3, "bool"),
                rep("return_stoptokens", 4, "int64"),
                opt("return_all_stoptokens", 9, "bool"),
                opt("max_cache_length", 6, "int64"),
                opt("handshake", 13, f"{_OPTIONS}.Handshake"),
                msg("Handshake", f("estimated_payload_bytes", 1, "int64")),
                enum("DeterministicMode", "DETERMINISTIC_MODE_UNSPECIFIED=0 FIXED_DECODER_SLOT=1")),
            reserved((4, 5))),
        msg("PredictStreamedOptions",
            f("request_state", 1, "PredictStreamedOptions.RequestState"),
            mapf("split_dimensions", 2, "string", "int32"),
            f("return_single_response", 3, "bool"),
            enum("RequestState", "NONE=0 SPLIT=1 END_SPLIT=2 CANCEL=3")),
        msg("PredictResponse",
            f("model_spec", 2, "ModelSpec"),
            mapf("outputs", 1, "string", _TENSOR))),
    proto_file(
        "tensorflow_serving/apis/get_model_status.proto", SERVING,
        msg("GetModelStatusRequest", f("model_spec", 1, "ModelSpec")),
        msg("ModelVersionStatus",
            f("version", 1, "int64"),
            f("state", 2, "ModelVersionStatus.State"),
            f("status", 3, "StatusProto"),
            enum("State", "UNKNOWN=0 START=10 LOADING=20 AVAILABLE=30 UNLOADING=40 END=50")),
        msg("GetModelStatusResponse", rep("model_version_status", 1, "ModelVersionStatus"))),
    proto_file(
        "tensorflow_serving/apis/get_model_metadata.proto", SERVING,
        msg("SignatureDefMap", mapf("signature_def", 1, "string", ".tensorflow.SignatureDef")),
        msg("GetModelMetadataRequest",
            f("model_spec", 1, "ModelSpec"),
            rep("metadata_field", 2, "string")),
        msg("GetModelMetadataResponse",
            f("model_spec", 1, "ModelSpec"),
            mapf("metadata", 2, "string", _ANY))),
    proto_file(
        "tensorflow_serving/config/log_collector_config.proto", SERVING,
        msg("LogCollectorConfig", f("type", 1, "string"), f("filename_prefix", 2, "string"))),
    proto_file(
        "tensorflow_serving/config/logging_config.proto", SERVING,
        msg("PerTaskSamplingConfig",
            f("dc", 1, "string"),
            opt("task_index", 2, "int32"),
            f("sampling_rate", 3, "double")),
        msg("SamplingConfig",
            f("sampling_rate", 1, "double"),
            rep("per_task_sampling_configs", 3, "PerTaskSamplingConfig"),
            f("attributes", 2, "int32"),
            enum("Attributes",
                 "ATTR_DEFAULT=0 ATTR_REQUEST_ORIGIN=1 ATTR_REQUEST_CRITICALITY=2")),
        msg("LoggingConfig",
            f("log_collector_config", 1, "LogCollectorConfig"),
            f("sampling_config", 2, "SamplingConfig"),
            f("custom_logging_config", 3, _ANY))),
    proto_file(
        "tensorflow_serving/apis/logging.proto", SERVING,
        msg("LogMetadata",
            f("model_spec", 1, "ModelSpec"),
            f("sampling_config", 2, "SamplingConfig"),
            rep("saved_model_tags", 3, "string"),
            f("timestamp_secs", 4, "int64"),
            f("dc", 5, "string"),
            f("request_origin", 6, "string"),
            f("request_criticality", 7, "string"),
            f("safe_aggregation_privacy_key", 8, "int64"))),
    proto_file(
        "tensorflow_serving/apis/prediction_log.proto", SERVING,
        msg("PredictLog", f("request", 1, "PredictRequest"), f("response", 2, "PredictResponse")),
        msg("PredictStreamedLog",
            rep("request", 1, "PredictRequest"),
            rep("response", 2, "PredictResponse")),
        msg("PredictionLog",
            f("log_metadata", 1, "LogMetadata"),
            oneof("log_type",  # classify 2, regress 3, multi-inference 4, session run 5: TRIMMED
                  f("predict_log", 6, "PredictLog"),
                  f("predict_streamed_log", 7, "PredictStreamedLog")))),
    proto_file(
        "tensorflow_serving/config/file_system_storage_path_source.proto", SERVING,
        msg("FileSystemStoragePathSourceConfig",
            rep("servables", 5, "FileSystemStoragePathSourceConfig.ServableToMonitor"),
            f("file_system_poll_wait_seconds", 3, "int64"),
            f("fail_if_zero_versions_at_startup", 4, "bool"),
            f("servable_versions_always_present", 6, "bool"),
            msg("ServableVersionPolicy",
                oneof("policy_choice",
                      f("latest", 100, f"{_POLICY}.Latest"),
                      f("all", 101, f"{_POLICY}.All"),
                      f("specific", 102, f"{_POLICY}.Specific")),
                msg("Latest", f("num_versions", 1, "uint32")),
                msg("All"),
                msg("Specific", rep("versions", 1, "int64"))),
            msg("ServableToMonitor",
                f("servable_name", 1, "string"),
                f("base_path", 2, "string"),
                f("servable_version_policy", 4, _POLICY),
                reserved((3, 4))),
            reserved((1, 2), (2, 3)))),
    proto_file(
        "tensorflow_serving/config/model_server_config.proto", SERVING,
        msg("ModelConfig",
            f("name", 1, "string"),
            f("base_path", 2, "string"),
            f("model_type", 3, "ModelType"),
            f("model_platform", 4, "string"),
            f("model_version_policy", 7, _POLICY),
            mapf("version_labels", 8, "string", "int64"),
            f("logging_config", 6, "LoggingConfig"),
            reserved((5, 6), (9, 10))),
        msg("ModelConfigList", rep("config", 1, "ModelConfig")),
        msg("ModelServerConfig",
            oneof("config",
                  f("model_config_list", 1, "ModelConfigList"),
                  f("custom_model_config", 2, _ANY))),
        enum("ModelType", "MODEL_TYPE_UNSPECIFIED=0 TENSORFLOW=1 OTHER=2")),
    proto_file(
        "tensorflow_serving/config/platform_config.proto", SERVING,
        msg("PlatformConfig", f("source_adapter_config", 1, _ANY)),
        msg("PlatformConfigMap", mapf("platform_configs", 1, "string", "PlatformConfig"))),
    # not in any wheel: TFServing @9d981c5 session_bundle_config.proto lines 149-203 (the
    # file's other messages need TensorFlow's ConfigProto and are not used here)
    proto_file(
        "tensorflow_serving/servables/tensorflow/session_bundle_config.proto", SERVING,
        msg("BatchingParameters",
            f("max_batch_size", 1, _INT64),
            f("batch_timeout_micros", 2, _INT64),
            f("max_enqueued_batches", 3, _INT64),
            f("num_batch_threads", 4, _INT64),
            f("thread_pool_name", 5, ".google.protobuf.StringValue"),
            f("enable_large_batch_splitting", 8, ".google.protobuf.BoolValue"),
            f("max_execution_batch_size", 9, _INT64),
            rep("allowed_batch_sizes", 6, "int64"),
            f("pad_variable_length_inputs", 7, "bool"))),
    # not in any wheel: TFServing @9d981c5 config/monitoring_config.proto
    proto_file(
        "tensorflow_serving/config/monitoring_config.proto", SERVING,
        msg("PrometheusConfig", f("enable", 1, "bool"), f("path", 2, "string")),
        msg("MonitoringConfig", f("prometheus_config", 1, "PrometheusConfig"))),
)
