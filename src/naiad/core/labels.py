"""Version labels: names for a model's versions (`stable` → 3, `canary` → 4) and an optional
weighted split of the requests that name neither a version nor a label (docs/version_labels.md).

A `VersionLabels` is immutable: a change builds a new one and the model manager swaps its
reference in one assignment, so a promotion switches new requests at once while requests that
already resolved their version finish there.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import json
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from naiad.errors import InvalidArgument

#: Config parameter (and repository-load parameter) holding `label=version` pairs.
LABELS_PARAMETER = "version_labels"
#: Config parameter (and repository-load parameter) holding `label=weight` pairs.
SPLIT_PARAMETER = "version_split"
#: Inference request parameter naming the label to route to; also set on responses.
REQUEST_PARAMETER = "version_label"
PARAMETERS = (LABELS_PARAMETER, SPLIT_PARAMETER)

# A label never looks like a version number, so the two can never be confused.
_LABEL = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")
_PAIR = re.compile(r"^\s*([^=:\s]+)\s*[=:]\s*(\S+)\s*$")


@dataclass(frozen=True, slots=True)
class VersionLabels:
    """One model's label table and split; build with `parse` (which validates)."""

    model: str
    labels: Mapping[str, int] = field(default_factory=dict)
    split: tuple[tuple[str, int], ...] = ()  # (label, weight), weights > 0
    _bounds: tuple[int, ...] = ()  # cumulative weights of `split`, for bisect

    @classmethod
    def parse(cls, model: str, labels: str = "", split: str = "") -> VersionLabels:
        """From the `version_labels` and `version_split` texts; InvalidArgument when malformed."""
        table: dict[str, int] = {}
        for label, value in _pairs(model, LABELS_PARAMETER, labels, "stable=3,canary=4"):
            table[label] = _integer(model, LABELS_PARAMETER, label, value)
        weights: list[tuple[str, int]] = []
        for label, value in _pairs(model, SPLIT_PARAMETER, split, "stable=90,canary=10"):
            if label not in table:
                raise InvalidArgument(f"invalid {SPLIT_PARAMETER} for model '{model}': "
                                      f"label '{label}' is not defined in {LABELS_PARAMETER}")
            weight = _integer(model, SPLIT_PARAMETER, label, value)
            if weight > 0:  # a zero weight is allowed (a paused canary) and never chosen
                weights.append((label, weight))
        if split.strip() and not weights:
            raise InvalidArgument(f"invalid {SPLIT_PARAMETER} for model '{model}': the weights sum to 0")
        bounds = tuple(itertools.accumulate(weight for _, weight in weights))
        return cls(model, table, tuple(weights), bounds)

    @classmethod
    def from_config(cls, model: str, config: mc.ModelConfig) -> VersionLabels | None:
        """The labels a config declares in its parameters, or None when it declares none."""
        labels = config.parameters[LABELS_PARAMETER].string_value if LABELS_PARAMETER in config.parameters else ""
        split = config.parameters[SPLIT_PARAMETER].string_value if SPLIT_PARAMETER in config.parameters else ""
        if not labels.strip() and not split.strip():
            return None
        return cls.parse(model, labels, split)

    def changed(self, labels: str | None, split: str | None) -> VersionLabels:
        """A copy with the table and/or the split replaced (None keeps the current one; an
        empty text removes it)."""
        return VersionLabels.parse(self.model, self.labels_text() if labels is None else labels,
                                   self.split_text() if split is None else split)

    def resolve(self, label: str) -> int:
        """The version `label` names; InvalidArgument for an unknown label."""
        version = self.labels.get(label)
        if version is None:
            raise InvalidArgument(f"label '{label}' is not defined for model '{self.model}'")
        return version

    def choose(self, request_id: str = "") -> str | None:
        """The label a request without version or label goes to under the split (None without
        one): the same for every request with the same id (retries land on the same version),
        random for requests without an id."""
        if not self.split:
            return None
        total = self._bounds[-1]
        if request_id:
            # blake2b, never hash(): Python salts str hashes per process.
            digest = hashlib.blake2b(f"{self.model}\0{request_id}".encode(), digest_size=8).digest()
            point = int.from_bytes(digest, "big") % total
        else:
            point = random.randrange(total)
        return self.split[bisect.bisect_right(self._bounds, point)][0]

    def labels_text(self) -> str:
        return ",".join(f"{label}={version}" for label, version in self.labels.items())

    def split_text(self) -> str:
        return ",".join(f"{label}={weight}" for label, weight in self.split)

    def as_dict(self) -> dict[str, Any]:
        """The table and split as JSON (GET /v2/models/{m}/labels)."""
        return {"name": self.model, "labels": dict(self.labels), "split": dict(self.split)}

    def apply_to(self, config: mc.ModelConfig) -> None:
        """Write the labels in force into `config`'s parameters (a copy a client reads)."""
        for key, text in ((LABELS_PARAMETER, self.labels_text()), (SPLIT_PARAMETER, self.split_text())):
            if text:
                config.parameters[key].string_value = text
            elif key in config.parameters:
                del config.parameters[key]


def without_labels(config: mc.ModelConfig) -> mc.ModelConfig:
    """A copy of `config` without the label parameters: configs that differ only in labels
    serve the same versions, which a label change must not reload."""
    copy = mc.ModelConfig()
    copy.CopyFrom(config)
    for key in PARAMETERS:
        if key in copy.parameters:
            del copy.parameters[key]
    return copy


def same_but_labels(a: mc.ModelConfig, b: mc.ModelConfig) -> bool:
    return bool(a == b or without_labels(a) == without_labels(b))


def label_change(config_json: Any) -> dict[str, str] | None:
    """The label texts of a repository-load `config` that holds nothing but label parameters
    (`{"parameters": {"version_labels": {"string_value": "stable=4"}}}`), or None when the config
    is a real config override. Such a load changes the labels and reloads nothing."""
    try:
        document = json.loads(config_json) if isinstance(config_json, (str, bytes)) else config_json
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None  # config_from_json reports the parse error
    if not isinstance(document, dict) or not set(document) <= {"name", "parameters"}:
        return None
    parameters = document.get("parameters")
    if not isinstance(parameters, dict) or not parameters or not set(parameters) <= set(PARAMETERS):
        return None
    change: dict[str, str] = {}
    for key, value in parameters.items():
        text = value.get("string_value") if isinstance(value, dict) else value
        if not isinstance(text, str):
            raise InvalidArgument(f"config parameter '{key}' must have a string_value")
        change[key] = text
    return change


def _pairs(model: str, what: str, text: str, example: str) -> list[tuple[str, str]]:
    pairs: list[tuple[str, str]] = []
    seen: set[str] = set()
    for item in text.split(","):
        if not item.strip():
            continue
        found = _PAIR.match(item)
        if found is None:
            raise InvalidArgument(f"invalid {what} for model '{model}': '{item.strip()}' is not a "
                                  f"label=value pair (expected e.g. '{example}')")
        label, value = found.groups()
        if not _LABEL.match(label):
            raise InvalidArgument(f"invalid {what} for model '{model}': label '{label}' must start with a "
                                  "letter or '_' and hold only letters, digits, '_', '.' and '-'")
        if label in seen:
            raise InvalidArgument(f"invalid {what} for model '{model}': label '{label}' appears twice")
        seen.add(label)
        pairs.append((label, value))
    return pairs


def _integer(model: str, what: str, label: str, value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = -1
    if number < 0:
        raise InvalidArgument(f"invalid {what} for model '{model}': '{value}' (label '{label}') "
                              "is not a non-negative integer")
    return number
