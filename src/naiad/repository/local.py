"""Model repositories on local disk: which models exist, their versions and fingerprints."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

Fingerprint = tuple[tuple[str, int, int | str], ...]


@dataclass(frozen=True, slots=True)
class ModelSource:
    """A model directory found in one repository. For a model in object storage (`listing` set),
    `path` is its place in the local cache and `repository` the RemoteLocation."""

    name: str
    path: Path
    repository: Any  # Path, or a RemoteLocation
    listing: tuple[Any, ...] | None = None  # remote: the model's blobs, as listed


@dataclass(frozen=True, slots=True)
class Discovery:
    """What a scan of all repositories found; `duplicates` maps a name to every repository holding it."""

    models: dict[str, ModelSource]
    duplicates: dict[str, list[Any]]
    unavailable: dict[str, str] = field(default_factory=dict)  # remote repository → why it cannot be listed


def discover(repositories: list[Path]) -> Discovery:
    """Scan every repository; a model name found in two of them is a duplicate and serves from neither."""
    found: dict[str, list[ModelSource]] = {}
    for repository in repositories:
        if not repository.is_dir():
            continue
        for entry in sorted(repository.iterdir()):
            if entry.is_dir() and not entry.name.startswith("."):
                found.setdefault(entry.name, []).append(ModelSource(entry.name, entry, repository))
    models = {name: sources[0] for name, sources in found.items() if len(sources) == 1}
    duplicates = {name: [s.repository for s in sources] for name, sources in found.items() if len(sources) > 1}
    return Discovery(models, duplicates)


def version_dirs(model_dir: Path) -> dict[int, Path]:
    """Numeric version directories; names starting with 0 and non-numeric names are ignored (as Triton)."""
    versions = {}
    for entry in model_dir.iterdir() if model_dir.is_dir() else ():
        if entry.is_dir() and entry.name.isdigit() and not entry.name.startswith("0"):
            versions[int(entry.name)] = entry
    return versions


def select_versions(policy: mc.ModelVersionPolicy, available: list[int]) -> list[int]:
    """The versions a policy serves: latest N (default 1), all, or a specific list."""
    which = policy.WhichOneof("policy_choice")
    if which == "all":
        return sorted(available)
    if which == "specific":
        return sorted(set(policy.specific.versions))
    count = policy.latest.num_versions if which == "latest" else 1
    return sorted(available)[-max(count, 1):] if available else []


def fingerprint(path: Path) -> Fingerprint:
    """Relative path, size and mtime of every file below `path`: equal fingerprints mean no change."""
    if path.is_file():
        stat = path.stat()
        return ((path.name, stat.st_size, stat.st_mtime_ns),)
    entries = []
    for root, dirs, files in os.walk(path):
        dirs.sort()
        for name in sorted(files):
            full = os.path.join(root, name)
            try:
                stat = os.stat(full)
            except FileNotFoundError:
                continue
            entries.append((os.path.relpath(full, path), stat.st_size, stat.st_mtime_ns))
    return tuple(entries)
