"""BYTES in and out: each UTF-8 string upper-cased, with its length in characters.

Responses carry a parameter with the number of requests execute received together."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            upper = np.array([[s.decode("utf-8").upper().encode("utf-8") for s in row] for row in text],
                             dtype=np.object_)
            length = np.array([[len(s.decode("utf-8")) for s in row] for row in text], dtype=np.int32)
            responses.append(pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor("UPPER", upper), pb_utils.Tensor("LENGTH", length)],
                parameters={"batch_requests": len(requests)}))
        return responses
