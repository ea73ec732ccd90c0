"""A stateful accumulator served by naiad's sequence batcher (written as for Triton).

OUTPUT = STATE_IN + INPUT: the implicit state STATE_IN is what the previous request of the same
sequence returned as STATE_OUT (zeros at START). CONTROLS echoes START, END and READY as int32,
CORRID_SEEN the correlation ID control, BATCH how many requests this execute received.
"""

import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        delay = config.get("parameters", {}).get("execute_delay_s", {}).get("string_value", "0")
        self.delay = float(delay)

    def execute(self, requests):
        if self.delay:
            time.sleep(self.delay)  # hold the instance so that requests of other sequences pile up
        responses = []
        for request in requests:
            get = _reader(request)
            total = (get("STATE_IN") + get("INPUT")).astype(np.int32)
            controls = np.concatenate([get(n).astype(np.int32) for n in ("START", "END", "READY")], axis=1)
            outputs = [
                pb_utils.Tensor("OUTPUT", total),
                pb_utils.Tensor("STATE_OUT", total),
                pb_utils.Tensor("CONTROLS", controls),
                pb_utils.Tensor("CORRID_SEEN", get("CORRID")),
                pb_utils.Tensor("BATCH", np.full((1, 1), len(requests), dtype=np.int32)),
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses


def _reader(request):
    def get(name):
        return pb_utils.get_input_tensor_by_name(request, name).as_numpy()

    return get
