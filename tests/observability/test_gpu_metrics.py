"""GPU families rendered from NVML readings: a scripted NVML module stands in for the driver on
machines without a GPU (tests/gpu/test_gpu_metrics.py reads a real one)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from naiad.observability.gpu_metrics import GpuSampler, load_nvml
from naiad.observability.metrics import Metrics


class NotSupported(Exception):
    pass


class ScriptedNvml:
    """Two GPUs; the second cannot report power (as some boards answer NVML)."""

    def __init__(self) -> None:
        self.energy_mj = {0: 5_000_000, 1: 7_000_000}

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetUUID(self, handle: int) -> bytes:
        return f"GPU-{handle}aa".encode()

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> Any:
        return SimpleNamespace(gpu=[40, 75][handle])

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:
        return SimpleNamespace(total=80 << 30, used=(handle + 1) << 30)

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        if handle == 1:
            raise NotSupported("power")
        return 123_500

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: int) -> int:
        return 700_000

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: int) -> int:
        return self.energy_mj[handle]


def _families(text: str) -> dict[str, dict[str, float]]:
    return {family.name: {sample.labels["gpu_uuid"]: sample.value for sample in family.samples}
            for family in text_string_to_metric_families(text) if family.name.startswith("nv_")}


def test_each_gpu_is_a_series_labelled_by_its_uuid() -> None:
    nvml = ScriptedNvml()
    sampler = GpuSampler(nvml)
    nvml.energy_mj[0] += 2_500  # 2.5 J since the server started
    page = Metrics(lambda: [], cpu=False)
    page.gpu = sampler
    families = _families(page.text().decode())
    assert families["nv_gpu_utilization"] == {"GPU-0aa": 0.4, "GPU-1aa": 0.75}
    assert families["nv_gpu_memory_total_bytes"] == {"GPU-0aa": 80 << 30, "GPU-1aa": 80 << 30}
    assert families["nv_gpu_memory_used_bytes"] == {"GPU-0aa": 1 << 30, "GPU-1aa": 2 << 30}
    assert families["nv_gpu_power_usage"] == {"GPU-0aa": 123.5}  # GPU 1 cannot say: left out
    assert families["nv_gpu_power_limit"] == {"GPU-0aa": 700.0, "GPU-1aa": 700.0}
    # prometheus_client's parser names a counter family without its _total suffix
    assert families["nv_energy_consumption"] == {"GPU-0aa": 2.5, "GPU-1aa": 0.0}


def test_without_a_driver_there_are_no_gpu_metrics() -> None:
    # This machine has no NVIDIA driver: NVML fails to initialise and nothing is rendered.
    if load_nvml() is None:
        assert Metrics(lambda: [], cpu=False, gpu=True).text() == b""
