"""IN == 1 kills the model's own process in the middle of execute (as a segfault in an extension
would); otherwise OUT = IN and PID = the process id, so tests can see the process was replaced."""

import os
import signal

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            if value[0] == 1:
                os.kill(os.getpid(), signal.SIGKILL)
            pid = pb_utils.Tensor("PID", np.array([os.getpid()], dtype=np.int64))
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUT", value), pid]))
        return responses
