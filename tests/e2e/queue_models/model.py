"""A model.py for queue-policy tests: OUT = IN, EXEC = the number of this execution (1, 2, ...),
SIZE = how many requests the execution held. A request whose DELAY is negative holds the
instance until the test creates `$NAIAD_TEST_TMP/release-<model>`; a positive DELAY sleeps that
many seconds. Each execution first touches `$NAIAD_TEST_TMP/<model>-started-<n>`."""

import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.name = args["model_name"]
        self.marks = os.environ["NAIAD_TEST_TMP"]
        self.count = 0

    def execute(self, requests):
        self.count += 1
        open(os.path.join(self.marks, f"{self.name}-started-{self.count}"), "w").close()
        delays = [float(pb_utils.get_input_tensor_by_name(r, "DELAY").as_numpy().reshape(-1)[0]) for r in requests]
        if min(delays) < 0:
            release = os.path.join(self.marks, f"release-{self.name}")
            deadline = time.monotonic() + 60
            while not os.path.exists(release) and time.monotonic() < deadline:
                time.sleep(0.01)
        elif max(delays) > 0:
            time.sleep(max(delays))
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            rows = value.shape[0]
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUT", value),
                pb_utils.Tensor("EXEC", np.full((rows, 1), self.count, dtype=np.int32)),
                pb_utils.Tensor("SIZE", np.full((rows, 1), len(requests), dtype=np.int32)),
            ]))
        return responses
