"""TOKEN_EMBEDDINGS FP32 [batch, seq, 384] + ATTENTION_MASK INT64 [batch, seq] -> EMBEDDING [batch, 384]
and NUM_TOKENS INT64 [batch, 1] (the tokens each text had)."""

import numpy as np
import triton_python_backend_utils as pb_utils
from pooling import mean_pool_normalize


class TritonPythonModel:
    def execute(self, requests):
        return [self.pool(request) for request in requests]

    def pool(self, request):
        hidden = pb_utils.get_input_tensor_by_name(request, "TOKEN_EMBEDDINGS").as_numpy()
        mask = pb_utils.get_input_tensor_by_name(request, "ATTENTION_MASK").as_numpy()
        try:
            embedding = mean_pool_normalize(hidden, mask)
        except ValueError as error:
            return pb_utils.InferenceResponse(
                error=pb_utils.TritonError(str(error), pb_utils.TritonError.INVALID_ARG))
        tokens = mask.sum(axis=1, keepdims=True).astype(np.int64)
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("EMBEDDING", embedding),
                                                          pb_utils.Tensor("NUM_TOKENS", tokens)])
