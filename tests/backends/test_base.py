import numpy as np

from naiad.backends.base import Batch
from naiad.types import DataType, InferRequest, Tensor


def _request(rows: int, start: int) -> InferRequest:
    data = np.arange(start, start + rows * 2, dtype=np.int32).reshape(rows, 2)
    return InferRequest("m", None, [Tensor("X", DataType.INT32, data.shape, data)])


def test_one_request_passes_its_arrays_without_copy():
    request = _request(2, 0)
    batch = Batch([request], batched=True)
    assert batch.inputs()["X"] is request.inputs[0].data
    assert batch.size == 2


def test_concatenates_along_the_batch_dimension_and_splits_back():
    batch = Batch([_request(1, 0), _request(3, 100)], batched=True)
    assert batch.size == 4
    stacked = batch.inputs()["X"]
    assert stacked.shape == (4, 2)
    parts = batch.split({"Y": stacked * 2})
    assert [p["Y"].shape for p in parts] == [(1, 2), (3, 2)]
    np.testing.assert_array_equal(parts[1]["Y"], np.arange(100, 106).reshape(3, 2) * 2)


def test_non_batching_model_counts_one_per_request():
    batch = Batch([_request(5, 0)], batched=False)
    assert batch.size == 1


def test_ragged_inputs_concatenate_flat_with_their_batch_input_descriptors():
    from naiad.backends.base import BatchInput, RaggedLayout

    requests = [InferRequest("m", None, [Tensor("X", DataType.FP32, (1, n), np.ones((1, n), np.float32))])
                for n in (3, 4, 5)]
    kinds = ["BATCH_ELEMENT_COUNT", "BATCH_ACCUMULATED_ELEMENT_COUNT", "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO",
             "BATCH_MAX_ELEMENT_COUNT_AS_SHAPE", "BATCH_ITEM_SHAPE", "BATCH_ITEM_SHAPE_FLATTEN"]
    layout = RaggedLayout(frozenset({"X"}), tuple(BatchInput(k, k, np.dtype(np.int32), "X") for k in kinds))
    inputs = Batch(requests, batched=True, layout=layout).inputs()
    assert inputs["X"].shape == (12,)
    assert inputs["BATCH_ELEMENT_COUNT"].tolist() == [3, 4, 5]
    assert inputs["BATCH_ACCUMULATED_ELEMENT_COUNT"].tolist() == [3, 7, 12]
    assert inputs["BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO"].tolist() == [0, 3, 7, 12]
    assert inputs["BATCH_MAX_ELEMENT_COUNT_AS_SHAPE"].shape == (5,)
    assert inputs["BATCH_ITEM_SHAPE"].tolist() == [[3], [4], [5]]
    assert inputs["BATCH_ITEM_SHAPE_FLATTEN"].tolist() == [3, 4, 5]
    assert all(a.dtype == np.int32 for k, a in inputs.items() if k != "X")
