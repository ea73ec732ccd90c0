import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2 as mc

from naiad.backends.base import Batch
from naiad.backends.identity import IdentityModel
from naiad.config.model_config import parse_config_text
from naiad.errors import InvalidArgument
from naiad.types import DataType, InferRequest, Tensor

CONFIG = """name: "id" backend: "identity" max_batch_size: 4
input [ { name: "A" data_type: TYPE_INT32 dims: [2] } ] output [ { name: "B" data_type: TYPE_INT32 dims: [2] } ]
"""


def _instance(text: str = CONFIG):
    return IdentityModel(parse_config_text(text, "t"), None, 1).create_instance(mc.ModelInstanceGroup(), 0)


def test_outputs_echo_inputs_by_position_and_split_per_request():
    requests = [InferRequest("id", None, [Tensor("A", DataType.INT32, (n, 2), np.full((n, 2), n, np.int32))])
                for n in (1, 2)]
    results = _instance().execute(Batch(requests, batched=True))
    assert [r["B"].tolist() for r in results] == [[[1, 1]], [[2, 2], [2, 2]]]


def test_bad_configs_fail_the_load():
    with pytest.raises(InvalidArgument, match="as many outputs as inputs"):
        _instance('name: "id" input [ { name: "A" data_type: TYPE_INT32 dims: [1] } ]')
    with pytest.raises(InvalidArgument, match="execute_delay_ms must be a number"):
        _instance(CONFIG + 'parameters { key: "execute_delay_ms" value { string_value: "soon" } }')


def test_runs_on_the_submitting_thread_unless_it_sleeps():
    assert _instance().runs_anywhere
    delayed = CONFIG + 'parameters { key: "execute_delay_ms" value { string_value: "5" } }'
    assert not _instance(delayed).runs_anywhere  # a sleep would hold the event loop
