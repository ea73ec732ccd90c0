"""The conformance MLP as a Python model: numpy, weights from weights.npz next to this file."""

from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        w = np.load(Path(__file__).with_name("weights.npz"))
        self.w1, self.b1, self.w2, self.b2 = w["w1"], w["b1"], w["w2"], w["b2"]

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            y = np.maximum(x @ self.w1 + self.b1, 0) @ self.w2 + self.b2
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", y.astype(np.float32))]))
        return responses
