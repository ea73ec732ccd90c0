"""The tiny models of `tiny_models`, built once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from llm.tiny_models import VARIANTS, build_tiny_model


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every variant, built once per session, by name."""
    root = tmp_path_factory.mktemp("tiny-models")
    return {variant: build_tiny_model(variant, root / variant) for variant in VARIANTS}
