"""Decoupled: one response per element of IN (after DELAY[i] ms), then a flags-only final response.

The responses are sent from a thread of the model's own after execute has returned, as Triton's
decoupled examples do."""

import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.threads = []

    def execute(self, requests):
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().copy()
            delay = pb_utils.get_input_tensor_by_name(request, "DELAY")
            delays = delay.as_numpy().copy() if delay is not None else np.zeros(values.size, np.uint32)
            thread = threading.Thread(target=self.respond, args=(request.get_response_sender(), values, delays))
            thread.start()
            self.threads.append(thread)
        return None

    def respond(self, sender, values, delays):
        for i, value in enumerate(values):
            if delays[i]:
                time.sleep(int(delays[i]) / 1000)
            out = pb_utils.Tensor("OUT", np.array([value], dtype=np.int32))
            idx = pb_utils.Tensor("IDX", np.array([i], dtype=np.uint32))
            sender.send(pb_utils.InferenceResponse(output_tensors=[out, idx]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def finalize(self):
        for thread in self.threads:
            thread.join()
