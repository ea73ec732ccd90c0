import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from naiad.core.validation import RequestValidator
from naiad.errors import InvalidArgument
from naiad.types import DataType, InferRequest, RequestedOutput, Tensor, TensorSpec

INPUTS = [TensorSpec("INPUT0", DataType.INT32, (-1, 16)), TensorSpec("INPUT1", DataType.INT32, (-1, 16))]
OUTPUTS = [TensorSpec("OUTPUT0", DataType.INT32, (-1, 16))]
VALIDATOR = RequestValidator("simple", 8, INPUTS, OUTPUTS)


def _tensor(name: str, shape: tuple[int, ...], datatype: DataType = DataType.INT32) -> Tensor:
    return Tensor(name, datatype, shape, np.zeros(shape, dtype=datatype.numpy))


def _request(*tensors: Tensor, outputs=None, request_id: str = "") -> InferRequest:
    return InferRequest("simple", None, list(tensors), outputs, id=request_id)


def _error(request: InferRequest) -> str:
    with pytest.raises(InvalidArgument) as caught:
        VALIDATOR.validate(request)
    return caught.value.message


def test_a_good_request_passes():
    VALIDATOR.validate(_request(_tensor("INPUT0", (2, 16)), _tensor("INPUT1", (2, 16))))


def test_missing_input_uses_tritons_text():
    message = _error(_request(_tensor("INPUT0", (1, 16))))
    assert message == (
        "[request id: <id_unknown>] expected 2 inputs but got 1 inputs for model 'simple'. "
        "Got input(s) ['INPUT0'], but missing required input(s) ['INPUT1']. Please provide all required input(s)."
    )


def test_optional_inputs_change_the_count_text():
    validator = RequestValidator("m", 0, [TensorSpec("A", DataType.FP32, (1,)),
                                         TensorSpec("B", DataType.FP32, (1,), optional=True),
                                         TensorSpec("C", DataType.FP32, (1,))], [])
    with pytest.raises(InvalidArgument, match="expected number of inputs between 2 and 3 but got 1 inputs"):
        validator.validate(InferRequest("m", None, [_tensor("A", (1,), DataType.FP32)]))


def test_unknown_input_and_output():
    assert "unexpected inference input 'X' for model 'simple'" in _error(
        _request(_tensor("INPUT0", (1, 16)), _tensor("X", (1, 16))))
    assert _error(_request(_tensor("INPUT0", (1, 16)), _tensor("INPUT1", (1, 16)),
                           outputs=[RequestedOutput("NOPE")], request_id="7")) == (
        "[request id: 7] unexpected inference output 'NOPE' for model 'simple'")


def test_datatype_mismatch():
    message = _error(_request(_tensor("INPUT0", (1, 16), DataType.FP32), _tensor("INPUT1", (1, 16))))
    assert "inference input 'INPUT0' data-type is 'FP32', but model 'simple' expects 'INT32'" in message


def test_shape_mismatch_names_input_model_and_shapes():
    message = _error(_request(_tensor("INPUT0", (2, 8)), _tensor("INPUT1", (2, 16))))
    assert "unexpected shape for input 'INPUT0' for model 'simple'. Expected [-1,16], got [2,8]." in message
    assert "NOTE: Setting a non-zero max_batch_size" in message


def test_batch_size_limits():
    too_big = _error(_request(_tensor("INPUT0", (9, 16)), _tensor("INPUT1", (9, 16))))
    assert too_big.endswith("inference request batch-size must be <= 8 for 'simple'")
    uneven = _error(_request(_tensor("INPUT0", (2, 16)), _tensor("INPUT1", (3, 16))))
    assert uneven.endswith("input 'INPUT1' batch size does not match other inputs for 'simple'")


def test_inputs_the_sequence_batcher_fills_are_neither_required_nor_accepted():
    validator = RequestValidator("simple", 8, [*INPUTS, TensorSpec("START", DataType.INT32, (-1, 1))], OUTPUTS,
                                 frozenset({"START"}))
    validator.validate(_request(_tensor("INPUT0", (1, 16)), _tensor("INPUT1", (1, 16))))
    with pytest.raises(InvalidArgument, match="unexpected inference input 'START' for model 'simple'"):
        validator.validate(_request(_tensor("INPUT0", (1, 16)), _tensor("INPUT1", (1, 16)),
                                    _tensor("START", (1, 1))))


# The one-pass check (`_passes`) must never let through a request that the checks one by one
# would refuse: for every request it passes, `validate`'s worded checks find nothing either.
_NAMES = st.sampled_from(["A", "B", "C", "X"])
_DIMS = st.lists(st.integers(-2, 9), min_size=0, max_size=3).map(tuple)
_TYPES = st.sampled_from([DataType.FP32, DataType.INT32])


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(max_batch_size=st.integers(0, 4),
       specs=st.lists(st.tuples(_TYPES, st.lists(st.sampled_from([-1, 1, 2, 3]), min_size=1, max_size=3).map(tuple),
                                st.booleans()), min_size=1, max_size=3),
       tensors=st.lists(st.tuples(_NAMES, _TYPES, _DIMS), max_size=4),
       outputs=st.one_of(st.none(), st.lists(st.sampled_from(["OUT", "NOPE"]), max_size=2)))
def test_the_one_pass_check_agrees_with_the_worded_checks(max_batch_size, specs, tensors, outputs):
    inputs = [TensorSpec(name, datatype, shape, optional=optional)
              for name, (datatype, shape, optional) in zip("ABC", specs, strict=False)]
    validator = RequestValidator("m", max_batch_size, inputs, [TensorSpec("OUT", DataType.FP32, (-1,))])
    request = InferRequest("m", None, [Tensor(name, datatype, shape, np.zeros(0)) for name, datatype, shape in tensors],
                           None if outputs is None else [RequestedOutput(name) for name in outputs])
    try:
        validator._check_each(request)
        worded_error = None
    except InvalidArgument as error:
        worded_error = error
    if validator._passes(request):
        assert worded_error is None


def test_the_one_pass_check_takes_the_usual_request():
    assert VALIDATOR._passes(_request(_tensor("INPUT0", (2, 16)), _tensor("INPUT1", (2, 16))))
    assert not VALIDATOR._passes(_request(_tensor("INPUT0", (2, 16)), _tensor("INPUT0", (2, 16))))
    assert not VALIDATOR._passes(_request(_tensor("INPUT0", (2, 16)), _tensor("INPUT1", (3, 16))))
