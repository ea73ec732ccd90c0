"""BLS the way Triton's `examples/bls/sync_model.py` does it: the target model's name comes from a
BYTES input and goes to `InferenceRequest` as the numpy element it is (`bytes`, not str), the
inputs are forwarded as received (a tuple, not a list), and the called model's output tensors are
returned as they come. Triton's pybind11 bindings convert all of that; so must pb_utils."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            target = pb_utils.get_input_tensor_by_name(request, "MODEL_NAME").as_numpy()[0]
            forwarded = (pb_utils.get_input_tensor_by_name(request, "INPUT0"),
                         pb_utils.get_input_tensor_by_name(request, "INPUT1"))
            call = pb_utils.InferenceRequest(model_name=target, requested_output_names=("OUTPUT0", b"OUTPUT1"),
                                             inputs=forwarded)
            reply = call.exec()
            if reply.has_error():
                raise pb_utils.TritonModelException(reply.error().message())
            responses.append(pb_utils.InferenceResponse(output_tensors=reply.output_tensors()))
        return responses
