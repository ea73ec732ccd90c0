"""Reduced precision for the onnxruntime backend, chosen in the model config.

Two independent knobs:

* TensorRT execution provider flags. Triton's onnxruntime backend reads
  `gpu_execution_accelerator { name: "tensorrt" parameters { key: "precision_mode" value: "FP16" } }`
  and translates its own keys (`precision_mode`, `max_workspace_size_bytes`, ...) into the
  TensorRT EP's option names; `tensorrt_options` does the same, with Triton's error messages.
* Converted model files. `parameters { key: "precision" value { string_value: "fp16" | "int8" } }`
  makes the load convert the model (float16 weights and activations, or dynamic INT8
  quantization) with the tools in the onnxruntime wheel, into a cache outside the model repository
  keyed by the source file, and serve the converted file. Triton's backend ignores parameters it
  does not know, so the same config still loads there (at fp32).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

import onnxruntime as ort

from naiad.errors import InvalidArgument

log = logging.getLogger(__name__)

PRECISIONS = ("fp32", "fp16", "int8")
_TRT_PRECISIONS = {"FP32": {}, "FP16": {"trt_fp16_enable": "True"}, "INT8": {"trt_int8_enable": "True"}}
# Triton's key -> (the TensorRT EP's option, how the value is checked), from the table in
# triton-inference-server/onnxruntime_backend's README ("Parameter mapping").
_TRT_KEYS: dict[str, tuple[str, str]] = {
    "max_workspace_size_bytes": ("trt_max_workspace_size", "uint"),
    "trt_max_partition_iterations": ("trt_max_partition_iterations", "int"),
    "trt_min_subgraph_size": ("trt_min_subgraph_size", "int"),
    "int8_calibration_table_name": ("trt_int8_calibration_table_name", "str"),
    "int8_use_native_calibration_table": ("trt_int8_use_native_calibration_table", "bool"),
    "trt_dla_enable": ("trt_dla_enable", "bool"),
    "trt_dla_core": ("trt_dla_core", "int"),
    "trt_engine_cache_enable": ("trt_engine_cache_enable", "bool"),
    "trt_engine_cache_path": ("trt_engine_cache_path", "str"),
    "trt_engine_cache_prefix": ("trt_engine_cache_prefix", "str"),
    "trt_dump_subgraphs": ("trt_dump_subgraphs", "bool"),
    "trt_force_sequential_engine_build": ("trt_force_sequential_engine_build", "bool"),
    "trt_context_memory_sharing_enable": ("trt_context_memory_sharing_enable", "bool"),
    "trt_layer_norm_fp32_fallback": ("trt_layer_norm_fp32_fallback", "bool"),
    "trt_timing_cache_enable": ("trt_timing_cache_enable", "bool"),
    "trt_timing_cache_path": ("trt_timing_cache_path", "str"),
    "trt_force_timing_cache": ("trt_force_timing_cache", "bool"),
    "trt_detailed_build_log": ("trt_detailed_build_log", "bool"),
    "trt_build_heuristics_enable": ("trt_build_heuristics_enable", "bool"),
    "trt_sparsity_enable": ("trt_sparsity_enable", "bool"),
    "trt_builder_optimization_level": ("trt_builder_optimization_level", "int"),
    "trt_auxiliary_streams": ("trt_auxiliary_streams", "int"),
    "trt_tactic_sources": ("trt_tactic_sources", "str"),
    "trt_extra_plugin_lib_paths": ("trt_extra_plugin_lib_paths", "str"),
    "trt_profile_min_shapes": ("trt_profile_min_shapes", "str"),
    "trt_profile_max_shapes": ("trt_profile_max_shapes", "str"),
    "trt_profile_opt_shapes": ("trt_profile_opt_shapes", "str"),
    "trt_cuda_graph_enable": ("trt_cuda_graph_enable", "bool"),
    "trt_dump_ep_context_model": ("trt_dump_ep_context_model", "bool"),
    "trt_ep_context_file_path": ("trt_ep_context_file_path", "str"),
    "trt_ep_context_embed_mode": ("trt_ep_context_embed_mode", "int"),
}
_TRUE, _FALSE = ("true", "on", "1"), ("false", "off", "0")


def cache_dir() -> Path:
    """Where converted models go: the same base as naiad's other caches (`$NAIAD_CACHE_DIR`, else
    a per-user folder under the temp dir), never the model repository."""
    base = os.environ.get("NAIAD_CACHE_DIR") or os.path.join(tempfile.gettempdir(), f"naiad-{os.getuid()}")
    return Path(base) / "onnx"


# --- TensorRT execution provider ---------------------------------------------------------------


def tensorrt_options(parameters: Mapping[str, str], device_id: int) -> dict[str, str]:
    """Triton's `tensorrt` accelerator parameters as TensorRT EP provider options.

    Values are checked as Triton checks them and written the way onnxruntime's Python binding
    parses them (booleans as "True"/"False": the binding refuses "1"). An unknown key, a bad
    value or an unknown precision mode is an `InvalidArgument` naming it.
    """
    options: dict[str, str] = {"device_id": str(device_id)}
    for key, value in parameters.items():
        if key == "precision_mode":
            if value not in _TRT_PRECISIONS:
                raise InvalidArgument(f"unsupported precision mode '{value}' is requested")
            options.update(_TRT_PRECISIONS[value])
            continue
        if key not in _TRT_KEYS:
            raise InvalidArgument(f"unknown parameter '{key}' is provided for TensorRT Execution Accelerator")
        option, kind = _TRT_KEYS[key]
        if value:  # Triton skips empty values
            options[option] = _checked(key, value, kind)
    if options.get("trt_engine_cache_enable") == "True" and "trt_engine_cache_path" not in options:
        # Without a path the EP writes engines into the server's working directory.
        options["trt_engine_cache_path"] = str(cache_dir() / "tensorrt")
    return options


def _checked(key: str, value: str, kind: str) -> str:
    if kind == "bool":
        lowered = value.lower()
        if lowered in _TRUE or lowered in _FALSE:
            return "True" if lowered in _TRUE else "False"
        raise InvalidArgument(f"failed to convert '{value}' to boolean value for parameter '{key}'")
    if kind in ("int", "uint"):
        try:
            number: int | None = int(value)
        except ValueError:
            number = None
        if number is None or (kind == "uint" and number < 0):
            noun = "unsigned integral" if kind == "uint" else "integral"
            raise InvalidArgument(f"failed to convert '{value}' to {noun} number for parameter '{key}'")
        return str(number)
    return value


# --- converted model files ---------------------------------------------------------------------


def model_precision(parameters: Mapping[str, str], model_name: str) -> str:
    """The `precision` config parameter, lower-cased; fp32 when absent."""
    precision = parameters.get("precision", "fp32").strip().lower() or "fp32"
    if precision not in PRECISIONS:
        raise InvalidArgument(
            f"unable to load model '{model_name}': unsupported precision '{precision}' "
            f"(parameter 'precision' accepts {', '.join(PRECISIONS)})")
    return precision


#: Part of a cached variant's name: bump it when _convert changes, so that files converted the old
#: way are not reused (2: int8 weights in 7 bits).
_RECIPE = "r2"


def precision_variant(source: Path, precision: str, model_name: str) -> Path:
    """The model file to load for `precision`: the source for fp32, else a converted copy in the
    cache, made now unless an earlier load made it from the same source."""
    if precision == "fp32":
        return source
    target_dir = cache_dir() / f"{_source_key(source)}-{precision}-ort{ort.__version__}-{_RECIPE}"
    target = target_dir / "model.onnx"
    if target.is_file():
        log.info("model '%s': using the cached %s variant %s", model_name, precision, target)
        return target
    try:
        import onnx  # noqa: F401 - the converters need it; the onnxruntime wheel does not bring it
    except ImportError:
        raise InvalidArgument(f"unable to load model '{model_name}': precision '{precision}' needs the "
                              "'onnx' package (pip install onnx)") from None
    target_dir.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{target_dir.name}.", dir=target_dir.parent))
    try:
        _convert(source, partial / "model.onnx", precision)
        try:
            partial.rename(target_dir)  # atomic: a concurrent load either wins or finds it done
        except OSError:
            if not target.is_file():
                raise
    except Exception as error:  # any converter failure fails the load, with its reason
        raise InvalidArgument(
            f"unable to load model '{model_name}': making its {precision} variant failed: {error}") from error
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    log.info("model '%s': wrote the %s variant %s (%d -> %d bytes)", model_name, precision, target,
             source.stat().st_size, _size(target_dir))
    return target


def _source_key(source: Path) -> str:
    """sha256 of the model file, plus name, size and mtime of the files beside it (external data
    lives there), so that any change to what the model reads makes a new variant."""
    digest = hashlib.sha256()
    with open(source, "rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    for sibling in sorted(source.parent.iterdir()):
        if sibling != source and sibling.is_file():
            stat = sibling.stat()
            digest.update(f"{sibling.name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:24]


def _uses_external_data(source: Path) -> bool:
    import onnx

    model = onnx.load(str(source), load_external_data=False)
    return any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)


def _convert(source: Path, target: Path, precision: str) -> None:
    external = _uses_external_data(source)
    if precision == "int8":
        from onnxruntime.quantization import QuantType, quantize_dynamic

        # Dynamic quantization: INT8 weights (per output channel), activations quantized per batch
        # at run time, so no calibration data is needed. The default op list covers MatMul, Gemm,
        # Conv, Gather (embeddings), Attention, LSTM; the model's inputs and outputs stay float.
        # reduce_range: 7-bit weights. On CPUs without VNNI (AVX2, AVX-512 alone) onnxruntime's
        # u8 x s8 kernels saturate their 16-bit sums with full-range weights: the conformance MLP
        # was off by 12 % on such a CPU, 1.3 % with 7 bits; the cached file may serve on either.
        quantize_dynamic(source, target, per_channel=True, reduce_range=True, weight_type=QuantType.QInt8,
                         use_external_data_format=external)
    else:
        import onnx
        from onnxruntime.transformers.float16 import convert_float_to_float16

        # keep_io_types: Casts at the edges keep the declared FP32 inputs and outputs, so the
        # model config (and every client) stays valid.
        model = convert_float_to_float16(onnx.load(str(source)), keep_io_types=True)
        onnx.save(model, str(target), save_as_external_data=external, location="model.onnx.data")


def _size(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.iterdir() if p.is_file())
