"""Triton's naming rules: which config input feeds which forward() argument, and which entry of
the model's result each config output is."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any

import torch
from tritonclient.grpc import model_config_pb2 as mc

from naiad.errors import InvalidArgument

log = logging.getLogger(__name__)

INDEXED = re.compile(r"__(\d+)$")
"""`<name>__<index>`: Triton's positional names (INPUT__0, OUTPUT__1)."""


@dataclass(frozen=True, slots=True)
class Argument:
    name: str
    kind: str  # "tensor"; "int", "float" or "bool" (fed from a one-element input); "dict" (all inputs by name)


def bind_inputs(config: mc.ModelConfig, arguments: list[Argument]) -> list[tuple[str, Argument]]:
    """Config input name for each forward() argument, in call order (Triton's naming conventions:
    forward argument names, else INPUT__<i>, else config order)."""
    names = [tensor.name for tensor in config.input]
    if len(names) != len(arguments):
        raise InvalidArgument(
            f"unable to load model '{config.name}', configuration expects {len(names)} inputs, "
            f"model provides {len(arguments)}"
        )
    arg_names = [argument.name for argument in arguments]
    indices = [INDEXED.search(name) for name in names]
    if all(name in arg_names for name in names):
        positions = [arg_names.index(name) for name in names]
    elif all(indices):
        positions = [int(match.group(1)) for match in indices if match]
        if sorted(positions) != list(range(len(arguments))):
            raise InvalidArgument(
                f"model '{config.name}': inputs {names} must number forward()'s {len(arguments)} "
                f"arguments from __0 to __{len(arguments) - 1}, each once"
            )
    else:
        log.warning("model '%s': inputs %s are neither forward() arguments %s nor <name>__<index>; "
                    "binding them in config order", config.name, names, arg_names)
        positions = list(range(len(names)))
    by_position = dict(zip(positions, names, strict=True))
    return [(by_position[i], argument) for i, argument in enumerate(arguments)]


def flatten_result(result: Any) -> list[tuple[list[str], torch.Tensor]]:
    """The result's tensors in order, each with its path (dict keys / sequence indices)."""
    leaves: list[tuple[list[str], torch.Tensor]] = []

    def walk(value: Any, path: list[str]) -> None:
        if isinstance(value, torch.Tensor):
            leaves.append((path, value))
        elif isinstance(value, (tuple, list)):
            for i, item in enumerate(value):
                walk(item, [*path, str(i)])
        elif isinstance(value, dict):
            for key, item in value.items():
                walk(item, [*path, str(key)])
        else:
            raise InvalidArgument(f"the model returned a {type(value).__name__}; only tensors, "
                                  "tuples, lists and dicts of tensors can be outputs")

    walk(result, [])
    return leaves


def bind_outputs(names: list[str], leaves: list[tuple[list[str], torch.Tensor]]) -> list[int]:
    """The flattened-result position of each config output."""
    indices = [INDEXED.search(name) for name in names]
    if all(indices):
        positions = [int(match.group(1)) for match in indices if match]
    else:
        known: dict[str, int] = {}
        for position, (path, _) in enumerate(leaves):
            known["RESULT" + "".join(f"[{key}]" for key in path)] = position
            if len(path) == 1:
                known.setdefault(path[0], position)
        # by name when every output names an entry, else Triton's strict config ordering
        by_name = all(name in known for name in names)
        positions = [known[name] for name in names] if by_name else list(range(len(names)))
    for name, position in zip(names, positions, strict=True):
        if position >= len(leaves):
            raise InvalidArgument(f"the model returned {len(leaves)} output tensor(s): none at "
                                  f"position {position} for output '{name}'")
    return positions
