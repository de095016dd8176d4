"""ModernBERT past 512 tokens through every stage that takes a length: MLM-only shards of 2,048-token rows,
training on them, SQuAD fine-tuning with 1,024-token windows, and serving (fill-mask, classify) of ~1,000-token
texts, each checked against transformers on the same weights where transformers has the same function. Rows
this long run the local layers in blocks (`BandMask`), so these tests also hold the blocked path to
transformers end to end."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from bertforge.cli import main  # noqa: E402
from bertforge.data.vocab import load_tokenizer, special_ids, train_bpe  # noqa: E402
from bertforge.serve.tasks import Limits, Predictor  # noqa: E402

NOUNS = ["river", "town", "engine", "garden", "letter", "window", "doctor", "harbour", "valley", "market", "song"]
VERBS = ["follows", "crosses", "repairs", "paints", "answers", "opens", "visits", "remembers", "carries"]
ADJS = ["old", "quiet", "bright", "narrow", "distant", "early", "heavy", "small", "northern"]


def sentence(rng: random.Random) -> str:
    return (
        f"The {rng.choice(ADJS)} {rng.choice(NOUNS)} {rng.choice(VERBS)} the {rng.choice(NOUNS)} "
        f"near the {rng.choice(ADJS)} {rng.choice(NOUNS)}."
    )


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """Documents of 20-60 generated sentences, one sentence per line, blank lines between documents."""
    rng = random.Random(0)
    docs = ["\n".join(sentence(rng) for _ in range(rng.randint(20, 60))) for _ in range(40)]
    path = tmp_path_factory.mktemp("corpus") / "docs.txt"
    path.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def vocab(corpus) -> Path:
    out = corpus.parent / "vocab"
    train_bpe([corpus], out, vocab_size=320, min_frequency=1)
    return out


def hf_config(vocab: Path, **kw):
    ids = special_ids(load_tokenizer(vocab))
    return transformers.ModernBertConfig(
        vocab_size=load_tokenizer(vocab).get_vocab_size(),
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=4,  # global, local, local, global
        num_attention_heads=2,
        max_position_embeddings=2048,
        local_attention=16,
        pad_token_id=ids["pad"],
        cls_token_id=ids["cls"],
        sep_token_id=ids["sep"],
        bos_token_id=ids["cls"],
        eos_token_id=ids["sep"],
        attn_implementation="eager",
        **kw,
    )


def hf_dir(vocab: Path, out: Path, cls_name: str, seed: int = 0, **kw):
    """A transformers ModernBERT with random weights, saved with our BPE tokenizer."""
    torch.manual_seed(seed)
    model = getattr(transformers, cls_name)(hf_config(vocab, **kw)).eval()
    model.save_pretrained(out)
    shutil.copy2(vocab / "tokenizer.json", out / "tokenizer.json")
    return model


def long_text(words: int, seed: int) -> str:
    rng = random.Random(seed)
    text = ""
    while len(text.split()) < words:
        text += sentence(rng) + " "
    return text.strip()


def test_shards_and_training_at_2048_tokens(corpus, vocab, tmp_path):
    shards = tmp_path / "shards"
    argv = ["data", "shards", "--docs", str(corpus), "--vocab", str(vocab), "--out", str(shards)]
    assert main([*argv, "--objective", "mlm", "--seq-len", "2048", "--shards", "1", "--workers", "1"]) == 0
    with h5py.File(next(shards.glob("*.hdf5"))) as f:
        lengths = f["input_mask"][:].sum(axis=1)  # (rows,)
    assert len(lengths) >= 3 and (lengths[:-1] == 2048).all()  # full rows but the shard's last
    sets = [
        "model.preset=modernbert-tiny",
        "model.max_position_embeddings=2048",
        f"data.input_dir={shards}",
        f"data.vocab={vocab}",
        "data.eval_dir=null",
        "data.num_workers=0",
        "train.objective=mlm",
        "train.max_steps=2",
        "train.global_batch_size=2",
        "train.micro_batch_size=1",
        "train.precision=fp32",
        "train.device=cpu",
        "train.save_every=2",
        f"train.output_dir={tmp_path / 'run'}",
        "optim.name=adamw",
        "optim.lr=1e-3",
    ]
    assert main(["pretrain", *(x for s in sets for x in ("--set", s))]) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["step"] == 2 and np.isfinite(summary["final_loss"])
    hf = transformers.AutoModelForMaskedLM.from_pretrained(summary["model_dir"])  # 2,048 positions, loads
    assert hf.config.max_position_embeddings == 2048


def test_fill_mask_served_on_a_1000_token_text_equals_transformers(vocab, tmp_path):
    hf = hf_dir(vocab, tmp_path / "mlm", "ModernBertForMaskedLM")
    lim = Limits(max_seq_len=1024, max_request_bytes=1 << 16)
    served = Predictor.from_dir("fill-mask", tmp_path / "mlm", lim)
    text = long_text(320, seed=1) + " The [MASK] opens the window. " + long_text(40, seed=2)
    out = served({"text": [text, "The [MASK] is small."]})  # two rows: the short one is padded
    ids = load_tokenizer(tmp_path / "mlm").encode(text).ids
    assert 900 < len(ids) <= 1024
    mask_id = special_ids(load_tokenizer(vocab))["mask"]
    with torch.inference_mode():
        logits = hf(input_ids=torch.tensor([ids])).logits[0]  # (T, V)
    want = torch.softmax(logits[[ids.index(mask_id)]], -1).topk(5)  # (1 mask, 5)
    assert out["token_ids"][0].tolist() == want.indices.tolist()
    np.testing.assert_allclose(out["scores"][0], want.values.numpy(), atol=1e-5)


def test_classify_served_on_long_and_short_texts_equals_transformers(vocab, tmp_path):
    hf = hf_dir(vocab, tmp_path / "cls", "ModernBertForSequenceClassification", seed=1, num_labels=3)
    lim = Limits(max_seq_len=1024, max_request_bytes=1 << 16)
    served = Predictor.from_dir("classify", tmp_path / "cls", lim)
    texts = [long_text(370, seed=3), "The old river."]
    out = served({"text": texts})
    tok = load_tokenizer(tmp_path / "cls")
    for row, text in enumerate(texts):
        ids = tok.encode(text).ids
        assert len(ids) <= 1024  # served uncut
        with torch.inference_mode():
            want = torch.softmax(hf(input_ids=torch.tensor([ids])).logits[0], -1).numpy()
        np.testing.assert_allclose(out["probabilities"][row], want, atol=1e-5)


def squad_file(path: Path, n: int, seed: int) -> Path:
    """SQuAD v1.1 JSON: n contexts of ~750 tokens, the answer near the end (past the first 512-token window)."""
    rng = random.Random(seed)
    paragraphs = []
    for i in range(n):
        head, answer = long_text(280, seed=seed * 100 + i), rng.choice(NOUNS)
        context = f"{head} The visitor found the {answer} at dawn. {long_text(20, seed=seed * 100 + i + 50)}"
        start = context.index(f"the {answer} at dawn") + 4
        qa = {"id": f"q{seed}-{i}", "question": "What did the visitor find at dawn?"}
        qa["answers"] = [{"text": answer, "answer_start": start}]
        paragraphs.append({"context": context, "qas": [qa]})
    path.write_text(json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": paragraphs}]}))
    return path


def test_squad_fine_tunes_with_1024_token_windows(vocab, tmp_path):
    from bertforge.finetune import squad

    hf_dir(vocab, tmp_path / "base", "ModernBertModel", seed=2)
    train, dev = squad_file(tmp_path / "train.json", 6, seed=1), squad_file(tmp_path / "dev.json", 3, seed=2)
    examples, _ = squad.read_squad(dev)
    tok = load_tokenizer(tmp_path / "base")
    windows = [len(squad.make_features(examples, tok, n, 256, 32, log=None).example_index) for n in (1024, 512)]
    assert windows[0] == len(examples) < windows[1]  # one 1,024-token window per context, where 512 needs two
    sets = ["task.max_seq_len=1024", "task.doc_stride=256", "task.max_query_len=32", "train.epochs=1"]
    sets += ["train.global_batch_size=2", "train.micro_batch_size=2", "train.precision=fp32", "train.device=cpu"]
    sets += ["train.plot=false", "train.tensorboard=false"]
    argv = ["finetune", "--task", "squad", "--model", str(tmp_path / "base"), "--train-file", str(train)]
    argv += ["--dev-file", str(dev), "--output-dir", str(tmp_path / "ft"), *(x for s in sets for x in ("--set", s))]
    assert main(argv) == 0
    summary = json.loads((tmp_path / "ft" / "summary.json").read_text())
    assert 0.0 <= summary["best"]["f1"] <= 100.0 and 0.0 <= summary["best"]["exact_match"] <= 100.0
    preds = json.loads((tmp_path / "ft" / "predictions.json").read_text())
    assert set(preds) == {e.qid for e in examples}
    best = transformers.AutoModelForQuestionAnswering.from_pretrained(tmp_path / "ft" / "best")
    assert best.config.model_type == "modernbert"
