"""The streaming voice-activity detector of the example repository: silero VAD (v6, from the
``silero-vad`` wheel) wrapped so that everything it carries between chunks lives server-side.

Silero v5+ reads each 512-sample chunk (32 ms at 16 kHz) with the last 64 samples of the previous
chunk prepended (its own ``OnnxWrapper`` keeps them as ``_context``), and an LSTM state
``state [2, 1, 128]``. The wrapper graph makes both implicit states of naiad's sequence batcher:

    audio [1, 512] + context [1, 64] -> silero(input = concat(context, audio), state, sr = 16000)
        -> output [1, 1] (speech probability), stateN, contextN = last 64 samples of the input

so a client streams bare chunks on one sequence and gets one probability per chunk.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

SILERO_PACKAGE = "silero_vad"
SILERO_PIP_NAME = "silero-vad==6.2.3"
SILERO_FILE = "silero_vad_16k_op15.onnx"  # the 16 kHz-only export (smaller; the example is 16 kHz)
SAMPLE_RATE = 16000
CHUNK = 512
CONTEXT = 64


def silero_onnx() -> Path | None:
    """The ONNX file inside the installed ``silero_vad`` package, or None."""
    spec = importlib.util.find_spec(SILERO_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        path = Path(location) / "data" / SILERO_FILE
        if path.is_file():
            return path
    return None


def build_streaming_vad(dest: Path, silero: Path) -> Path:
    """Write the wrapper graph around `silero` to `dest`."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    model = onnx.load(str(silero))
    graph = model.graph
    # The model's own `input` and `sr` become values computed inside the graph: subgraphs (If
    # branches) that read them by name keep working unchanged.
    for name in ("input", "sr"):
        graph.input.remove(next(i for i in graph.input if i.name == name))
    graph.initializer.append(numpy_helper.from_array(np.array(SAMPLE_RATE, dtype=np.int64), "sr"))
    graph.initializer.append(numpy_helper.from_array(np.array([-CONTEXT], dtype=np.int64), "context_start"))
    graph.initializer.append(numpy_helper.from_array(np.array([CHUNK + CONTEXT], dtype=np.int64), "context_end"))
    graph.initializer.append(numpy_helper.from_array(np.array([1], dtype=np.int64), "context_axis"))
    graph.input.insert(0, helper.make_tensor_value_info("audio", TensorProto.FLOAT, [1, CHUNK]))
    graph.input.append(helper.make_tensor_value_info("context", TensorProto.FLOAT, [1, CONTEXT]))
    graph.node.insert(0, helper.make_node("Concat", ["context", "audio"], ["input"], axis=1, name="with_context"))
    graph.node.append(helper.make_node("Slice", ["input", "context_start", "context_end", "context_axis"],
                                       ["contextN"], name="next_context"))
    graph.output.append(helper.make_tensor_value_info("contextN", TensorProto.FLOAT, [1, CONTEXT]))
    onnx.checker.check_model(model)
    dest.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(dest))
    return dest
