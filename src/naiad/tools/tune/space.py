"""The configs `naiad tune` searches: dimensions of a model config, each an ordered list of values.

A *candidate* maps each dimension's name to one of its values; `apply` writes it into a copy of
a ModelConfig. Only `instances` changes instance groups alone, which naiad applies in place
(same backend model, new instances); every other dimension reloads the model (beside the old
one, which serves until the switch) — no dimension restarts the server.

Values are ordered so that neighbours are similar configs: the search climbs along them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from naiad.config.model_config import ModelConfig

Candidate = tuple[tuple[str, Any], ...]  # ((dimension, value), ...), hashable
OFF = "off"  # queue_delay_us: no dynamic_batching at all


@dataclass(frozen=True)
class Dimension:
    name: str
    values: tuple[Any, ...]
    apply: Callable[[ModelConfig, Any, dict[str, Any]], None]
    in_place: bool = False  # applied without reloading the model
    #: active(candidate) -> whether this dimension matters in that candidate (else the search skips it)
    active: Callable[[dict[str, Any]], bool] = lambda _: True


def candidate(values: dict[str, Any]) -> Candidate:
    return tuple(sorted(values.items()))


def as_dict(cand: Candidate) -> dict[str, Any]:
    return dict(cand)


def describe(cand: Candidate) -> str:
    return ", ".join(f"{k}={v}" for k, v in cand)


def apply(config: ModelConfig, dims: list[Dimension], cand: Candidate) -> ModelConfig:
    """A copy of `config` with every dimension of `cand` written into it."""
    result = ModelConfig()
    result.CopyFrom(config)
    values = as_dict(cand)
    for dim in dims:
        if dim.name in values:
            dim.apply(result, values[dim.name], values)
    return result


def only_in_place(dims: list[Dimension], a: Candidate, b: Candidate) -> bool:
    """Whether going from `a` to `b` changes in-place dimensions only (no reload)."""
    by_name = {d.name: d for d in dims}
    return all(by_name[k].in_place for (k, va), (_, vb) in zip(a, b, strict=True) if va != vb)


# ------------------------------------------------------------------------------------- dimensions


def _set_instances(config: ModelConfig, count: int, _: dict[str, Any]) -> None:
    groups = list(config.instance_group)
    if not groups:
        config.instance_group.add(count=count)
        return
    config.instance_group[0].count = count  # the first group carries the count; others are dropped
    del config.instance_group[1:]


def _set_max_batch(config: ModelConfig, size: int, _: dict[str, Any]) -> None:
    config.max_batch_size = size


def _set_queue_delay(config: ModelConfig, delay: Any, _: dict[str, Any]) -> None:
    if delay == OFF:
        config.ClearField("dynamic_batching")
        return
    config.dynamic_batching.max_queue_delay_microseconds = int(delay)


def _set_preferred(config: ModelConfig, choice: str, values: dict[str, Any]) -> None:
    if not config.HasField("dynamic_batching"):
        return
    del config.dynamic_batching.preferred_batch_size[:]
    size = config.max_batch_size
    if choice == "max" and size > 1:
        config.dynamic_batching.preferred_batch_size.append(size)
    elif choice == "half,max" and size > 2:
        config.dynamic_batching.preferred_batch_size.extend([size // 2, size])


def _batching_on(values: dict[str, Any]) -> bool:
    return values.get("queue_delay_us", OFF) != OFF and values.get("max_batch_size", 0) > 1


def _parameter(key: str) -> Callable[[ModelConfig, Any, dict[str, Any]], None]:
    def set_parameter(config: ModelConfig, value: Any, _: dict[str, Any]) -> None:
        config.parameters[key].string_value = str(value)

    return set_parameter


@dataclass(frozen=True)
class SpaceOptions:
    max_instances: int = 4
    max_batch_sizes: tuple[int, ...] = ()  # () -> powers of two up to max(64, the config's)
    queue_delays_us: tuple[Any, ...] = (OFF, 0, 100, 200, 500, 1000, 2000, 5000, 10000)
    preferred: tuple[str, ...] = ("none", "max", "half,max")


def model_space(config: ModelConfig, options: SpaceOptions) -> tuple[list[Dimension], Candidate]:
    """The dimensions of a model served by a scheduler (default or dynamic batcher), and the
    candidate that is `config` itself (the start of the search)."""
    start: dict[str, Any] = {}
    instances = tuple(range(1, max(1, options.max_instances) + 1))
    current = config.instance_group[0].count if config.instance_group and config.instance_group[0].count else 1
    dims = [Dimension("instances", tuple(sorted(set(instances) | {current})), _set_instances, in_place=True)]
    start["instances"] = current
    if config.max_batch_size > 0:
        sizes = options.max_batch_sizes or _powers_of_two(max(64, config.max_batch_size))
        sizes = tuple(sorted(set(sizes) | {config.max_batch_size}))
        dims.append(Dimension("max_batch_size", sizes, _set_max_batch))
        start["max_batch_size"] = config.max_batch_size
        batching = config.HasField("dynamic_batching")
        delay: Any = config.dynamic_batching.max_queue_delay_microseconds if batching else OFF
        delays = _ordered_delays((*options.queue_delays_us, delay))
        dims.append(Dimension("queue_delay_us", delays, _set_queue_delay,
                              active=lambda v: v.get("max_batch_size", 0) > 1))
        start["queue_delay_us"] = delay
        dims.append(Dimension("preferred", tuple(options.preferred), _set_preferred, active=_batching_on))
        start["preferred"] = _preferred_choice(config)
        if start["preferred"] not in options.preferred:
            dims[-1] = Dimension("preferred", (*options.preferred, start["preferred"]), _set_preferred,
                                 active=_batching_on)
    return dims, candidate(start)


def _ordered_delays(delays: tuple[Any, ...]) -> tuple[Any, ...]:
    numbers = sorted({int(d) for d in delays if d != OFF})
    return ((OFF,) if OFF in delays else ()) + tuple(numbers)


def _powers_of_two(upper: int) -> tuple[int, ...]:
    sizes, size = [], 1
    while size <= upper:
        sizes.append(size)
        size *= 2
    return tuple(sizes)


def _preferred_choice(config: ModelConfig) -> Any:
    preferred = list(config.dynamic_batching.preferred_batch_size) if config.HasField("dynamic_batching") else []
    size = config.max_batch_size
    if not preferred:
        return "none"
    if preferred == [size]:
        return "max"
    if preferred == [size // 2, size]:
        return "half,max"
    return tuple(preferred)  # the config's own list, kept as it is


# LLM engine settings (config parameters of the `llm` backend); each change reloads the engine.
LLM_DEFAULTS: dict[str, tuple[Any, ...]] = {
    "max_num_seqs": (8, 16, 32, 64, 128, 256),
    "max_num_batched_tokens": (512, 1024, 2048, 4096, 8192),
    "block_size": (8, 16, 32),
    "dtype": ("fp32", "bf16"),
    "quantization": ("none", "int8"),
}


ENGINE_DEFAULTS = {"max_num_seqs": 256, "max_num_batched_tokens": 2048, "block_size": 16, "dtype": "auto",
                   "quantization": "none"}  # naiad.llm.engine.EngineConfig's, where the config sets none


def llm_space(config: ModelConfig, only: tuple[str, ...] = ()) -> tuple[list[Dimension], Candidate]:
    """The LLM backend's engine settings, each starting from the config's value (or the engine's
    default when the config leaves it out)."""
    dims, start = [], {}
    for key, values in LLM_DEFAULTS.items():
        if only and key not in only:
            continue
        current: Any = ENGINE_DEFAULTS[key]
        if key in config.parameters:
            text = config.parameters[key].string_value
            current = int(text) if isinstance(values[0], int) and text.isdigit() else text
        ordered = tuple(sorted({*values, current}, key=lambda v: (isinstance(v, str), v)))
        if key == "dtype":
            ordered = tuple(dict.fromkeys((current, *values)))  # no natural order: the current first
        dims.append(Dimension(key, ordered, _parameter(key)))
        start[key] = current
    return dims, candidate(start)
