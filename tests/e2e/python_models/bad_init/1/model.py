"""initialize fails: the model must be UNAVAILABLE with this message as the reason."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        raise pb_utils.TritonModelException("bad_init cannot start: missing weights")

    def execute(self, requests):
        return []
