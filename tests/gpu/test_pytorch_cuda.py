"""The PyTorch backend on CUDA: KIND_GPU instances run on cuda:<gpu id> (skipped without CUDA)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tritonclient.grpc import model_config_pb2 as mc  # noqa: E402

from naiad.backends.base import Batch  # noqa: E402
from naiad.backends.pytorch import PyTorchModel  # noqa: E402
from naiad.config.model_config import parse_config_text  # noqa: E402
from naiad.errors import Unavailable  # noqa: E402
from naiad.types import DataType, InferRequest, Tensor  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device"),
]


class Affine(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.arange(12, dtype=torch.float32).reshape(4, 3), requires_grad=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # the second output says where the computation ran
        flags = torch.tensor([x.is_cuda, self.weight.is_cuda], device=x.device)
        return x @ self.weight, flags.expand(x.shape[0], 2)


def _model(tmp_path: Path, extra: str = "", pt2: bool = False) -> PyTorchModel:
    version = tmp_path / "1"
    version.mkdir()
    if pt2:
        batch = torch.export.Dim("batch", min=1, max=8)
        program = torch.export.export(Affine(), (torch.zeros(2, 4),), dynamic_shapes=({0: batch},))
        torch.export.save(program, str(version / "model.pt2"))
    else:
        torch.jit.script(Affine()).save(str(version / "model.pt"))
    config = parse_config_text(
        f'name: "affine" backend: "pytorch" max_batch_size: 8 {extra}'
        'input { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 4 ] }'
        'output { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 3 ] }'
        'output { name: "OUTPUT__1" data_type: TYPE_BOOL dims: [ 2 ] }', "test")
    if pt2:
        config.platform = "torch_aoti"
    return PyTorchModel(config, version, 1)


def _gpu(*gpus: int) -> mc.ModelInstanceGroup:
    return mc.ModelInstanceGroup(name="affine_0", kind=mc.ModelInstanceGroup.KIND_GPU, gpus=list(gpus))


def _run(instance, x: np.ndarray) -> dict[str, np.ndarray]:
    (result,) = instance.execute(Batch([InferRequest("affine", None, [Tensor("INPUT__0", DataType.FP32, x.shape, x)])],
                                       batched=True))
    assert not isinstance(result, Exception), result
    return result


@pytest.mark.parametrize("pt2", [False, True], ids=["torchscript", "torch_export"])
def test_kind_gpu_runs_on_the_groups_cuda_device(tmp_path: Path, pt2: bool) -> None:
    instance = _model(tmp_path, pt2=pt2).create_instance(_gpu(0), 0)
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    result = _run(instance, x)
    weight = np.arange(12, dtype=np.float32).reshape(4, 3)
    np.testing.assert_allclose(result["OUTPUT__0"], x @ weight, rtol=1e-3, atol=1e-3)  # TF32 matmuls
    assert instance.device == torch.device("cuda", 0)
    if pt2:  # export fixed x.is_cuda at export time: look at the module's weights instead
        assert all(p.is_cuda for p in instance.module.parameters())
    else:
        assert result["OUTPUT__1"].all()
    instance.close()


def test_kind_cpu_stays_on_the_cpu_on_a_gpu_machine(tmp_path: Path) -> None:
    cpu = mc.ModelInstanceGroup(kind=mc.ModelInstanceGroup.KIND_CPU)
    instance = _model(tmp_path).create_instance(cpu, 0)
    assert _run(instance, np.ones((1, 4), dtype=np.float32))["OUTPUT__1"].tolist() == [[False, False]]  # [batch, 2]


def test_a_gpu_id_torch_does_not_see_fails_clearly(tmp_path: Path) -> None:
    missing = torch.cuda.device_count()
    with pytest.raises(Unavailable, match=f"asks for GPU {missing}"):
        _model(tmp_path).create_instance(_gpu(missing), 0)


def test_cache_cleaning_runs_after_each_execution(tmp_path: Path) -> None:
    model = _model(tmp_path, 'parameters { key: "ENABLE_CACHE_CLEANING" value { string_value: "true" } }')
    instance = model.create_instance(_gpu(0), 0)
    block = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda:0")
    del block  # freed into torch's cache: still reserved
    assert torch.cuda.memory_reserved(0) >= 256 * 2**20
    _run(instance, np.ones((2, 4), dtype=np.float32))
    assert torch.cuda.memory_reserved(0) < 256 * 2**20  # the execution emptied the cache
