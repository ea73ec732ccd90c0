"""The requests of a run, encoded once: the model's spec, its data entries, and where tensors go."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path

from naiad.tools.loadgen import data
from naiad.tools.loadgen.kserve import ShmPlacement
from naiad.tools.loadgen.shm import Region, shm_available
from naiad.tools.loadgen.spec import ModelSpec, spec_from_config
from naiad.tools.loadgen.target import Target, TargetError


@dataclass(frozen=True, slots=True)
class DataSettings:
    """What to send (perf_analyzer's -b, --shape, --input-data, --shared-memory)."""

    batch_size: int = 1
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    input_file: Path | None = None
    zero: bool = False  # --input-data zero
    string_length: int = 128
    shared_memory: str = "none"  # or "system"
    output_shm_size: int = 100 * 1024


@dataclass
class RequestPlan:
    """Encoded bodies for every slot; owns the shared memory regions it registered."""

    target: Target
    spec: ModelSpec
    version: str
    entries: list[data.Entry]
    settings: DataSettings
    regions: list[Region] = field(default_factory=list)
    _inline: list[bytes] | None = None
    _input_places: list[dict[str, tuple[str, int, int]]] = field(default_factory=list)

    @property
    def outputs(self) -> list[str]:
        return [o.name for o in self.spec.outputs]

    @property
    def datatypes(self) -> dict[str, str]:
        return {i.name: str(i.datatype) for i in self.spec.inputs}

    def bodies(self, slot: int) -> list[bytes]:
        """The requests slot `slot` sends in turn (the same for every slot unless outputs go to
        shared memory, where each slot has its own output region)."""
        if self.settings.shared_memory == "system":
            return self._shm_bodies(slot)
        if self._inline is None:
            self._inline = [self.target.encode(self.spec.name, self.version, entry, self.datatypes, self.outputs)
                            for entry in self.entries]
        return self._inline

    async def ensure_shm(self, slots: int) -> None:
        """Create and register the input region (once) and output regions for `slots` slots
        (before those slots open: `bodies` names them)."""
        if not self.regions:
            await self._input_region()
        await self._output_regions(slots)

    async def _input_region(self) -> None:
        if not shm_available():
            raise TargetError("--shared-memory system needs a writable /dev/shm")
        blobs = [[(name, data.bytes_payload(array)) for name, array in entry.items()] for entry in self.entries]
        total = sum(len(b) for entry in blobs for _, b in entry)
        inputs = Region.create("inputs", total)
        self.regions.append(inputs)
        offset = 0
        for entry in blobs:
            places = {}
            for name, blob in entry:
                inputs.write(offset, blob)
                places[name] = (inputs.name, offset, len(blob))
                offset += len(blob)
            self._input_places.append(places)
        await self._register(inputs)

    async def _output_regions(self, slots: int) -> None:
        per_output = self.settings.output_shm_size
        while len(self.regions) - 1 < slots:
            region = Region.create(f"outputs{len(self.regions) - 1}", per_output * max(1, len(self.outputs)))
            self.regions.append(region)
            await self._register(region)

    async def _register(self, region: Region) -> None:
        await self.target.unregister_shm(region.name)  # a region left by an earlier run under this name
        await self.target.register_shm(region.name, region.key, region.byte_size)

    def _shm_bodies(self, slot: int) -> list[bytes]:
        out_region = self.regions[1 + slot]
        size = self.settings.output_shm_size
        outputs = {name: (out_region.name, i * size, size) for i, name in enumerate(self.outputs)}
        return [self.target.encode(self.spec.name, self.version, entry, self.datatypes, self.outputs,
                                   ShmPlacement(places, outputs))
                for entry, places in zip(self.entries, self._input_places, strict=True)]

    async def close(self) -> None:
        for region in self.regions:
            with contextlib.suppress(TargetError):
                await self.target.unregister_shm(region.name)
            region.close()
        self.regions = []


async def make_plan(target: Target, model: str, version: str, settings: DataSettings) -> RequestPlan:
    """Read the model's config from the server and build its requests' data."""
    spec = spec_from_config(await target.model_config(model, version))
    if settings.input_file is not None:
        entries = data.load_file(settings.input_file, spec, settings.batch_size)
    else:
        entries = data.generate(spec, settings.batch_size, settings.shapes, settings.zero, settings.string_length)
    return RequestPlan(target, spec, version, entries, settings)
