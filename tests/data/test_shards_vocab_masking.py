"""shards.py round trip / kinds / atomicity, vocab.py load+train, instances.mask_tokens invariants."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

from bertforge.data import shards
from bertforge.data.instances import mask_batch, mask_tokens, num_to_predict, reference_mask_tokens
from bertforge.data.shardset import ShardSet, list_shards, read_attrs
from bertforge.data.vocab import continuation_table, load_tokenizer, special_ids, train_wordpiece
from bertforge.errors import UserError


def _arrays(n=5, s=16, p=4, seed=0):
    rng = np.random.default_rng(seed)
    return {
        "input_ids": rng.integers(0, 30528, (n, s)).astype(np.int32),
        "input_mask": np.ones((n, s), np.int8),
        "segment_ids": rng.integers(0, 2, (n, s)).astype(np.int8),
        "masked_lm_positions": rng.integers(1, s, (n, p)).astype(np.int32),
        "masked_lm_ids": rng.integers(0, 30522, (n, p)).astype(np.int32),
        "next_sentence_labels": rng.integers(0, 2, n).astype(np.int8),
    }


def test_round_trip_and_kind(tmp_path):
    a = _arrays()
    path = shards.write_shard(tmp_path / "s_0.hdf5", a)
    b = shards.read_shard(path)
    assert set(a) == set(b)
    for k in a:
        assert b[k].dtype == a[k].dtype and np.array_equal(a[k], b[k])
    assert ShardSet.open(path).kind == "nvidia"
    with h5py.File(path) as f:
        assert f["input_ids"].compression == "gzip"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left behind


def test_byte_identical_rewrites(tmp_path):
    a = _arrays()
    p1 = shards.write_shard(tmp_path / "a.hdf5", a)
    p2 = shards.write_shard(tmp_path / "b.hdf5", a)
    assert p1.read_bytes() == p2.read_bytes()


def test_dynamic_and_packed_kinds(tmp_path):
    a = _arrays()
    dyn = {k: a[k] for k in ("input_ids", "input_mask", "segment_ids", "next_sentence_labels")}
    p = shards.write_shard(tmp_path / "d.hdf5", dyn, attrs={"bertforge_kind": "dynamic", "mask_id": 103})
    assert ShardSet.open(p).kind == "dynamic"
    assert read_attrs(p)["mask_id"] == 103
    packed = dict(a, next_sentence_positions=np.zeros((5, 3), np.int32))
    assert ShardSet.open(shards.write_shard(tmp_path / "p.hdf5", packed)).kind == "packed"


def test_list_shards_numeric(tmp_path):
    for i in (10, 2, 1):
        shards.write_shard(tmp_path / f"train_{i}.hdf5", _arrays(2))
    (tmp_path / ".train_3.hdf5.tmp1").write_bytes(b"x")
    (tmp_path / "manifest.json").write_text("{}")
    assert [p.name for p in list_shards(tmp_path)] == ["train_1.hdf5", "train_2.hdf5", "train_10.hdf5"]


def test_truncated_and_corrupt(tmp_path):
    a = _arrays()
    a["masked_lm_ids"] = a["masked_lm_ids"][:3]
    with pytest.raises(UserError, match="truncated"):
        shards.validate_arrays(a, "x.hdf5")
    bad = tmp_path / "bad.hdf5"
    bad.write_bytes(b"not hdf5")
    with pytest.raises(UserError, match="bad.hdf5"):
        shards.read_shard(bad)


# ---------------------------------------------------------------------------------------------- vocab
def test_load_vocab_txt_and_missing_specials(tmp_path):
    toks = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello", "world", "##s", "un", "##able"]
    (tmp_path / "vocab.txt").write_text("\n".join(toks) + "\n")
    tok = load_tokenizer(tmp_path / "vocab.txt")
    assert tok.encode("Hello worlds", add_special_tokens=False).tokens == ["hello", "world", "##s"]
    assert special_ids(tok) == {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}
    assert continuation_table(tok).tolist() == [t.startswith("##") for t in toks]
    (tmp_path / "bad.txt").write_text("\n".join(t for t in toks if t != "[MASK]") + "\n")
    with pytest.raises(UserError, match=r"bad.txt.*\[MASK\]"):
        load_tokenizer(tmp_path / "bad.txt")
    with pytest.raises(UserError, match="does not exist"):
        load_tokenizer(tmp_path / "nope.txt")


def test_train_wordpiece(tmp_path, tiny_corpus):
    tok = train_wordpiece([tiny_corpus], tmp_path / "v", vocab_size=200, unused_tokens=3)
    lines = (tmp_path / "v" / "vocab.txt").read_text().split("\n")[:-1]
    assert lines[:8] == ["[PAD]", "[unused0]", "[unused1]", "[unused2]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    again = load_tokenizer(tmp_path / "v")  # tokenizer.json
    from_txt = load_tokenizer(tmp_path / "v" / "vocab.txt", lowercase=True)
    text = "Document Seven talks about Numbers."
    assert again.encode(text).ids == from_txt.encode(text).ids == tok.encode(text).ids
    assert again.encode(text).tokens[0] == "[CLS]"


def test_bert_uncased_vocab(shared_data):
    tok = load_tokenizer(shared_data / "bert_vocab" / "bert-base-uncased-vocab.txt")
    assert special_ids(tok) == {"pad": 0, "unk": 100, "cls": 101, "sep": 102, "mask": 103}
    assert tok.encode("The Unaffable café", add_special_tokens=False).tokens == ["the", "una", "##ffa", "##ble", "cafe"]


# ---------------------------------------------------------------------------------------------- masking
def _seq(length, a_len):
    """[CLS] A [SEP] B [SEP] with word ids 1000.."""
    body = np.arange(1000, 1000 + length - 3)
    return np.concatenate([[101], body[:a_len], [102], body[a_len:], [102]]).astype(np.int32)


@pytest.mark.parametrize(
    "length,max_pred", [(8, 20), (10, 20), (20, 20), (33, 20), (50, 20), (128, 20), (200, 20), (300, 80), (512, 80)]
)
def test_masked_count_exact(length, max_pred):
    rng = np.random.default_rng(length)
    for _ in range(20):
        toks = _seq(length, length // 3)
        ids, pos, lab = mask_tokens(toks, rng, vocab_size=30522, max_pred=max_pred)
        n = int((pos > 0).sum())
        assert n == min(max_pred, max(1, round(0.15 * length)))
        real = pos[:n]
        assert np.all(np.diff(real) > 0) and np.all(pos[n:] == 0) and np.all(lab[n:] == 0)
        assert np.array_equal(lab[:n], toks[real])
        assert not np.isin(real, [0, length // 3 + 1, length - 1]).any()  # never CLS/SEP
        unchanged = np.ones(length, bool)
        unchanged[real] = False
        assert np.array_equal(ids[unchanged], toks[unchanged])


def test_padded_row_with_length():
    toks = np.zeros(64, np.int32)
    toks[:30] = _seq(30, 10)
    ids, pos, _ = mask_tokens(toks, np.random.default_rng(0), 30522, 20, length=30)
    assert (pos > 0).sum() == round(0.15 * 30) and pos.max() < 30 and np.all(ids[30:] == 0)


def test_num_to_predict_table():
    assert num_to_predict(np.array([3, 10, 128, 512, 1000]), 20, 0.15).tolist() == [1, 2, 19, 20, 20]
    assert num_to_predict(512, 80, 0.15).tolist() == 77


def _stats(fn, draws=3000):
    rng = np.random.default_rng(7)
    toks = _seq(100, 40)
    mask = keep = rand = 0
    hits = np.zeros(100)
    for _ in range(draws):
        ids, pos, lab = fn(toks, rng)
        n = int((pos > 0).sum()) if isinstance(pos, np.ndarray) else len(pos)
        pos = np.asarray(pos[:n])
        hits[pos] += 1
        out = np.asarray(ids)[pos]
        mask += (out == 103).sum()
        keep += (out == toks[pos]).sum()
        rand += ((out != 103) & (out != toks[pos])).sum()
    total = mask + keep + rand
    return mask / total, keep / total, rand / total, hits


def test_80_10_10_and_uniform_positions_match_reference():
    fast = _stats(lambda t, r: mask_tokens(t, r, 30522, 20))
    ref = _stats(lambda t, r: reference_mask_tokens(t.tolist(), r, 30522, 20))
    for stats in (fast, ref):
        m, k, r, hits = stats
        # 45000 draws: the std of a proportion near 0.1 is ~0.0014; 5 sigma bounds
        assert abs(m - 0.8) < 0.01 and abs(k - 0.1) < 0.008 and abs(r - 0.1) < 0.008
        cand = hits[np.r_[1:41, 42:99]]
        assert hits[[0, 41, 99]].sum() == 0
        assert cand.std() / cand.mean() < 0.1  # every candidate equally likely
    # same distribution of per-position hit rates
    assert np.abs(fast[3] - ref[3]).max() / fast[3].max() < 0.2


def test_whole_word_masking_groups():
    rng = np.random.default_rng(3)
    toks = _seq(60, 20)
    starts = np.ones(60, bool)
    starts[np.r_[5:8, 30:33]] = False  # words [4..7] and [29..32]
    for _ in range(300):
        ids, pos, lab = mask_tokens(toks, rng, 30522, 20, word_starts=starts)
        real = set(pos[pos > 0].tolist())
        assert len(real) <= round(0.15 * 60)
        for word in (range(4, 8), range(29, 33)):
            inside = [p in real for p in word]
            assert all(inside) or not any(inside)


def test_wwm_matches_reference_distribution():
    toks = _seq(40, 15)
    starts = (np.arange(40) % 3) != 1
    fast_counts = np.zeros(40)
    ref_counts = np.zeros(40)
    r1, r2 = np.random.default_rng(1), np.random.default_rng(2)
    for _ in range(2000):
        _, pos, _ = mask_tokens(toks, r1, 30522, 20, word_starts=starts)
        fast_counts[pos[pos > 0]] += 1
        _, rpos, _ = reference_mask_tokens(toks.tolist(), r2, 30522, 20, word_starts=starts.tolist())
        ref_counts[rpos] += 1
    assert fast_counts.sum() == pytest.approx(ref_counts.sum(), rel=0.02)
    assert np.abs(fast_counts - ref_counts).max() < 0.2 * ref_counts.max()


def test_mask_batch_deterministic():
    ids = np.stack([_seq(50, 20), _seq(50, 10)])
    a = mask_batch(ids, np.array([50, 40]), np.random.default_rng(5), 30522, 20)
    b = mask_batch(ids, np.array([50, 40]), np.random.default_rng(5), 30522, 20)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert a[1][1].max() < 40
