"""Sleeps 80 ms per execution of up to 8 rows, 320 ms beyond: the tune test's known optimum."""

import time

import triton_python_backend_utils as pb_utils

BASE_S = 0.080
LARGE_BATCH = 8


class TritonPythonModel:
    def execute(self, requests):
        rows = sum(pb_utils.get_input_tensor_by_name(r, "X").as_numpy().shape[0] for r in requests)
        time.sleep(BASE_S * (4 if rows > LARGE_BATCH else 1))
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())])
                for r in requests]
