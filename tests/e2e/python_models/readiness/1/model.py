"""is_ready(): the model-ready endpoints ask the model. A request with IN = 0 makes it report not
ready, IN = 1 ready again (as a model that lost its connection to a database would)."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.ready = True

    def is_ready(self):
        return self.ready

    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            self.ready = bool(value[0])
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUT", value)]))
        return responses
