"""Check a decoded request against the model's inputs and outputs, with Triton's messages."""

from __future__ import annotations

from naiad.errors import InvalidArgument
from naiad.types import InferRequest, TensorSpec

_BATCH_NOTE = (
    "NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension to be "
    "prepended to each input shape. If you want to specify the full shape including the batch dim in "
    "your input dims config, try setting max_batch_size to zero. See the model configuration docs for "
    "more info on max_batch_size."
)


def request_prefix(request: InferRequest) -> str:
    """Triton prefixes every inference error with the request id."""
    return f"[request id: {request.id or '<id_unknown>'}] "


def _dims(shape: tuple[int, ...] | list[int]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


class RequestValidator:
    """Validates requests for one model version; built once at load time."""

    def __init__(self, model_name: str, max_batch_size: int, inputs: list[TensorSpec],
                 outputs: list[TensorSpec], server_inputs: frozenset[str] = frozenset()) -> None:
        self.model_name = model_name
        self.max_batch_size = max_batch_size
        # Inputs the server fills itself (sequence control and state inputs) are neither required
        # from clients nor accepted from them, even when the config also lists them as inputs.
        self.inputs = {spec.name: spec for spec in inputs if spec.name not in server_inputs}
        self.outputs = {spec.name: spec for spec in outputs}
        self.required = [spec.name for spec in inputs if not spec.optional and spec.name not in server_inputs]
        # For the one-pass check: each input's datatype, rank, the dims that are not -1 (by
        # index) and whether it is required.
        self._expected = {
            name: (spec.datatype, len(spec.shape), tuple((i, d) for i, d in enumerate(spec.shape) if d != -1),
                   0 if spec.optional else 1)
            for name, spec in self.inputs.items()
        }

    def validate(self, request: InferRequest) -> None:
        """Raise InvalidArgument (prefixed with the request id) for the first problem found."""
        if not self._passes(request):
            self._check_each(request)

    def _check_each(self, request: InferRequest) -> None:
        """The checks one by one, in Triton's order: InvalidArgument for the first that fails."""
        try:
            self._check_input_names(request)
            for tensor in request.inputs:
                self._check_input(tensor.name, tensor.datatype, tensor.shape)
            self._check_batch(request)
            self._check_outputs(request)
        except InvalidArgument as error:
            raise InvalidArgument(request_prefix(request) + error.message) from None

    def _passes(self, request: InferRequest) -> bool:
        """Every check below in one loop, for the request that passes them all (nearly every
        one): True when it does. False sends it to the checks one by one, which word the first
        problem in Triton's order (or find none: this loop turns away rarer valid requests too,
        such as two inputs of the same name)."""
        inputs = request.inputs
        expected = self._expected
        required = 0
        for tensor in inputs:
            want = expected.get(tensor.name)
            if want is None or tensor.datatype != want[0]:
                return False
            shape = tensor.shape
            if len(shape) != want[1]:
                return False
            for index, dim in want[2]:
                if shape[index] != dim:
                    return False
            required += want[3]
        if required != len(self.required):
            return False
        if len(inputs) > 1 and len({tensor.name for tensor in inputs}) != len(inputs):
            return False
        max_batch_size = self.max_batch_size
        if max_batch_size > 0 and inputs:
            size = inputs[0].shape[0]
            if not 1 <= size <= max_batch_size:
                return False
            for tensor in inputs:
                if tensor.shape[0] != size:
                    return False
        outputs = self.outputs
        for output in request.outputs or ():  # noqa: SIM110 - no generator on the hot path
            if output.name not in outputs:
                return False
        return True

    def _check_input_names(self, request: InferRequest) -> None:
        given = [t.name for t in request.inputs]
        for name in given:
            if name not in self.inputs:
                raise InvalidArgument(f"unexpected inference input '{name}' for model '{self.model_name}'")
        missing = [name for name in self.required if name not in given]
        if not missing:
            return
        total, required = len(self.inputs), len(self.required)
        expected = (f"expected {total} inputs" if total == required
                    else f"expected number of inputs between {required} and {total}")
        raise InvalidArgument(
            f"{expected} but got {len(given)} inputs for model '{self.model_name}'. "
            f"Got input(s) {_names(given)}, but missing required input(s) {_names(missing)}. "
            "Please provide all required input(s)."
        )

    def _check_input(self, name: str, datatype: str, shape: tuple[int, ...]) -> None:
        spec = self.inputs[name]
        if datatype != spec.datatype:
            raise InvalidArgument(
                f"inference input '{name}' data-type is '{datatype}', but model "
                f"'{self.model_name}' expects '{spec.datatype}'"
            )
        if not _matches(spec.shape, shape):
            note = _BATCH_NOTE if self.max_batch_size > 0 else ""
            raise InvalidArgument(
                f"unexpected shape for input '{name}' for model '{self.model_name}'. "
                f"Expected {_dims(spec.shape)}, got {_dims(shape)}. {note}"  # Triton keeps the space
            )

    def _check_batch(self, request: InferRequest) -> None:
        if self.max_batch_size <= 0 or not request.inputs:
            return
        size = request.inputs[0].shape[0]
        for tensor in request.inputs[1:]:
            if tensor.shape[0] != size:
                raise InvalidArgument(
                    f"input '{tensor.name}' batch size does not match other inputs for '{self.model_name}'"
                )
        if size < 1:
            raise InvalidArgument(f"inference request batch-size must be >= 1 for '{self.model_name}'")
        if size > self.max_batch_size:
            raise InvalidArgument(
                f"inference request batch-size must be <= {self.max_batch_size} for '{self.model_name}'"
            )

    def _check_outputs(self, request: InferRequest) -> None:
        for output in request.outputs or ():
            if output.name not in self.outputs:
                raise InvalidArgument(
                    f"unexpected inference output '{output.name}' for model '{self.model_name}'"
                )


def _matches(expected: tuple[int, ...], actual: tuple[int, ...]) -> bool:
    if expected == actual:
        return True
    if len(expected) != len(actual):
        return False
    for want, got in zip(expected, actual, strict=True):  # noqa: SIM110 - no generator on the hot path
        if want != got and want != -1:
            return False
    return True


def _names(names: list[str]) -> str:
    return "[" + ",".join(f"'{n}'" for n in names) + "]"
