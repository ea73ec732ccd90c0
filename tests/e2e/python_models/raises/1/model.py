"""Errors from model code: IN < 0 answers that request with a TritonError (INVALID_ARG);
IN == 999 raises from execute, which fails every request of the batch; otherwise OUT = IN."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            if value[0] == 999:
                raise ValueError("execute raised on purpose")
            if value[0] < 0:
                error = pb_utils.TritonError("IN must not be negative", pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(error=error))
            else:
                responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUT", value)]))
        return responses
