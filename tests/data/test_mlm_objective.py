"""MLM-only data (issue 22): `data shards --objective mlm` rows, the loader's masking rate and replacement split,
the objective check at start-up, and byte-level BPE vocabs."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import h5py
import numpy as np
import pytest

from bertforge.cli import main
from bertforge.data.build import run_shards
from bertforge.data.config import ShardsConfig
from bertforge.data.instances import full_sentence_rows, mlm_row_count, num_to_predict
from bertforge.data.loader import PretrainLoader, eval_batches
from bertforge.data.shards import write_shard
from bertforge.data.shardset import ShardSet, list_shards
from bertforge.data.vocab import load_tokenizer, train_bpe, train_wordpiece
from bertforge.errors import UserError

CLS, SEP, MASK = 2, 3, 4


def _documents(n: int = 14) -> list[list[str]]:
    """Documents of different lengths (1 to 6 sentences), each word naming its document."""
    return [
        [f"document d{d} sentence {s} says {' '.join(['word'] * (s + d % 4))} w{d}x{s}." for s in range(1 + d % 6)]
        for d in range(n)
    ]


@pytest.fixture
def corpus(tmp_path) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text("\n\n".join("\n".join(doc) for doc in _documents()) + "\n", encoding="utf-8")
    return path


# ------------------------------------------------------------------------------------------- rows
def test_full_sentence_rows_reassemble_the_stream():
    # 5 documents of distinct tokens: sentence k of document d is ids 100*d + 10*k + (0..k)
    sents, doc_first, doc_count = [], [], []
    for d, n in enumerate((3, 1, 4, 2, 5)):
        doc_first.append(len(sents))
        doc_count.append(n)
        sents += [np.arange(100 * d + 10 * k, 100 * d + 10 * k + k + 1) for k in range(n)]
    tokens = np.concatenate(sents).astype(np.int32)
    offsets = np.concatenate([[0], np.cumsum([len(s) for s in sents])])
    docs = [tokens[offsets[f] : offsets[f + c]].tolist() for f, c in zip(doc_first, doc_count)]
    S, dupe = 12, 3
    blocks = list(
        full_sentence_rows(tokens, offsets, doc_first, doc_count, np.random.default_rng(0), S, dupe, CLS, SEP, 4)
    )
    rows = {k: np.concatenate([b[k] for b in blocks]) for k in blocks[0]}
    n = rows["input_ids"].shape[0]
    assert n == mlm_row_count(tokens.size, len(docs), dupe, S) and all(b["input_ids"].shape[0] <= 4 for b in blocks)
    lens = rows["input_mask"].sum(1)
    assert (lens[:-1] == S).all() and 3 <= lens[-1] <= S  # full rows but the last
    assert not rows["segment_ids"].any()
    stream = []
    for r, L in zip(rows["input_ids"], lens):
        assert r[0] == CLS and r[L - 1] == SEP and not r[L:].any()
        stream += r[1 : L - 1].tolist()
    pieces = " ".join(map(str, stream)).split(f" {SEP} ")  # documents between the separators
    assert Counter(pieces) == Counter({" ".join(map(str, d)): dupe for d in docs})


def test_data_shards_objective_mlm(corpus, tmp_path):
    vocab = tmp_path / "v"
    tok = train_wordpiece([corpus], vocab, vocab_size=200)
    params = ShardsConfig(objective="mlm", seq_len=24, num_shards=2, dupe_factor=2, workers=1, masked_lm_prob=0.3)
    params.max_pred = 4
    man = run_shards(corpus, vocab, tmp_path / "s", params, log=lambda *a: None)["train"]
    assert (man["kind"], man["objective"], man["tokenizer_model"]) == ("mlm", "mlm", "wordpiece")
    assert man["max_pred"] == 7  # round(24 * 0.3): the rate is not capped by --max-pred 4
    sep = tok.token_to_id("[SEP]")
    doc_ids = [
        " ".join(map(str, sum((tok.encode(s, add_special_tokens=False).ids for s in d), []))) for d in _documents()
    ]
    pieces: Counter[str] = Counter()
    for path in list_shards(tmp_path / "s"):
        with h5py.File(path, "r") as h:
            assert set(h) == {"input_ids", "input_mask", "segment_ids"}  # no NSP label, no stored masks
            assert h.attrs["bertforge_kind"] == "mlm"
            ids, mask, seg = h["input_ids"][()], h["input_mask"][()], h["segment_ids"][()]
        lens = mask.sum(1)
        assert (lens[:-1] == 24).all() and lens[-1] >= 3  # every row full but the shard's last
        assert not seg.any()  # no segment B
        stream = sum((r[1 : L - 1].tolist() for r, L in zip(ids, lens)), [])
        pieces.update(" ".join(map(str, stream)).split(f" {sep} "))
    assert pieces == Counter({d: 2 for d in doc_ids})  # each document twice, whole, a [SEP] between documents
    shards = ShardSet.open(tmp_path / "s")
    assert shards.kind == "mlm" and shards.objective == "mlm" and shards.max_pred == 7


# ------------------------------------------------------------------------------------------- masking
def _mlm_shard(directory: Path, rows: int = 400, S: int = 64, seed: int = 0) -> Path:
    """Full MLM-only rows of random ids from a 30k vocab ([PAD] [UNK] [CLS] [SEP] [MASK] = 0..4)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, 30000, (rows, S)).astype(np.int32)
    ids[:, 0], ids[:, -1] = CLS, SEP
    ids[:, S // 2] = SEP  # a document boundary
    attrs = {"bertforge_kind": "mlm", "max_pred": 10, "masked_lm_prob": 0.15, "vocab_size": 30000}
    attrs |= {"cls_id": CLS, "sep_id": SEP, "pad_id": 0, "mask_id": MASK, "wwm": False}
    arrays = {"input_ids": ids, "input_mask": np.ones((rows, S), np.int8), "segment_ids": np.zeros((rows, S), np.int8)}
    write_shard(directory / "train_0.hdf5", arrays, attrs)
    return directory


def _masking_counts(batches, originals: np.ndarray) -> dict[str, float]:
    n_tok = n_masked = n_mask = n_keep = n_rand = 0
    per_row = []
    row = 0
    for b in batches:
        assert "nsp_labels" not in b and not b["token_type_ids"].any()
        ids, pos, lab = b["input_ids"].numpy(), b["masked_positions"].numpy(), b["masked_labels"].numpy()
        for r in range(ids.shape[0]):
            p = pos[r][pos[r] != 0]
            orig = originals[row]
            row += 1
            assert (lab[r][: p.size] == orig[p]).all() and not np.isin(orig[p], (CLS, SEP)).any()
            got = ids[r][p]
            n_mask += int((got == MASK).sum())
            n_keep += int((got == orig[p]).sum())
            n_rand += int(((got != MASK) & (got != orig[p])).sum())
            n_tok += ids.shape[1]
            n_masked += p.size
            per_row.append(p.size)
    return {
        "rate": n_masked / n_tok,
        "mask": n_mask / n_masked,
        "keep": n_keep / n_masked,
        "rand": n_rand / n_masked,
        "n": n_masked,
        "per_row": per_row,
    }


@pytest.mark.parametrize("rate,split", [(0.15, (0.8, 0.1)), (0.30, (0.8, 0.1)), (0.30, (0.5, 0.3))])
def test_masking_rate_and_split(tmp_path, rate, split):
    d = _mlm_shard(tmp_path / "s")
    with h5py.File(d / "train_0.hdf5", "r") as h:
        originals = h["input_ids"][()]
    c = _masking_counts(eval_batches(d, 50, mlm_probability=rate, mask_split=split), originals)
    # every row predicts round(64 x rate) tokens (Google's count, not a cap): the rate within rounding of 1/64
    assert set(c["per_row"]) == {int(num_to_predict(64, 64, rate))}
    assert abs(c["rate"] - rate) <= 0.5 / 64
    for key, p in (("mask", split[0]), ("rand", split[1]), ("keep", 1 - split[0] - split[1])):
        sigma = (p * (1 - p) / c["n"]) ** 0.5
        assert abs(c[key] - p) < 4 * sigma + 1e-9, (key, c[key], p)


def test_masking_is_seeded_and_resumes(tmp_path):
    d = _mlm_shard(tmp_path / "s", rows=64)

    def loader(seed):
        return PretrainLoader.from_dir(d, 16, 8, 0, 1, seed, num_workers=0, mlm_probability=0.3)

    a = [next(it) for it in [loader(1).iterate()] for _ in range(12)]
    b = [next(it) for it in [loader(1).iterate()] for _ in range(12)]
    resumed = loader(1).iterate(start_batch=3)  # update 3 of 2 micro-batches each: item 6 on
    c = [next(resumed) for _ in range(6)]
    other = next(loader(2).iterate())
    for x, y in zip(a, b):
        assert all((x[k] == y[k]).all() for k in x)
    for x, y in zip(a[6:], c):
        assert all((x[k] == y[k]).all() for k in x)
    assert not (other["masked_positions"] == a[0]["masked_positions"]).all()
    assert a[0]["masked_positions"].shape[1] == 19  # slots widened from max_pred 10 to round(64 x 0.3)


def test_loader_settings_refused_for_stored_masks(tmp_path):
    from tests.train.conftest import make_shards  # NVIDIA-format shards: masks stored at creation

    d = make_shards(tmp_path / "nv", n_shards=1)
    with pytest.raises(UserError, match="masks were drawn when they were written"):
        PretrainLoader.from_dir(d, 8, 4, 0, 1, 0, num_workers=0, mlm_probability=0.3)
    with pytest.raises(UserError, match="train.objective is mlm but .* nvidia shards made for mlm_nsp"):
        ShardSet.open(d).check_objective("mlm")
    with pytest.raises(UserError, match="train.objective is mlm_nsp but .* mlm shards made for mlm"):
        ShardSet.open(_mlm_shard(tmp_path / "m", rows=8)).check_objective("mlm_nsp")


# ------------------------------------------------------------------------------------------- BPE
def test_bpe_vocab_is_byte_identical_and_a_multiple_of_64(corpus, tmp_path, capsys):
    outs = [tmp_path / f"b{i}" for i in range(3)]
    for out in outs:
        argv = ["data", "vocab", "--model", "bpe", "--docs", str(corpus), "--out", str(out), "--vocab-size", "300"]
        assert main([*argv, "--cased", "--min-frequency", "1"]) == 0
    assert "rounded up to 320 (a multiple of 64)" in capsys.readouterr().out
    first = (outs[0] / "tokenizer.json").read_bytes()
    assert all((o / "tokenizer.json").read_bytes() == first for o in outs[1:])
    assert not (outs[0] / "vocab.txt").exists()  # BPE: tokenizer.json alone (merges are part of the model)
    tok = load_tokenizer(outs[0])
    assert tok.get_vocab_size() == 320 and type(tok.model).__name__ == "BPE"
    assert [tok.token_to_id(t) for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")] == [0, 1, 2, 3, 4]
    text = "Document d3 says wörd — ☃ unseen!"
    assert tok.decode(tok.encode(text).ids).strip() == text  # byte-level: no [UNK], ever
    # [MASK] takes the space before it, as training masked a whole `Ġword`: no lone `Ġ` before it
    ids = tok.encode("says [MASK] unseen", add_special_tokens=False).ids
    assert [tok.id_to_token(i) for i in ids[:2]] == ["Ġsays", "[MASK]"]  # before: Ġsays Ġ [MASK]
    # a tiny corpus runs out of merges: [unusedN] pad the vocab to the multiple
    small = train_bpe([corpus], tmp_path / "small", vocab_size=4000, min_frequency=5)
    assert small.get_vocab_size() % 64 == 0 and small.token_to_id("[unused0]") is not None


def test_shards_from_a_bpe_vocab(corpus, tmp_path):
    train_bpe([corpus], tmp_path / "b", vocab_size=320, min_frequency=1)
    argv = ["data", "shards", "--docs", str(corpus), "--vocab", str(tmp_path / "b"), "--out", str(tmp_path / "s")]
    # MLM-only rows are full rows: a short-sequence probability would be ignored, so it is refused (the flag,
    # and a value other than the default in `data prepare`'s config; books_wiki's own 0.1 with mlm is fine)
    assert main([*argv, "--objective", "mlm", "--short-seq-prob", "0.3"]) == 2
    assert not (tmp_path / "s").exists()
    from bertforge.config import load_config
    from bertforge.errors import ConfigError

    with pytest.raises(ConfigError, match="shards.short_seq_prob .* would be ignored"):
        load_config("data", "books_wiki", ["shards.objective=mlm", "shards.short_seq_prob=0.5"])
    assert load_config("data", "books_wiki", ["shards.objective=mlm"]).shards.short_seq_prob == 0.1
    assert main([*argv, "--objective", "mlm", "--seq-len", "32", "--shards", "1", "--workers", "1"]) == 0
    man = json.loads((tmp_path / "s" / "manifest.json").read_text())
    assert (man["tokenizer_model"], man["kind"], man["vocab_size"]) == ("bpe", "mlm", 320)
    assert man["vocab"].endswith("/b")  # the directory: its tokenizer.json is the vocab
    assert main([*argv[:-1], str(tmp_path / "p"), "--seq-len", "32", "--shards", "1", "--workers", "1"]) == 0
    assert ShardSet.open(tmp_path / "p").kind == "nvidia"  # sentence pairs from the BPE vocab too
