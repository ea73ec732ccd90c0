"""From a model directory to a completed, validated config and started LoadedVersions."""

from __future__ import annotations

import time
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from naiad.backends.base import Host, Model
from naiad.backends.registry import backend_class
from naiad.config.autocomplete import fill_defaults, resolve_backend
from naiad.config.model_config import read_model_config
from naiad.config.options import ServerOptions
from naiad.config.validate import check_model_filenames, validate_config
from naiad.core.ensemble import ENSEMBLE_PLATFORM, EnsembleModel
from naiad.core.model import LoadedVersion, VersionServices
from naiad.errors import InvalidArgument
from naiad.repository.local import version_dirs


def prepare_config(
    name: str, model_dir: Path, options: ServerOptions, override: mc.ModelConfig | None = None
) -> tuple[mc.ModelConfig, type[Model]]:
    """Read (or take the override), resolve the backend, auto-complete, fill defaults, validate."""
    config = mc.ModelConfig()
    if override is not None:
        config.CopyFrom(override)
    else:
        found = read_model_config(model_dir, options.model_config_name)
        if found is None and not options.auto_complete_config:
            raise InvalidArgument(f"failed to load model '{name}': no config.pbtxt and auto-complete is disabled")
        if found is not None:
            config.CopyFrom(found)
    if not config.name:
        config.name = name
    check_model_filenames(config, name)
    versions = version_dirs(model_dir)
    first = versions[min(versions)] if versions else None
    resolve_backend(config, model_dir, first, model_name=name)
    cls = EnsembleModel if config.platform == ENSEMBLE_PLATFORM else backend_class(config.backend)
    made_batching = False
    if options.auto_complete_config and first is not None:
        settings = {"default_max_batch_size": options.default_max_batch_size,
                    "backend_config": options.backend_config.get(config.backend, {})}
        made_batching = cls.auto_complete(config, first, settings)
    # Triton adds `dynamic_batching {}` only when auto-complete itself made the model batch.
    fill_defaults(config, default_instance_count=cls.default_instance_count(),
                  add_dynamic_batching=made_batching)
    validate_config(config, name)
    return config, cls


def start_version(
    name: str, version: int, config: mc.ModelConfig, cls: type[Model], model_dir: Path, version_dir: Path,
    services: VersionServices, host: Host | None = None,
) -> LoadedVersion:
    """Load one version and start its instances; raises with the reason on failure."""
    started = time.monotonic()
    model = cls(config, version_dir, version)
    model.host = host
    loaded = LoadedVersion(name, version, config, model, model_dir, services)
    try:
        loaded.start()
    except BaseException:
        model.close()
        raise
    loaded.stats.load_duration_s = time.monotonic() - started  # nv_model_load_duration_secs
    return loaded
