"""Google BERT `create_pretraining_data` cases that `test_instances_reference.py` does not pin: the whole pipeline
(instances, truncation, masking) on one-document corpora and one-sentence documents, whole-word groups at the
truncation boundaries, Python's round in num_to_predict, random words from the whole vocab, the 512/80 rows
and the NVIDIA schema as the shard writer stores it.

`_google` below is Google's `create_training_instances` + `truncate_seq_pair` + `create_masked_lm_predictions`
(do_whole_word_mask included) on token ids, small enough to read against the original. The one deliberate
difference of DESIGN §3.1 is kept: a random-next B that 10 tries could only take from the same document is
labelled IsNext.
"""

from __future__ import annotations

import random
from collections import Counter

import h5py
import numpy as np
import pytest

from bertforge.data.instances import build_rows, create_instance_specs, mask_batch, num_to_predict
from bertforge.data.shards import ShardWriter

CLS, SEP, MASK = 101, 102, 103
SPECIALS = (0, CLS, SEP)


def _google(docs, seq, ssp, dupe, max_pred, vocab, rng, cont=None, prob=0.15):
    """Google's instances, token ids in, as (tokens before masking, masked positions, label) per instance."""
    docs = list(docs)
    rng.shuffle(docs)
    out = []
    for _ in range(dupe):
        for di, doc in enumerate(docs):
            max_num = seq - 3
            target = rng.randint(2, max_num) if rng.random() < ssp else max_num
            chunk, length, i = [], 0, 0
            while i < len(doc):
                chunk.append(doc[i])
                length += len(doc[i])
                if i == len(doc) - 1 or length >= target:
                    a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
                    a = [t for s in chunk[:a_end] for t in s]
                    if len(chunk) == 1 or rng.random() < 0.5:
                        for _ in range(10):
                            rd = rng.randint(0, len(docs) - 1)
                            if rd != di:
                                break
                        b = []
                        for s in docs[rd][rng.randint(0, len(docs[rd]) - 1) :]:
                            b.extend(s)
                            if len(b) >= target - len(a):
                                break
                        label = int(rd != di)  # DESIGN §3.1 (Google: 1 always)
                        i -= len(chunk) - a_end
                    else:
                        b, label = [t for s in chunk[a_end:] for t in s], 0
                    while len(a) + len(b) > max_num:  # truncate_seq_pair: the longer, B on ties
                        t = a if len(a) > len(b) else b
                        del t[0 if rng.random() < 0.5 else -1]
                    tokens = [CLS, *a, SEP, *b, SEP]
                    groups: list[list[int]] = []
                    for j, tok in enumerate(tokens):
                        if tok in (CLS, SEP):
                            continue
                        if cont is not None and groups and cont[tok]:
                            groups[-1].append(j)
                        else:
                            groups.append([j])
                    rng.shuffle(groups)
                    k = min(max_pred, max(1, int(round(len(tokens) * prob))))
                    picked: list[int] = []
                    for g in groups:
                        if len(picked) >= k:
                            break
                        if len(picked) + len(g) <= k:
                            picked += g
                    out.append((tuple(tokens), tuple(sorted(picked)), label))
                    chunk, length = [], 0
                i += 1
    rng.shuffle(out)
    return out


def _ours(docs, seq, ssp, dupe, max_pred, vocab, seed, cont=None):
    lens = [len(s) for d in docs for s in d]
    offsets = [0, *np.cumsum(lens).tolist()]
    counts = [len(d) for d in docs]
    firsts = [0, *np.cumsum(counts)[:-1].tolist()]
    tokens = np.array([t for d in docs for s in d for t in s], dtype=np.int32)
    rng = np.random.default_rng(seed)
    specs = create_instance_specs(firsts, counts, offsets, rng, seq, ssp, dupe)
    rows = build_rows(tokens, specs, seq, CLS, SEP)
    n = rows["input_mask"].sum(1, dtype=np.int64)
    starts = None if cont is None else ~cont[rows["input_ids"]]
    _, pos, _ = mask_batch(rows["input_ids"], n, rng, vocab, max_pred, 0.15, SPECIALS, MASK, starts)
    return [
        (tuple(rows["input_ids"][r, : n[r]].tolist()), tuple(p[p > 0].tolist()), int(specs["label"][r]))
        for r, p in enumerate(pos)
    ]


