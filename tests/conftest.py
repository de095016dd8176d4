"""Shared fixtures: offline hub settings, tiny models and tiny corpora built in tmp dirs, ../shared data."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """../shared/data, or skip the test when it is absent (the default suite never needs it)."""
    if not SHARED_DATA.is_dir():
        pytest.skip("../shared/data is absent")
    return SHARED_DATA


@pytest.fixture(scope="session", autouse=True)
def _isolated_cache(tmp_path_factory):
    """Keep bertforge's cache (the matmul peak) out of the user's home during tests: session-wide, so the module-
    and session-scoped fixtures that run a command (set up before any function-scoped fixture) use it too."""
    patch = pytest.MonkeyPatch()
    patch.setenv("BERTFORGE_CACHE", str(tmp_path_factory.getbasetemp() / "bertforge-cache"))
    yield
    patch.undo()


@pytest.fixture(scope="session")
def tiny_encoder_factory(tmp_path_factory):
    """make(words) -> a directory holding a tiny random pre-trained BERT (bertforge's own writer, Hugging Face
    format) with a word-level vocab.txt of the special tokens, "." and `words`."""

    def make(words) -> Path:
        import torch

        from bertforge.model import build_model
        from bertforge.model.config import BertConfig
        from bertforge.model.hf_interop import save_pretrained

        d = tmp_path_factory.mktemp("encoder")
        vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", *words]
        config = BertConfig.from_preset("tiny", vocab_size=len(vocab), max_position_embeddings=64)
        torch.manual_seed(0)
        save_pretrained(build_model(config, "pretraining"), config, d, "pretraining")
        (d / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
        return d

    return make


@pytest.fixture
def tiny_corpus(tmp_path) -> Path:
    """A few documents of plain English, one sentence per line, a blank line between documents."""
    docs = []
    for d in range(12):
        sents = [
            f"Document {d} talks about topic number {d % 5} in plain words.",
            f"The second sentence of document {d} adds a little more detail to it.",
            "Sentences are short so that tests stay fast on two cores.",
            f"Numbers like {d * 7} and {d * 13} make the documents differ from each other.",
            "A final sentence closes the document with a full stop.",
        ]
        docs.append("\n".join(sents))
    path = tmp_path / "corpus.txt"
    path.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def small_tmpfs(tmp_path):
    """`mount(size)` -> a fresh tmpfs of that size ("1m"): a real full disk. Skips the test where this user
    may not mount one (the injected-ENOSPC tests cover the same code); unmounted after the test."""
    import subprocess

    mounted: list[Path] = []

    def mount(size: str) -> Path:
        mnt = tmp_path / f"tmpfs_{len(mounted)}"
        mnt.mkdir()
        made = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)], capture_output=True)
        if made.returncode != 0:
            pytest.skip("cannot mount a tmpfs here (needs root); the injected-ENOSPC tests cover the same code")
        mounted.append(mnt)
        return mnt

    yield mount
    for mnt in mounted:
        subprocess.run(["umount", "-l", str(mnt)], check=False)  # lazy: a file a failed run left open


def segment_reference(q, k, v, meta, dropout_p, half_window=None):
    """The flash kernel's contract on (N, nh, D), written with traceable tensor ops: each token attends to the
    tokens of its own segment of meta.cu_seqlens (within half_window of it when given)."""
    import torch
    import torch.nn.functional as F

    idx = torch.arange(q.shape[0], device=q.device)
    seg = torch.searchsorted(meta.cu_seqlens[1:].long(), idx, right=True)  # (N,) segment of each token
    allowed = seg[:, None] == seg[None, :]
    if half_window is not None:
        allowed = allowed & ((idx[:, None] - idx[None, :]).abs() <= half_window)
    out = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), allowed)
    return out.transpose(0, 1)


@pytest.fixture
def flash_stand_in(monkeypatch):
    """The CUDA flash path taken on the CPU, with `segment_reference` as its kernel; records (cu_seqlens,
    indices, half_window) of every call: indices None in the segmented layout, the real tokens' when unpadded."""
    from bertforge.model import attention as attn

    seen = []

    def kernel(q, k, v, meta, dropout_p, half_window=None):
        seen.append((meta.cu_seqlens, meta.indices, half_window))
        return segment_reference(q, k, v, meta, dropout_p, half_window)

    monkeypatch.setattr(attn, "varlen_usable", lambda h, d: True)
    monkeypatch.setattr(attn, "varlen", kernel)
    return seen


@pytest.fixture(scope="session")
def demo_mlm(tmp_path_factory) -> Path:
    """`data prepare --config demo_mlm` on builtin:python-docs (dupe factor 1: a few seconds): MLM-only shards,
    their eval shards and vocab, shared read-only by the tests that train or benchmark on them."""
    from bertforge.cli import main

    root = tmp_path_factory.mktemp("demo_mlm")
    sets = [f"output_dir={root}", "shards.dupe_factor=1", "shards.num_shards=2", "shards.workers=1"]
    assert main(["data", "prepare", "--config", "demo_mlm", *[a for s in sets for a in ("--set", s)]]) == 0
    return root
