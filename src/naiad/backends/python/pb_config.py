"""pb_utils.ModelConfig: the model configuration `auto_complete_config` edits, with upstream's
validation and messages (see pb_utils)."""

from __future__ import annotations

import json
from typing import Any

# -- auto-complete config --------------------------------------------------------------------


class ModelConfig:
    """The model configuration handed to `auto_complete_config`. Built from the config's JSON text
    (as upstream) or from its dict; `as_dict()` is the live dict the setters edit."""

    def __init__(self, model_config: str | bytes | dict[str, Any]) -> None:
        if isinstance(model_config, dict):
            # A round trip gives the model its own copy, as upstream's json.loads does.
            self._model_config: dict[str, Any] = json.loads(json.dumps(model_config))
        else:
            self._model_config = json.loads(model_config)

    def as_dict(self) -> dict[str, Any]:
        return self._model_config

    def _name(self) -> str:
        return str(self._model_config.get("name", ""))

    def set_max_batch_size(self, max_batch_size: int) -> None:
        """Set max_batch_size; a configuration value above the new one is an error."""
        current = self._model_config.get("max_batch_size", 0)
        if current > max_batch_size:
            raise ValueError(
                f"configuration specified max_batch_size {current}, but in auto-complete-config function for model "
                f"'{self._name()}' specified max_batch_size {max_batch_size}")
        self._model_config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        """Use the dynamic batcher, unless another scheduler is configured (an error)."""
        found = next((key for key in ("sequence_batching", "ensemble_scheduling") if key in self._model_config),
                     None)
        if found is not None:
            raise ValueError(
                f"Configuration specified scheduling_choice as '{found}', but auto-complete-config function for "
                f"model '{self._name()}' tries to set scheduling_choice as 'dynamic_batching'")
        self._model_config.setdefault("dynamic_batching", {})

    def add_input(self, input: dict[str, Any]) -> None:  # upstream's parameter name, shadowing and all
        """Add an input {name, data_type, dims[, optional]}; an existing one must agree with it."""
        self._add_tensor("input", input, ("name", "data_type", "dims", "optional"),
                         "'name', 'data_type', 'dims' and 'optional'")

    def add_output(self, output: dict[str, Any]) -> None:
        """Add an output {name, data_type, dims}; an existing one must agree with it."""
        self._add_tensor("output", output, ("name", "data_type", "dims"), "'name', 'data_type' and 'dims'")

    def _add_tensor(self, kind: str, tensor: dict[str, Any], valid: tuple[str, ...], valid_text: str) -> None:
        model = self._name()
        where = f"in auto-complete-config function for model '{model}'"
        for key in tensor:
            # Upstream names the tensor here even when 'name' is missing (a KeyError there).
            if key not in valid and "name" in tensor:
                raise ValueError(f"{kind} '{tensor['name']}' {where} contains property other than {valid_text}.")
        if "name" not in tensor:
            raise ValueError(f"{kind} {where} is missing 'name' property.")
        for key in ("data_type", "dims"):
            if key not in tensor:
                raise ValueError(f"{kind} '{tensor['name']}' {where} is missing '{key}' property.")
        name = tensor["name"]
        for current in self._model_config.setdefault(kind, []):
            if current["name"] != name:
                continue
            data_type = current.get("data_type", "TYPE_INVALID")
            if data_type != "TYPE_INVALID" and data_type != tensor["data_type"]:
                raise ValueError(
                    f"unable to load model '{model}', configuration expects datatype {data_type} for {kind} "
                    f"'{name}', model provides {tensor['data_type']}")
            dims = current.get("dims")
            if dims and dims != tensor["dims"]:
                raise ValueError(
                    f"model '{model}', tensor '{name}': the model expects dims {tensor['dims']} but the model "
                    f"configuration specifies dims {dims}")
            if "optional" in current and "optional" in tensor and current["optional"] != tensor["optional"]:
                raise ValueError(
                    f"model '{model}', tensor '{name}': the model expects optional {tensor['optional']} but the "
                    f"model configuration specifies optional {current['optional']}")
            current["data_type"] = tensor["data_type"]
            current["dims"] = tensor["dims"]
            if "optional" in tensor:
                current["optional"] = tensor["optional"]
            return
        self._model_config[kind].append(tensor)

    def set_model_transaction_policy(self, transaction_policy_dict: dict[str, Any]) -> None:
        """Set model_transaction_policy ({"decoupled": True}); changing a configured value is an error."""
        for key in transaction_policy_dict:
            if key != "decoupled":
                raise ValueError(
                    f"model transaction property in auto-complete-config function for model '{self._name()}' "
                    "contains property other than 'decoupled'.")
        policy = self._model_config.setdefault("model_transaction_policy", {})
        if "decoupled" in transaction_policy_dict:
            wanted = transaction_policy_dict["decoupled"]
            if "decoupled" in policy and policy["decoupled"] != wanted:
                raise ValueError(
                    f"trying to change decoupled property in auto-complete-config for model '{self._name()}', "
                    f"which is already set to '{policy['decoupled']}'.")
            policy["decoupled"] = wanted