def _docs(*sentence_lengths):
    """Documents of distinct token ids (so a row tells where A and B start), one tuple of lengths each."""
    ids = iter(range(1000, 10**6))
    return [[[next(ids) for _ in range(n)] for n in doc] for doc in sentence_lengths]


def _max_z(want: Counter, got: Counter) -> float:
    """The largest standardized difference between two frequency tables (two-sample, per key)."""
    nw, ng = sum(want.values()), sum(got.values())
    z = 0.0
    for key in set(want) | set(got):
        pw, pg = want[key] / nw, got[key] / ng
        z = max(z, abs(pw - pg) / np.sqrt(max(pw, pg) * (1 / nw + 1 / ng)))
    return z


@pytest.mark.parametrize(
    "docs,seq,ssp,wwm",
    [
        (_docs((3, 9, 4, 7, 2, 6)), 16, 0.2, True),  # one document: random next from itself, labelled IsNext
        (_docs((20,)), 12, 0.0, False),  # one document of one sentence: A and B from the same sentence
        (_docs((5,), (9,), (2,), (30,)), 16, 0.5, True),  # one-sentence documents: always random next
    ],
)
def test_the_pipeline_draws_googles_instances_and_masks(docs, seq, ssp, wwm):
    cont = np.zeros(2000, bool)
    cont[1000::3] = True  # every third id continues a word (a "##" piece)
    cont = cont if wwm else None
    want: Counter = Counter()
    got: Counter = Counter()
    for seed in range(400):
        for table, rows in (
            (want, _google(docs, seq, ssp, 2, 4, 2000, random.Random(seed), cont)),
            (got, _ours(docs, seq, ssp, 2, 4, 2000, seed, cont)),
        ):
            table["rows", len(rows)] += 1
            for tokens, picked, label in rows:
                a = tokens.index(SEP) - 1
                # the pair (label, lengths, where truncation left A and B to start), its marginals (a sharp
                # test where the joint cells are thin) and each masked token
                pair = (label, a, len(tokens) - a - 3, tokens[1], tokens[a + 2])
                table.update([("pair", *pair), ("label", label), ("lengths", *pair[1:3]), ("starts", *pair[3:])])
                table["count", len(tokens), len(picked)] += 1
                table.update(("masked", tokens[p]) for p in picked)
    assert _max_z(want, got) < 5  # the same frequencies (a few hundred cells; 5 sigma: no chance failures)


def test_whole_word_groups_at_the_truncation_boundaries():
    # A truncated from the front starts with a "##" piece: it is a word of its own (Google: the first
    # candidate opens a group). B starting with a "##" piece joins A's last word across the [SEP] (Google
    # skips [CLS]/[SEP] without closing the group).
    row = np.array([[CLS, 7, 8, 9, SEP, 10, 11, SEP]], np.int32)
    starts = np.array([[1, 0, 1, 1, 1, 0, 1, 1]], bool)  # 7 and 10 are "##" pieces
    seen: Counter = Counter()
    rng = np.random.default_rng(0)
    for _ in range(600):
        # round(8 x 0.5) = 4 predictions: the groups are {1}, {2}, {3, 5}, {6}
        _, pos, _ = mask_batch(row, np.array([8]), rng, 50, 8, 0.5, SPECIALS, MASK, starts)
        picked = frozenset(pos[0][pos[0] > 0].tolist())
        assert (3 in picked) == (5 in picked)
        seen[picked] += 1
    assert set(seen) == {frozenset(s) for s in ({1, 2, 3, 5}, {1, 3, 5, 6}, {2, 3, 5, 6}, {1, 2, 6})}


