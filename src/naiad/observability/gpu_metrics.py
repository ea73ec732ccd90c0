"""GPU metrics through NVML (nvidia-ml-py), with Triton's names: one series per GPU, labelled
by its `gpu_uuid`. Triton reads them through DCGM; NVML is the library under DCGM and needs
nothing but the driver. Where there is no driver or no GPU the sampler renders nothing.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

log = logging.getLogger(__name__)

Family = Callable[[str, str, str, list[tuple[str, float | int]]], Iterator[str]]
Labels = Callable[..., str]


def load_nvml() -> Any | None:
    """The initialised `pynvml` module, or None without the package, the driver or a GPU."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        if pynvml.nvmlDeviceGetCount() == 0:
            pynvml.nvmlShutdown()
            return None
    except Exception as error:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        log.debug("no GPU metrics: %s", error)
        return None
    return pynvml


class GpuSampler:
    """Reads each GPU's utilization, memory, power and energy at scrape time."""

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self._lock = threading.Lock()  # NVML handles are shared by the scrape threads
        self.devices = [(self._uuid(handle), handle)
                        for handle in (nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount()))]
        # Energy is counted since the server started, as Triton does: keep each GPU's start value.
        self._energy_start: dict[str, int] = {}
        for uuid, handle in self.devices:
            with contextlib.suppress(Exception):  # not supported on this board: no energy series for it
                self._energy_start[uuid] = int(nvml.nvmlDeviceGetTotalEnergyConsumption(handle))

    def _uuid(self, handle: Any) -> str:
        uuid = self.nvml.nvmlDeviceGetUUID(handle)
        return uuid.decode() if isinstance(uuid, bytes) else str(uuid)

    def read(self) -> dict[str, list[tuple[str, float | int]]]:
        """Family name → (gpu uuid, value) for every GPU; a value NVML cannot read is left out."""
        nvml = self.nvml
        readers: dict[str, Callable[[Any], float | int]] = {
            "nv_gpu_utilization": lambda h: nvml.nvmlDeviceGetUtilizationRates(h).gpu / 100.0,
            "nv_gpu_memory_total_bytes": lambda h: int(nvml.nvmlDeviceGetMemoryInfo(h).total),
            "nv_gpu_memory_used_bytes": lambda h: int(nvml.nvmlDeviceGetMemoryInfo(h).used),
            "nv_gpu_power_usage": lambda h: nvml.nvmlDeviceGetPowerUsage(h) / 1000.0,  # mW → W
            "nv_gpu_power_limit": lambda h: nvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0,
        }
        values: dict[str, list[tuple[str, float | int]]] = {name: [] for name, _, _ in FAMILIES}
        with self._lock:
            for uuid, handle in self.devices:
                for name, reader in readers.items():
                    try:
                        values[name].append((uuid, reader(handle)))
                    except Exception as error:  # e.g. NVMLError_NotSupported on some boards
                        log.debug("GPU %s: %s unreadable: %s", uuid, name, error)
                start = self._energy_start.get(uuid)
                if start is not None:
                    try:
                        used_mj = int(nvml.nvmlDeviceGetTotalEnergyConsumption(handle)) - start
                        values["nv_energy_consumption"].append((uuid, used_mj / 1000.0))  # mJ → J
                    except Exception as error:
                        log.debug("GPU %s: energy unreadable: %s", uuid, error)
        return values

    def render(self, family: Family, labels: Labels) -> Iterator[str]:
        values = self.read()
        for name, kind, doc in FAMILIES:
            yield from family(name, kind, doc, [(labels(gpu_uuid=uuid), value) for uuid, value in values[name]])


FAMILIES = (
    ("nv_gpu_utilization", "gauge", "GPU utilization rate [0.0 - 1.0)"),
    ("nv_gpu_memory_total_bytes", "gauge", "GPU total memory, in bytes"),
    ("nv_gpu_memory_used_bytes", "gauge", "GPU used memory, in bytes"),
    ("nv_gpu_power_usage", "gauge", "GPU power usage in watts"),
    ("nv_gpu_power_limit", "gauge", "GPU power management limit in watts"),
    ("nv_energy_consumption", "counter", "GPU energy consumption in joules since the Triton Server started"),
)
