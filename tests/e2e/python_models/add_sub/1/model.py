"""Triton's add_sub example: OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1."""

import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        output0 = pb_utils.get_output_config_by_name(config, "OUTPUT0")
        output1 = pb_utils.get_output_config_by_name(config, "OUTPUT1")
        self.dtype0 = pb_utils.triton_string_to_numpy(output0["data_type"])
        self.dtype1 = pb_utils.triton_string_to_numpy(output1["data_type"])

    def execute(self, requests):
        responses = []
        for request in requests:
            in0 = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            in1 = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            out0 = pb_utils.Tensor("OUTPUT0", (in0 + in1).astype(self.dtype0))
            out1 = pb_utils.Tensor("OUTPUT1", (in0 - in1).astype(self.dtype1))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out0, out1]))
        return responses

    def finalize(self):
        pb_utils.Logger.log_info("add_sub finalized")
