"""The OpenVINO backend's config `parameters`, read the way Triton's openvino backend reads them.

Keys and accepted values are Triton's (values are case-insensitive):
  PERFORMANCE_HINT           LATENCY | THROUGHPUT | CUMULATIVE_THROUGHPUT
  NUM_STREAMS                AUTO | NUMA | <non-negative int>
  INFERENCE_NUM_THREADS      <non-negative int>
  COMPILATION_NUM_THREADS    <non-negative int>
  HINT_BF16                  YES: compute in bfloat16 where the CPU has it (default: f32)
  CPU_EXTENSION_PATH         a shared library of custom CPU operations
  SKIP_OV_DYNAMIC_BATCHSIZE  YES: keep the batch dimension static at max_batch_size
  ENABLE_BATCH_PADDING       YES: pad smaller batches up to that static batch size
  RESHAPE_IO_LAYERS          YES: reshape the model's inputs to the config's dims
Other keys are left alone, as Triton does. Nothing here imports openvino.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tritonclient.grpc import model_config_pb2 as mc

from naiad.errors import InvalidArgument

_HINTS = ("LATENCY", "THROUGHPUT", "CUMULATIVE_THROUGHPUT")
_STREAM_WORDS = ("AUTO", "NUMA")
_YES, _NO = ("YES", "TRUE", "1"), ("NO", "FALSE", "0", "")


@dataclass(frozen=True, slots=True)
class OpenVinoOptions:
    #: properties for `Core.compile_model` (OpenVINO's own names)
    compile_properties: dict[str, str] = field(default_factory=dict)
    #: properties for the `Core` itself (not per device)
    core_properties: dict[str, str] = field(default_factory=dict)
    extension_path: str = ""
    skip_dynamic_batch: bool = False
    batch_padding: bool = False
    reshape_io: bool = False


def parse_options(config: mc.ModelConfig) -> OpenVinoOptions:
    """The options `config.parameters` asks for; InvalidArgument names a bad key and its value."""
    compile_properties: dict[str, str] = {}
    core_properties: dict[str, str] = {}
    hint = _value(config, "PERFORMANCE_HINT")
    if hint:
        if hint.upper() not in _HINTS:
            raise _bad("PERFORMANCE_HINT", hint, "LATENCY/THROUGHPUT/CUMULATIVE_THROUGHPUT")
        compile_properties["PERFORMANCE_HINT"] = hint.upper()
    streams = _value(config, "NUM_STREAMS")
    if streams:
        if streams.upper() not in _STREAM_WORDS and not streams.isdigit():
            raise _bad("NUM_STREAMS", streams, "either AUTO/NUMA/<int_value>")
        compile_properties["NUM_STREAMS"] = streams.upper()
    threads = _count(config, "INFERENCE_NUM_THREADS")
    if threads:
        compile_properties["INFERENCE_NUM_THREADS"] = threads
    compile_threads = _count(config, "COMPILATION_NUM_THREADS")
    if compile_threads:
        core_properties["COMPILATION_NUM_THREADS"] = compile_threads
    bf16 = _value(config, "HINT_BF16")
    if bf16 and bf16.upper() != "YES":
        raise _bad("HINT_BF16", bf16, "YES")
    # Recent OpenVINO computes FP32 models in bfloat16 by default on CPUs that have it (AMX);
    # Triton's parameter makes bfloat16 opt-in, so ask for f32 unless HINT_BF16 says otherwise.
    compile_properties["INFERENCE_PRECISION_HINT"] = "bf16" if bf16 else "f32"
    return OpenVinoOptions(
        compile_properties=compile_properties,
        core_properties=core_properties,
        extension_path=_value(config, "CPU_EXTENSION_PATH"),
        skip_dynamic_batch=_flag(config, "SKIP_OV_DYNAMIC_BATCHSIZE"),
        batch_padding=_flag(config, "ENABLE_BATCH_PADDING"),
        reshape_io=_flag(config, "RESHAPE_IO_LAYERS"),
    )


def _value(config: mc.ModelConfig, key: str) -> str:
    if key not in config.parameters:
        return ""
    return str(config.parameters[key].string_value).strip()


def _count(config: mc.ModelConfig, key: str) -> str:
    value = _value(config, key)
    if value and not value.isdigit():
        raise _bad(key, value, "a non-negative number")
    return value


def _flag(config: mc.ModelConfig, key: str) -> bool:
    value = _value(config, key).upper()
    if value in _YES:
        return True
    if value in _NO:
        return False
    raise _bad(key, value, "YES or NO")


def _bad(key: str, value: str, expected: str) -> InvalidArgument:
    return InvalidArgument(f"expected the parameter '{key}' to be {expected}, got '{value}'")