def test_num_to_predict_rounds_as_pythons_round():
    lengths = np.arange(0, 600)
    for prob in (0.15, 0.1, 0.25, 0.3, 0.5):
        for max_pred in (20, 80, 600):
            want = [min(max_pred, max(1, int(round(n * prob)))) for n in lengths.tolist()]
            assert num_to_predict(lengths, max_pred, prob).tolist() == want
    # the halves round to even: 1.5 -> 2, 4.5 -> 4, 2.5 -> 2
    assert num_to_predict(np.array([10, 30]), 20, 0.15).tolist() == [2, 4]
    assert num_to_predict(10, 20, 0.25) == 2


def test_random_words_come_from_the_whole_vocab_special_tokens_included():
    # Google: `vocab_words[rng.randint(0, len(vocab_words) - 1)]` over every vocab entry
    row = np.array([[1, 5, 5, 5, 5, 5, 5, 5, 5, 2]], np.int32)
    seen = set()
    rng = np.random.default_rng(0)
    for _ in range(200):
        ids, pos, _ = mask_batch(row, np.array([10]), rng, 8, 10, 0.5, (0, 1, 2), 3, split=(0.0, 1.0))
        seen.update(ids[0, pos[0][pos[0] > 0]].tolist())
    assert seen == set(range(8))


def test_phase_two_rows_in_the_nvidia_schema(tmp_path):
    # 512/80: a full row predicts round(512 x 0.15) = 77; the count is the index of the first 0 in the
    # positions (position 0 is [CLS]); never [CLS]/[SEP]/padding
    docs = _docs(*[(40, 90, 130, 70, 60, 200, 30)] * 6)
    tokens = np.array([t for d in docs for s in d for t in s], dtype=np.int32)
    lens = [len(s) for d in docs for s in d]
    rng = np.random.default_rng(1)
    specs = create_instance_specs([0, 7, 14, 21, 28, 35], [7] * 6, [0, *np.cumsum(lens).tolist()], rng, 512, 0.1, 2)
    rows = build_rows(tokens, specs, 512, CLS, SEP)
    n = rows["input_mask"].sum(1, dtype=np.int64)
    ids, pos, lab = mask_batch(rows["input_ids"], n, rng, 30522, 80, 0.15, SPECIALS, MASK)
    count = np.where((pos == 0).any(1), (pos == 0).argmax(1), 80)
    assert count.tolist() == num_to_predict(n, 80, 0.15).tolist() and 77 in count.tolist()
    for r in range(len(ids)):
        real = pos[r, : count[r]]
        assert not pos[r, count[r] :].any() and not lab[r, count[r] :].any()
        assert (real < n[r]).all() and not np.isin(rows["input_ids"][r, real], SPECIALS).any()
    arrays = {
        **rows,
        "input_ids": ids,
        "masked_lm_positions": pos,
        "masked_lm_ids": lab,
        "next_sentence_labels": specs["label"],
    }
    dtypes = {
        "input_ids": "int32",
        "input_mask": "int8",
        "segment_ids": "int8",
        "masked_lm_positions": "int32",
        "masked_lm_ids": "int32",
        "next_sentence_labels": "int8",
    }
    path = tmp_path / "train_0.hdf5"
    with ShardWriter(path, {k: (arrays[k].shape, np.dtype(t)) for k, t in dtypes.items()}, chunk_rows=16) as w:
        for a in range(0, len(ids), 16):
            w.write(a, {k: arrays[k][a : a + 16] for k in dtypes})
    with h5py.File(path) as f:
        assert list(f) == list(dtypes)  # the NVIDIA order, no masked_lm_weights
        for k, t in dtypes.items():
            assert f[k].dtype == np.dtype(t) and f[k].compression == "gzip"
            assert np.array_equal(f[k][()], arrays[k])
    assert [p.name for p in tmp_path.iterdir()] == ["train_0.hdf5"]  # no temporary left beside it
