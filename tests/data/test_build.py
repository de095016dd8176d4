"""Instance creation (Google BERT algorithm) and the streaming shard builder: invariants, determinism, errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bertforge.data import shards
from bertforge.data.build import Job, build_shard, run_shards
from bertforge.data.config import ShardsConfig
from bertforge.data.instances import (
    build_rows,
    create_instance_specs,
    num_to_predict,
    reference_truncate,
    truncate_amounts,
)
from bertforge.data.shardset import ShardSet, list_shards, read_attrs
from bertforge.data.vocab import train_wordpiece
from bertforge.errors import UserError
from bertforge.runtime.io import file_sha256

WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "zeta",
    "eta",
    "theta",
    "iota",
    "kappa",
    "lambda",
    "mu",
    "nu",
    "xi",
    "omicron",
    "pi",
    "rho",
    "sigma",
    "tau",
    "upsilon",
    "phi",
    "chi",
    "psi",
    "omega",
    "river",
    "mountain",
    "forest",
    "city",
    "village",
    "ocean",
    "desert",
    "island",
    "valley",
]


def _corpus(path, n_docs=40, seed=0):
    rng = np.random.default_rng(seed)
    docs = []
    for _ in range(n_docs):
        sents = [
            " ".join(rng.choice(WORDS, rng.integers(3, 25))).capitalize() + "." for _ in range(rng.integers(1, 12))
        ]
        docs.append("\n".join(sents))
    path.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("build")
    docs = d / "docs"
    docs.mkdir()
    _corpus(docs / "docs_0.txt", 40, 0)
    _corpus(docs / "docs_1.txt", 40, 1)
    train_wordpiece([docs / "docs_0.txt", docs / "docs_1.txt"], d / "vocab", vocab_size=120)
    return d, docs, d / "vocab" / "tokenizer.json"


def _params(**kw):
    base = dict(seq_len=48, max_pred=8, dupe_factor=3, num_shards=3, seed=7)
    base.update(kw)
    return ShardsConfig(**base)


def _quiet(*_a, **_k):
    pass


def test_truncate_closed_form_matches_google_loop():
    la, lb = np.meshgrid(np.arange(1, 60), np.arange(1, 60))
    ra, rb = truncate_amounts(la.ravel(), lb.ravel(), 45)
    for a, b, x, y in zip(la.ravel(), lb.ravel(), ra, rb):
        assert (x, y) == reference_truncate(int(a), int(b), 45)


def test_instance_specs_rules():
    # 30 documents of 1..9 sentences of 1..30 tokens
    rng = np.random.default_rng(0)
    counts = rng.integers(1, 10, 30)
    lens = rng.integers(1, 31, int(counts.sum()))
    offsets = np.concatenate([[0], np.cumsum(lens)])
    first = np.concatenate([[0], np.cumsum(counts)[:-1]])
    specs = create_instance_specs(
        first.tolist(),
        counts.tolist(),
        offsets.tolist(),
        np.random.default_rng(1),
        max_seq_len=64,
        short_seq_prob=0.1,
        dupe_factor=4,
    )
    assert np.all(specs["a_len"] >= 1) and np.all(specs["b_len"] >= 1)
    assert np.all(specs["a_len"] + specs["b_len"] <= 61)
    doc_of_token = np.repeat(np.arange(30), [offsets[f + c] - offsets[f] for f, c in zip(first, counts)])
    # A lies inside one document; for IsNext, B follows A in the same document
    a_doc = doc_of_token[specs["a_start"]]
    assert np.all(doc_of_token[specs["a_start"] + specs["a_len"] - 1] == a_doc)
    isnext = specs["label"] == 0
    assert np.all(doc_of_token[specs["b_start"][isnext]] == a_doc[isnext])
    rnd = specs["label"] == 1
    assert np.all(doc_of_token[specs["b_start"][rnd]] != a_doc[rnd])
    assert 0.4 < rnd.mean() < 0.7


def test_build_rows_layout():
    tokens = np.arange(10, 110, dtype=np.int32)
    specs = {
        "a_start": np.array([0, 50]),
        "a_len": np.array([3, 1]),
        "b_start": np.array([20, 60]),
        "b_len": np.array([2, 4]),
    }
    rows = build_rows(tokens, specs, 12, cls_id=2, sep_id=3)
    assert rows["input_ids"].tolist() == [
        [2, 10, 11, 12, 3, 30, 31, 3, 0, 0, 0, 0],
        [2, 60, 3, 70, 71, 72, 73, 3, 0, 0, 0, 0],
    ]
    assert rows["segment_ids"].tolist() == [[0, 0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0], [0, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0, 0]]
    assert rows["input_mask"].tolist() == [[1] * 8 + [0] * 4] * 2


def test_shards_invariants(setup, tmp_path):
    d, docs, vocab = setup
    res = run_shards(docs, vocab, tmp_path / "out", _params(), log=_quiet)
    files = list_shards(tmp_path / "out")
    assert [f.name for f in files] == ["train_0.hdf5", "train_1.hdf5", "train_2.hdf5"]
    man = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert man["instances"] == res["train"]["instances"] > 100
    assert [s["sha256"] for s in man["shards"]] == [file_sha256(f) for f in files]
    assert man["special_ids"] == [0, 2, 3] and man["mask_id"] == 4
    total_rnd = total = 0
    for f in files:
        a = shards.read_shard(f)
        assert ShardSet.open(f).kind == "nvidia"
        assert a["input_ids"].dtype == np.int32 and a["input_mask"].dtype == np.int8
        assert a["masked_lm_positions"].shape[1] == 8 and a["next_sentence_labels"].dtype == np.int8
        lens = a["input_mask"].sum(1)
        for r in range(a["input_ids"].shape[0]):
            n = lens[r]
            assert np.all(a["input_mask"][r, :n] == 1) and np.all(a["input_mask"][r, n:] == 0)
            assert np.all(a["input_ids"][r, n:] == 0)
            seg = a["segment_ids"][r]
            first_b = int(np.argmax(seg)) if seg.any() else n
            assert a["input_ids"][r, 0] == 2 and a["input_ids"][r, first_b - 1] == 3 and a["input_ids"][r, n - 1] == 3
            assert np.all(seg[:first_b] == 0) and np.all(seg[first_b:n] == 1) and np.all(seg[n:] == 0)
            pos = a["masked_lm_positions"][r]
            k = int((pos > 0).sum())
            assert k == min(8, max(1, round(0.15 * n)))
            assert np.all(np.diff(pos[:k]) > 0) and not np.isin(pos[:k], [0, first_b - 1, n - 1]).any()
        total_rnd += int(a["next_sentence_labels"].sum())
        total += a["next_sentence_labels"].size
    assert 0.4 < total_rnd / total < 0.65  # Google's algorithm: ~50%, a little more from one-sentence chunks


def test_deterministic_and_dynamic_equals_unmasked(setup, tmp_path):
    d, docs, vocab = setup
    run_shards(docs, vocab, tmp_path / "a", _params(workers=1), log=_quiet)
    run_shards(docs, vocab, tmp_path / "b", _params(workers=2), log=_quiet)
    for fa, fb in zip(list_shards(tmp_path / "a"), list_shards(tmp_path / "b")):
        assert fa.read_bytes() == fb.read_bytes()  # same seed and shard count -> byte-identical
    run_shards(docs, vocab, tmp_path / "c", _params(seed=8), log=_quiet)
    assert list_shards(tmp_path / "c")[0].read_bytes() != list_shards(tmp_path / "a")[0].read_bytes()
    run_shards(docs, vocab, tmp_path / "dyn", _params(dynamic_masking=True, wwm=True), log=_quiet)
    for fa, fd in zip(list_shards(tmp_path / "a"), list_shards(tmp_path / "dyn")):
        a, dyn = shards.read_shard(fa), shards.read_shard(fd)
        assert ShardSet.open(fd).kind == "dynamic" and "masked_lm_positions" not in dyn
        assert read_attrs(fd)["mask_id"] == 4 and dyn["word_starts"].shape == dyn["input_ids"].shape
        # the same instances: restoring the labels at the masked positions gives the unmasked pairs
        ids = a["input_ids"].copy()
        rows, slots = np.nonzero(a["masked_lm_positions"])
        ids[rows, a["masked_lm_positions"][rows, slots]] = a["masked_lm_ids"][rows, slots]
        assert np.array_equal(ids, dyn["input_ids"])
        assert np.array_equal(a["segment_ids"], dyn["segment_ids"])
        assert np.array_equal(a["next_sentence_labels"], dyn["next_sentence_labels"])


def test_distinct_seeds_per_shard(setup, tmp_path):
    d, docs, vocab = setup
    spill = tmp_path / "spill.txt"
    spill.write_text((docs / "docs_0.txt").read_text())
    params = _params()
    outs = []
    for i in (0, 1):
        job = Job(i, "train", str(spill), str(tmp_path / f"s{i}.hdf5"), params.content(), "h", str(vocab), None)
        build_shard(job)
        outs.append(shards.read_shard(tmp_path / f"s{i}.hdf5"))
    # the same documents, different shard index -> different instances and masks
    assert not np.array_equal(outs[0]["masked_lm_positions"][:50], outs[1]["masked_lm_positions"][:50])


def test_rerun_skips_and_eval_split(setup, tmp_path):
    d, docs, vocab = setup
    p = _params(eval_fraction=0.2, eval_shards=2)
    run_shards(docs, vocab, tmp_path / "tr", p, eval_dir=tmp_path / "ev", log=_quiet)
    first = (tmp_path / "tr" / "train_1.hdf5").stat().st_mtime_ns
    (tmp_path / "tr" / "train_2.hdf5").unlink()  # as if killed before this shard finished
    res = run_shards(docs, vocab, tmp_path / "tr", p, eval_dir=tmp_path / "ev", log=_quiet)
    assert (tmp_path / "tr" / "train_1.hdf5").stat().st_mtime_ns == first
    skipped = {s["file"]: s["skipped"] for s in res["train"]["shards"]}
    assert skipped == {"train_0.hdf5": True, "train_1.hdf5": True, "train_2.hdf5": False}
    ev = res["eval"]
    assert len(ev["shards"]) == 2 and ev["documents"] > 0
    assert ev["documents"] + res["train"]["documents"] == 80
    assert not [f for f in (tmp_path / "tr").iterdir() if f.name.startswith(".")]


def test_errors(setup, tmp_path):
    d, docs, vocab = setup
    with pytest.raises(UserError, match="seq-len"):
        run_shards(docs, vocab, tmp_path / "o", _params(seq_len=7), log=_quiet)
    (tmp_path / "empty.txt").write_text("\n\n\n")
    with pytest.raises(UserError, match="empty"):
        run_shards(tmp_path / "empty.txt", vocab, tmp_path / "o", _params(), log=_quiet)
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 au lait.\n".encode("latin-1"))
    with pytest.raises(UserError, match="latin1.txt.*UTF-8"):
        run_shards(tmp_path / "latin1.txt", vocab, tmp_path / "o", _params(), log=_quiet)
    (tmp_path / "v.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\nalpha\n")
    with pytest.raises(UserError, match=r"v.txt.*\[MASK\]"):
        run_shards(docs, tmp_path / "v.txt", tmp_path / "o", _params(), log=_quiet)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(UserError, match="not writable"):
        run_shards(docs, vocab, blocker / "out", _params(), log=_quiet)
    with pytest.raises(UserError, match="not found"):
        run_shards(tmp_path / "nope*.txt", vocab, tmp_path / "o", _params(), log=_quiet)


def test_masked_count_formula_in_shards_wwm(setup, tmp_path):
    d, docs, vocab = setup
    run_shards(docs, vocab, tmp_path / "w", _params(wwm=True, num_shards=1), log=_quiet)
    a = shards.read_shard(list_shards(tmp_path / "w")[0])
    k = (a["masked_lm_positions"] > 0).sum(1)
    assert np.all(k <= num_to_predict(a["input_mask"].sum(1), 8, 0.15))
    assert k.mean() > 0.8 * num_to_predict(a["input_mask"].sum(1), 8, 0.15).mean()


def test_ascii_fast_path_identical(shared_data):
    from bertforge.data.build import encode_lines
    from bertforge.data.vocab import load_tokenizer

    lines = [
        "Hello World, it's 1999 -- OK?",
        "Café crème brûlée",
        "tab\there",
        "ctrl\x07char",
        "UPPER lower",
        "中文字符 and text",
        "naïve façade",
        "x" * 150,
        "  spaced   out  ",
        "Ω omega",
        "",
        "e\u0301",
    ]
    raw = (shared_data / "wikitext-2" / "raw" / "wiki.test.raw").read_text(encoding="utf-8").split("\n")[:400]
    for vocab, lower in (("bert-base-uncased-vocab.txt", None), ("bert-base-cased-vocab.txt", False)):
        tok = load_tokenizer(shared_data / "bert_vocab" / vocab, lower)
        ref = [e.ids for e in tok.encode_batch_fast(lines + raw, add_special_tokens=False)]
        assert encode_lines(tok, lines + raw) == ref


def test_shards_left_empty_by_a_tiny_corpus_are_named_with_the_fix(setup, tmp_path):
    """Three documents dealt into eight shards leave some with no instances: said in one line naming the
    option, and the empty shards are still valid (readable, 0 rows), so a training run over them works."""
    _, docs, vocab = setup
    _corpus(tmp_path / "three.txt", 3, 5)
    lines: list[str] = []
    res = run_shards(tmp_path / "three.txt", vocab, tmp_path / "o", _params(num_shards=8), log=lines.append)
    empty = sum(1 for s in res["train"]["shards"] if s["instances"] == 0)
    assert empty >= 5
    warn = [x for x in lines if "warning" in x]
    assert warn == [
        f"data shards: warning: {empty} of 8 train shards have no instances (3 documents in all): use fewer "
        f"shards (--shards {8 - empty}; data prepare: --set shards.num_shards={8 - empty}) or a larger corpus"
    ]
    assert ShardSet.open(tmp_path / "o").rows == res["train"]["instances"] > 0
    assert res["train"]["shards"][0]["instances"] == 0  # so the start-up sample must come from a later shard
    with pytest.raises(UserError, match=r"train_[1-7]\.hdf5"):
        ShardSet.open(tmp_path / "o").check_rows(5)  # ids past a 5-token vocab: found in the first shard with rows
    lines.clear()
    run_shards(docs, vocab, tmp_path / "full", _params(), log=lines.append)
    assert not [x for x in lines if "warning" in x]


def test_document_files_skip_temporary_files_folders_and_the_manifest(tmp_path):
    """A killed first `data docs` leaves hidden `.docs_N.tmp-PID.txt` files and no manifest: they were read as
    the corpus. `--docs 'dir/*'` hit sub-folders (IsADirectoryError) and the manifest (a JSON "document")."""
    from bertforge.data.build import document_files

    (tmp_path / "docs_0.txt").write_text("a\n")
    (tmp_path / ".docs_1.tmp-123.txt").write_text("half written\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "manifest.json").write_text("{}")
    assert [p.name for p in document_files(tmp_path)] == ["docs_0.txt"]
    assert [p.name for p in document_files(str(tmp_path / "*"))] == ["docs_0.txt"]


SPECIAL_LINES = [
    "Replace it with [MASK] or [SEP], [CLS], [PAD] here.\n",  # ASCII: the fast path
    "Replace it with [MASK] or [SEP], [CLS], [PAD] here, café.\n",  # the full tokenizer
]


def _pieces(tok, lines):
    from bertforge.data.build import encode_lines

    return [[tok.id_to_token(i) for i in ids] for ids in encode_lines(tok, lines)]


def _split_like_google(tok) -> None:
    """A literal [MASK]/[SEP]/[CLS]/[PAD] in corpus text is text, split as Google's BasicTokenizer splits it, on
    the ASCII fast path and the full path alike; it was a special id on some lines only (the full path matched
    it, the fast path lower-cased it first)."""
    ascii_line, other = _pieces(tok, SPECIAL_LINES)
    assert other[: len(ascii_line) - 1] == ascii_line[:-1], (ascii_line, other)  # the same split up to "here"
    spaced = [line.replace("[", "[ ").replace("]", " ]") for line in SPECIAL_LINES]  # no special token there
    assert [ascii_line, other] == _pieces(tok, spaced)
    assert not {"[MASK]", "[SEP]", "[CLS]", "[PAD]"} & {*ascii_line, *other}
    assert tok.encode("the [MASK] sat", add_special_tokens=False).tokens[1] == "[MASK]"  # fill-mask keeps its mask


@pytest.mark.parametrize("lower", [True, False])
def test_special_tokens_in_corpus_text_are_text(lower):
    from bertforge.data.vocab import wordpiece_from_vocab

    names = ["mask", "sep", "cls", "pad"]
    words = ["Replace", "replace", "it", "with", "or", "here", "caf", "##e", "##é", "[", "]", ",", ".", *names]
    words += [w.upper() for w in names]
    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words])}
    tok = wordpiece_from_vocab(vocab, lower)
    _split_like_google(tok)
    assert _pieces(tok, SPECIAL_LINES[:1])[0][3:6] == (["[", "mask", "]"] if lower else ["[", "MASK", "]"])


def test_special_tokens_in_corpus_text_with_googles_vocabs(shared_data):
    from bertforge.data.vocab import load_tokenizer

    for name in ("uncased", "cased"):
        _split_like_google(load_tokenizer(shared_data / "bert_vocab" / f"bert-base-{name}-vocab.txt"))
