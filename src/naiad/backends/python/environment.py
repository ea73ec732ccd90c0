"""Which interpreter runs a model's process: the server's own, or the model's EXECUTION_ENV_PATH.

EXECUTION_ENV_PATH (a model config parameter, as in Triton) names a packed environment — a
conda-pack / venv tarball (.tar.gz, .tgz, .tar) — or an unpacked environment directory;
`$$TRITON_MODEL_DIRECTORY` in it stands for the model's directory. A tarball is unpacked once
into a cache directory keyed by its path, size and modification time. The environment's
`bin/python` then runs the model process, with only naiad's own package added to its path (not
the server's site-packages): it needs numpy and msgspec of its own.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tarfile
import tempfile
import threading
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from naiad.errors import InvalidArgument

ENV_PARAMETER = "EXECUTION_ENV_PATH"
_unpack_lock = threading.Lock()


def python_for(config: mc.ModelConfig, model_dir: Path) -> tuple[str, dict[str, str] | None]:
    """The interpreter and environment for the model's processes (None: inherit the server's)."""
    parameter = config.parameters.get(ENV_PARAMETER)
    if parameter is None or not parameter.string_value:
        return sys.executable, None
    location = Path(parameter.string_value.replace("$$TRITON_MODEL_DIRECTORY", str(model_dir)))
    if not location.exists():
        raise InvalidArgument(f"{ENV_PARAMETER} '{location}' of model '{config.name}' does not exist")
    root = location if location.is_dir() else _unpacked(location)
    for name in ("bin/python3", "bin/python"):
        python = root / name
        if python.exists():
            return str(python), _environment(root)
    raise InvalidArgument(f"{ENV_PARAMETER} '{location}' of model '{config.name}' has no bin/python")


def cache_dir() -> Path:
    base = os.environ.get("NAIAD_CACHE_DIR") or os.path.join(tempfile.gettempdir(), f"naiad-{os.getuid()}")
    return Path(base) / "python-envs"


def _unpacked(archive: Path) -> Path:
    stat = archive.stat()
    key = hashlib.sha256(f"{archive.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    target = cache_dir() / key
    with _unpack_lock:
        if (target / ".unpacked").exists():
            return target
        target.mkdir(parents=True, exist_ok=True)
        try:
            with tarfile.open(archive) as tar:
                tar.extractall(target, filter="tar")  # no absolute paths, no escapes from target
        except (tarfile.TarError, OSError) as error:
            raise InvalidArgument(f"unable to unpack {ENV_PARAMETER} '{archive}': {error}") from None
        (target / ".unpacked").touch()
    return target


def _environment(root: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONHOME", None)
    env["PATH"] = os.pathsep.join([str(root / "bin"), env.get("PATH", "")])
    env["VIRTUAL_ENV"] = str(root)
    env["PYTHONPATH"] = str(_naiad_only())
    return env


def _naiad_only() -> Path:
    """A directory holding only a link to the naiad package, for the environment's sys.path."""
    package = Path(__file__).resolve().parents[2]  # .../naiad
    shim = cache_dir() / "naiad-path"
    link = shim / "naiad"
    with _unpack_lock:
        shim.mkdir(parents=True, exist_ok=True)
        if not link.exists() or link.resolve() != package:
            if link.is_symlink():
                link.unlink()
            link.symlink_to(package, target_is_directory=True)
    return shim
