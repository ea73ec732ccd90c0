"""Answers every request with an error: tune must stop at once with it, not search."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(error=pb_utils.TritonError("this model always fails")) for _ in requests]
