"""The machine as the console shows it: host CPU and memory, the server's own CPU time and
memory (its model processes and LLM engine cores included), and the GPUs through NVML.

Read from /proc when the console asks (about once a second), never per request. Where /proc
is missing (not Linux) the process figures are left out rather than guessed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from naiad.observability.gpu_metrics import GpuSampler, load_nvml
from naiad.observability.metrics import CpuSampler

_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class SystemSampler:
    """Host and process figures for the console's live data."""

    def __init__(self, gpu: bool, proc: Path = Path("/proc")) -> None:
        self.proc = proc
        self.cpu = CpuSampler(proc)  # its own: /metrics scrapes keep theirs
        nvml = load_nvml() if gpu else None
        self.gpu = GpuSampler(nvml) if nvml is not None else None

    def sample(self) -> dict[str, Any]:
        total, used = self.cpu.memory()
        pids = [os.getpid(), *self._children(os.getpid())]
        cpu_s, rss = 0.0, 0
        for pid in pids:
            seconds, resident = self._process(pid)
            cpu_s += seconds
            rss += resident
        return {
            "cores": os.cpu_count() or 1,
            "cpu": self.cpu.utilization(),  # host, 0..1 over all cores, since the previous sample
            "memory_total": total,
            "memory_used": used,
            "processes": len(pids),
            "process_cpu_s": cpu_s,  # CPU seconds of the server and its children, since they started
            "process_rss": rss,
            "gpus": self._gpus(),
        }

    def _children(self, pid: int) -> list[int]:
        """Every descendant of `pid` (model processes, engine cores and their workers)."""
        found: list[int] = []
        pending = [pid]
        while pending:
            parent = pending.pop()
            try:
                tasks = list((self.proc / str(parent) / "task").iterdir())
            except OSError:
                continue
            for task in tasks:
                try:
                    children = [int(child) for child in (task / "children").read_text().split()]
                except (OSError, ValueError):
                    continue
                found.extend(children)
                pending.extend(children)
        return found

    def _process(self, pid: int) -> tuple[float, int]:
        """(CPU seconds, resident bytes) of one process; zeros when it is gone."""
        try:
            stat = (self.proc / str(pid) / "stat").read_text()
            statm = (self.proc / str(pid) / "statm").read_text().split()
        except OSError:
            return 0.0, 0
        fields = stat[stat.rfind(")") + 2:].split()  # the command name may hold spaces
        try:
            ticks = int(fields[11]) + int(fields[12])  # utime + stime
            return ticks / _TICKS, int(statm[1]) * _PAGE_SIZE
        except (IndexError, ValueError):
            return 0.0, 0

    def _gpus(self) -> list[dict[str, Any]]:
        if self.gpu is None:
            return []
        values = self.gpu.read()
        gpus: dict[str, dict[str, Any]] = {}
        for family, key in (("nv_gpu_utilization", "utilization"), ("nv_gpu_memory_used_bytes", "memory_used"),
                            ("nv_gpu_memory_total_bytes", "memory_total"), ("nv_gpu_power_usage", "power_w")):
            for uuid, value in values.get(family, []):
                gpus.setdefault(uuid, {"uuid": uuid})[key] = value
        return list(gpus.values())
