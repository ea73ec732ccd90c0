"""Write model repositories for tests: config.pbtxt text plus ONNX files from examples/build_models."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

ModelWriter = Callable[[Path], None]


def write_model(repo: Path, name: str, config: str | None, versions: dict[int, ModelWriter],
                filename: str = "model.onnx") -> Path:
    """Create `repo/name` with an optional config.pbtxt and one writer call per version directory."""
    model_dir = repo / name
    model_dir.mkdir(parents=True, exist_ok=True)
    if config is not None:
        (model_dir / "config.pbtxt").write_text(config)
    for version, writer in versions.items():
        version_dir = model_dir / str(version)
        version_dir.mkdir(exist_ok=True)
        writer(version_dir / filename)
    return model_dir
