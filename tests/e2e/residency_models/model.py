"""A model.py for residency tests: it holds `ballast_mb` megabytes (config parameter) written
through, so its process's resident memory is what the server must account for, and answers
OUT = IN + `offset` + version * `version_offset` (config parameters), so each answer shows which
model and version gave it. A request whose
HOLD is non-zero keeps the instance busy until `$NAIAD_TEST_TMP/release-<model>` exists."""

import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        import json

        parameters = json.loads(args["model_config"]).get("parameters", {})
        megabytes = int(parameters.get("ballast_mb", {}).get("string_value", "0"))
        self.ballast = np.ones(megabytes << 18, dtype=np.float32)  # 4 bytes each, every page touched
        offset = int(parameters.get("offset", {}).get("string_value", "0"))
        per_version = int(parameters.get("version_offset", {}).get("string_value", "0"))
        self.offset = np.int32(offset + per_version * int(args["model_version"]))
        self.name = args["model_name"]

    def execute(self, requests):
        responses = []
        for request in requests:
            hold = pb_utils.get_input_tensor_by_name(request, "HOLD").as_numpy().reshape(-1)[0]
            if hold:
                release = os.path.join(os.environ["NAIAD_TEST_TMP"], f"release-{self.name}")
                deadline = time.monotonic() + 60
                while not os.path.exists(release) and time.monotonic() < deadline:
                    time.sleep(0.01)
            value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", value + self.offset)]))
        return responses
