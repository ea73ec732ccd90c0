"""pb_utils' model control from a model: load_model, unload_model and is_model_ready (see pb_utils).

Each goes through the model process's runtime (pb_runtime); without one it raises the
TritonModelException upstream's stub raises, saying no runtime is attached."""

from __future__ import annotations

import re

from naiad.backends.python import pb_runtime
from naiad.backends.python.pb_args import as_bool, as_str
from naiad.backends.python.pb_errors import TritonModelException
from naiad.backends.python.pb_runtime import NO_RUNTIME


def load_model(model_name: str, config: str = "", files: dict[str, bytes] | None = None) -> None:
    """Load or reload `model_name` (explicit model-control mode). `config` is a JSON model config
    overriding the repository's; `files` maps "file:<path in the version dir>" to file contents and
    needs `config`."""
    model_name = as_str(model_name, "load_model(): model_name")
    config = as_str(config, "load_model(): config")
    if files is not None:
        if not isinstance(files, dict):
            raise TritonModelException(
                f"failed to load model '{model_name}', files should be a dictionary of file paths and file contents")
        contents: dict[str, bytes] = {}
        for path, content in files.items():
            if not isinstance(content, bytes):  # upstream casts to py::bytes: bytes (or a subclass) only
                raise TypeError(f"load_model(): files must map paths to bytes contents, got {type(content)}")
            contents[as_str(path, "load_model(): files keys")] = bytes(content)
        files = contents
    runtime = pb_runtime.get()
    if runtime is None:
        raise TritonModelException(f"Failed to load model: {NO_RUNTIME}")
    try:
        runtime.load_model(model_name, config, files)
    except Exception as error:
        raise TritonModelException(f"Failed to load model: {error}") from error


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    """Unload `model_name` (and, with `unload_dependents`, the models that depend on it)."""
    model_name = as_str(model_name, "unload_model(): model_name")
    unload_dependents = as_bool(unload_dependents, "unload_model(): unload_dependents")
    runtime = pb_runtime.get()
    if runtime is None:
        raise TritonModelException(f"Failed to unload model: {NO_RUNTIME}")
    try:
        runtime.unload_model(model_name, unload_dependents)
    except Exception as error:
        raise TritonModelException(f"Failed to unload model: {error}") from error


# std::stol reads an optional sign and digits after leading blanks and ignores what follows.
_STOL = re.compile(r"\s*([+-]?\d+)")


def is_model_ready(model_name: str, model_version: str = "") -> bool:
    """Whether `model_name` (version `model_version`, "" for the server's choice) is ready."""
    model_name = as_str(model_name, "is_model_ready(): model_name")
    model_version = as_str(model_version, "is_model_ready(): model_version")
    if model_version:
        # Checked here (upstream checks in the server process) with upstream's messages.
        match = _STOL.match(model_version)
        if match is None:
            raise TritonModelException(
                f"Failed to check model readiness: failed to get model version from specified version string "
                f"'{model_version}' (details: stol), version should be an integral value > 0")
        if int(match.group(1)) < 0:
            raise TritonModelException(
                f"Failed to check model readiness: failed to get model version from specified version string "
                f"'{model_version}', version should be an integral value > 0")
        model_version = str(int(match.group(1)))  # what the server would read from it
    runtime = pb_runtime.get()
    if runtime is None:
        raise TritonModelException(f"Failed to check model readiness: {NO_RUNTIME}")
    try:
        return bool(runtime.is_model_ready(model_name, model_version))
    except Exception as error:
        raise TritonModelException(f"Failed to check model readiness: {error}") from error
