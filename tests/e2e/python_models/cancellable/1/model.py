"""Decoupled. IN == 0: streams OUT = 1, 2, ... every 20 ms until the request is cancelled (then
sends the final flag), at most 500 responses. IN == 1: one response with OUT = how many requests
this instance has seen cancelled so far."""

import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.cancelled = 0

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            mode = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            if mode == 1:
                out = pb_utils.Tensor("OUT", np.array([self.cancelled], dtype=np.int32))
                sender.send(pb_utils.InferenceResponse(output_tensors=[out]),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                continue
            for i in range(1, 501):
                if request.is_cancelled():
                    self.cancelled += 1
                    break
                sender.send(pb_utils.InferenceResponse(
                    output_tensors=[pb_utils.Tensor("OUT", np.array([i], dtype=np.int32))]))
                time.sleep(0.02)
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
