"""`async def execute`: awaits the ONNX "simple" model through async_exec for every request at once."""

import asyncio

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        calls = []
        for request in requests:
            in0 = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy().reshape(1, 16)
            in1 = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy().reshape(1, 16)
            call = pb_utils.InferenceRequest(
                model_name="simple", requested_output_names=["OUTPUT0"],
                inputs=[pb_utils.Tensor("INPUT0", in0), pb_utils.Tensor("INPUT1", in1)])
            calls.append(call.async_exec())
        await asyncio.sleep(0.01)
        responses = []
        for response in await asyncio.gather(*calls):
            if response.has_error():
                responses.append(pb_utils.InferenceResponse(error=response.error()))
            else:
                out = pb_utils.get_output_tensor_by_name(response, "OUTPUT0").as_numpy().reshape(16)
                responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", out)]))
        return responses
