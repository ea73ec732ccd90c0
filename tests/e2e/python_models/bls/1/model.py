"""Business logic scripting: calls another model of the server from execute.

TARGET "simple" runs the ONNX "simple" model on INPUT0/INPUT1 (batch of 1) and returns its
OUTPUT0 (the sum); "repeat_py" streams INPUT0 through the decoupled repeat_py model and returns the
elements it received back, in order (COUNT = number of responses with outputs). Any other name is
passed through, so the caller sees the error the server gives for it."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [self.handle(request) for request in requests]

    def handle(self, request):
        in0 = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
        in1 = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
        target = pb_utils.get_input_tensor_by_name(request, "TARGET").as_numpy()[0].decode()
        if target == "repeat_py":
            call = pb_utils.InferenceRequest(
                model_name="repeat_py", inputs=[pb_utils.Tensor("IN", in0.astype(np.int32))],
                requested_output_names=["OUT", "IDX"])
            values = []
            for response in call.exec(decoupled=True):
                if response.has_error():
                    return pb_utils.InferenceResponse(error=response.error())
                out = pb_utils.get_output_tensor_by_name(response, "OUT")
                if out is not None:
                    values.append(int(out.as_numpy()[0]))
            result = np.array(values + [0] * (16 - len(values)), dtype=np.int32)
            count = np.array([len(values)], dtype=np.int32)
        else:
            call = pb_utils.InferenceRequest(
                model_name=target,
                inputs=[pb_utils.Tensor("INPUT0", in0.reshape(1, 16)), pb_utils.Tensor("INPUT1", in1.reshape(1, 16))],
                requested_output_names=["OUTPUT0"], trace=request.trace())  # joins a traced caller's trace
            response = call.exec()
            if response.has_error():
                return pb_utils.InferenceResponse(error=response.error())
            result = pb_utils.get_output_tensor_by_name(response, "OUTPUT0").as_numpy().reshape(16)
            count = np.array([1], dtype=np.int32)
        return pb_utils.InferenceResponse(
            output_tensors=[pb_utils.Tensor("OUTPUT0", result), pb_utils.Tensor("COUNT", count)])
