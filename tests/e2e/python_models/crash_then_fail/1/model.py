"""A model that cannot come back: IN == 1 leaves a marker file (in $NAIAD_TEST_TMP) and kills its
own process; initialize refuses to start while the marker exists. So every restart fails, and
requests must fail fast instead of waiting for a process that never comes."""

import os
import signal

import triton_python_backend_utils as pb_utils


def _marker():
    return os.path.join(os.environ["NAIAD_TEST_TMP"], "crash_then_fail.marker")


class TritonPythonModel:
    def initialize(self, args):
        if os.path.exists(_marker()):
            raise pb_utils.TritonModelException("crash_then_fail cannot start again")

    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            if value[0] == 1:
                with open(_marker(), "w"):
                    pass
                os.kill(os.getpid(), signal.SIGKILL)
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUT", value)]))
        return responses
