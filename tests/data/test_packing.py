"""Histogram packing: strategies, sample assignment, packed rows, the two-pass shard writer and the CLI."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest

from bertforge.data import packing as pk
from bertforge.data import packing_algorithms as pa
from bertforge.data import packing_rows as pr
from bertforge.data.shards import read_shard, write_shard
from bertforge.data.shardset import PACKED_SCHEMA, ShardSet
from bertforge.errors import UserError


def make_samples(n: int, S: int = 64, P: int = 10, seed: int = 0, lengths=None) -> dict[str, np.ndarray]:
    """Unpacked NVIDIA-schema rows with recognisable content: token t of sample i is 1000*i + t + 1."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(4, S + 1, n) if lengths is None else np.asarray(lengths)
    n = len(lengths)
    col = np.arange(S)[None, :]
    real = col < lengths[:, None]
    ids = np.where(real, 1000 * np.arange(n)[:, None] + col + 1, 0).astype(np.int32)
    a_len = np.maximum(1, lengths // 2)
    seg = (real & (col > a_len[:, None])).astype(np.int8)
    pos = np.zeros((n, P), np.int32)
    for i, length in enumerate(lengths):
        k = min(P, max(1, round(0.15 * length)), length - 1)
        pos[i, :k] = np.sort(rng.choice(np.arange(1, length), k, replace=False))
    mids = np.where(pos != 0, 7 * pos + np.arange(n)[:, None], 0).astype(np.int32)
    return {
        "input_ids": ids,
        "input_mask": real.astype(np.int8),
        "segment_ids": seg,
        "masked_lm_positions": pos,
        "masked_lm_ids": mids,
        "next_sentence_labels": rng.integers(0, 2, n).astype(np.int8),
    }


@pytest.mark.parametrize("algorithm", ["spfhp", "lpfhp", "nnlshp"])
@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_strategy_packs_every_sequence_once_within_limits(algorithm, k):
    rng = np.random.default_rng(k)
    S = 64
    lengths = np.concatenate([rng.integers(1, S + 1, 3000), np.full(500, S), rng.integers(1, 9, 700)])
    h = pa.length_histogram(lengths, S)
    st = pa.pack_histogram(h, S, k, algorithm)
    st.check(h)  # every length count exactly, no pack over S or over k
    assert all(len(c) <= k and sum(c) <= S for c in st.combos)
    assert st.sequences == len(lengths)
    if k == 1:
        assert st.packs == len(lengths)
    packs = pa.assign_packs(lengths, st, np.random.default_rng(0))
    used = packs[packs >= 0]
    assert np.array_equal(np.sort(used), np.arange(len(lengths)))  # each sample exactly once
    per = np.where(packs >= 0, lengths[np.maximum(packs, 0)], 0).sum(1)
    assert per.max() <= S and ((packs >= 0).sum(1) <= k).all() and ((packs >= 0).sum(1) >= 1).all()


def test_strategy_check_catches_errors():
    h = pa.length_histogram(np.array([3, 3, 5]), 8)
    bad = pa.Strategy([(5, 3)], np.array([1]), 8, 3)  # one 3 missing
    with pytest.raises(AssertionError):
        bad.check(h)
    over = pa.Strategy([(5, 3, 3)], np.array([1]), 8, 3)  # 11 > 8
    with pytest.raises(AssertionError):
        over.check(h)


def test_known_small_cases():
    # two halves make one full row; lpfhp distributes a length over one pack, nnlshp solves for it, while
    # spfhp (as Graphcore's reference) opens one pack per sequence for a length that fits nowhere yet
    h = pa.length_histogram(np.array([4, 4, 8]), 8)
    for alg in ("lpfhp", "nnlshp"):
        st = pa.pack_histogram(h, 8, 3, alg)
        assert st.packs == 2 and st.efficiency == 1.0
    assert pa.spfhp(h, 8, 3).packs == 3
    # shortest-pack-first puts a sequence into the pack with the most room, longest-pack-first the least
    h = pa.length_histogram(np.array([6, 4, 2]), 8)
    assert set(pa.spfhp(h, 8, 2).combos) == {(6,), (4, 2)}
    assert set(pa.lpfhp(h, 8, 2).combos) == {(6, 2), (4,)}


def test_lengths_out_of_range_are_an_error():
    with pytest.raises(UserError):
        pa.length_histogram(np.array([0, 3]), 8)
    with pytest.raises(UserError):
        pa.length_histogram(np.array([9]), 8)


def test_assignment_is_deterministic_and_shuffled():
    lengths = np.random.default_rng(0).integers(1, 33, 2000)
    st = pa.lpfhp(pa.length_histogram(lengths, 32), 32, 3)
    a = pa.assign_packs(lengths, st, np.random.default_rng(5))
    b = pa.assign_packs(lengths, st, np.random.default_rng(5))
    c = pa.assign_packs(lengths, st, np.random.default_rng(6))
    assert np.array_equal(a, b) and not np.array_equal(a, c)


def test_packed_rows_content():
    S, P = 32, 6
    s = make_samples(4, S, P, lengths=[10, 12, 32, 5])
    packs = np.array([[0, 1, 3], [2, -1, -1], [3, -1, -1]])  # row 0: 27 tokens + 5 padding; row 2 ends in padding
    rows = pr.build_packed_rows(s, packs, width=P + 3)
    assert set(rows) == set(PACKED_SCHEMA)
    assert {k: v.dtype for k, v in rows.items()} == {k: np.dtype(t) for k, t in PACKED_SCHEMA.items()}
    r = {k: v[0] for k, v in rows.items()}
    assert np.array_equal(r["input_ids"][:10], s["input_ids"][0, :10])
    assert np.array_equal(r["input_ids"][10:22], s["input_ids"][1, :12])
    assert np.array_equal(r["input_ids"][22:27], s["input_ids"][3, :5])
    assert (r["input_ids"][27:] == 0).all() and (r["input_mask"][27:] == 0).all()
    assert np.array_equal(r["input_mask"][:27], [1] * 10 + [2] * 12 + [3] * 5)
    assert np.array_equal(r["positions"][:27], np.r_[np.arange(10), np.arange(12), np.arange(5)])
    assert np.array_equal(r["segment_ids"][10:22], s["segment_ids"][1, :12])
    assert np.array_equal(r["next_sentence_positions"], [0, 10, 22])
    assert np.array_equal(r["next_sentence_labels"], s["next_sentence_labels"][[0, 1, 3]])
    assert np.array_equal(r["next_sentence_weights"], [1, 1, 1])
    want_pos = np.concatenate([p[p != 0] + off for p, off in zip(s["masked_lm_positions"][[0, 1, 3]], (0, 10, 22))])
    want_ids = np.concatenate(
        [m[p != 0] for p, m in zip(s["masked_lm_positions"][[0, 1, 3]], s["masked_lm_ids"][[0, 1, 3]])]
    )
    n = len(want_pos)
    assert np.array_equal(r["masked_lm_positions"][:n], want_pos) and (r["masked_lm_positions"][n:] == 0).all()
    assert np.array_equal(r["masked_lm_ids"][:n], want_ids)
    # the masked token ids sit where the positions say
    assert np.array_equal(
        r["input_ids"][want_pos],
        np.concatenate([s["input_ids"][i][p[p != 0]] for i, p in zip((0, 1, 3), s["masked_lm_positions"][[0, 1, 3]])]),
    )
    assert np.array_equal(rows["next_sentence_weights"][1], [1, 0, 0])
    assert rows["input_mask"][2].max() == 1 and (rows["input_mask"][2][5:] == 0).all()


def test_mlm_width_never_overflows():
    S, P = 64, 10
    s = make_samples(300, S, P, seed=3)
    # predictions far above 0.15 * length: the max_pred + K rule alone would overflow
    s["masked_lm_positions"][:, :] = 0
    for i in range(300):
        n = int(s["input_mask"][i].sum())
        k = min(P, n - 1)
        s["masked_lm_positions"][i, :k] = np.arange(1, k + 1)
    packed = pr.pack_samples(s, max_per_pack=3, rng=np.random.default_rng(0))
    assert packed["masked_lm_positions"].shape[1] > P + 3
    assert (packed["masked_lm_positions"] != 0).sum() == (s["masked_lm_positions"] != 0).sum()
    with pytest.raises(ValueError):
        pr.pack_samples(s, max_per_pack=3, rng=np.random.default_rng(0), width=P + 3)


def test_pack_samples_on_the_fly_keeps_every_token():
    s = make_samples(200, 64, 10, seed=1)
    packed = pr.pack_samples(s, max_per_pack=3, algorithm="spfhp", rng=np.random.default_rng(1))
    assert len(packed["input_ids"]) < 200
    assert packed["next_sentence_weights"].sum() == 200
    assert np.array_equal(
        np.sort(packed["input_ids"][packed["input_mask"] > 0]), np.sort(s["input_ids"][s["input_mask"] > 0])
    )
    inputs = pr.packed_model_inputs(packed)
    assert set(inputs) == {
        "input_ids",
        "attention_mask",
        "token_type_ids",
        "position_ids",
        "masked_positions",
        "masked_labels",
        "nsp_positions",
        "nsp_labels",
    }
    w = packed["next_sentence_weights"] > 0
    assert (inputs["nsp_labels"][torch_bool(~w)] == -1).all()


def torch_bool(a):
    import torch

    return torch.from_numpy(a)


def write_input_shards(d, n_shards=3, rows=150, S=64, P=10):
    d.mkdir(parents=True, exist_ok=True)
    all_rows = []
    for i in range(n_shards):
        s = make_samples(rows, S, P, seed=10 + i)
        s["input_ids"] = np.where(s["input_mask"] > 0, s["input_ids"] + 1_000_000 * i, 0).astype(np.int32)
        s["masked_lm_ids"] = np.where(s["masked_lm_positions"] > 0, s["masked_lm_ids"] + 1_000_000 * i, 0)
        write_shard(d / f"shard_{i}.hdf5", s)
        all_rows.append(s)
    return {k: np.concatenate([r[k] for r in all_rows]) for k in all_rows[0]}


def sequences_of_unpacked(s):
    out = []
    for i in range(len(s["input_ids"])):
        n = int(s["input_mask"][i].sum())
        p = s["masked_lm_positions"][i]
        out.append(
            (
                tuple(s["input_ids"][i, :n]),
                tuple(s["segment_ids"][i, :n]),
                tuple(p[p != 0]),
                tuple(s["masked_lm_ids"][i][p != 0]),
                int(s["next_sentence_labels"][i]),
            )
        )
    return sorted(out)


def sequences_of_packed(rows):
    out = []
    for r in range(len(rows["input_ids"])):
        mask, pos = rows["input_mask"][r], rows["masked_lm_positions"][r]
        for k in range(rows["next_sentence_weights"].shape[1]):
            if not rows["next_sentence_weights"][r, k]:
                continue
            off = rows["next_sentence_positions"][r, k]
            sl = np.flatnonzero(mask == k + 1)
            assert sl[0] == off and np.array_equal(rows["positions"][r, sl], np.arange(len(sl)))
            mine = (pos >= sl[0]) & (pos <= sl[-1]) & (pos != 0)
            out.append(
                (
                    tuple(rows["input_ids"][r, sl]),
                    tuple(rows["segment_ids"][r, sl]),
                    tuple(pos[mine] - off),
                    tuple(rows["masked_lm_ids"][r][mine]),
                    int(rows["next_sentence_labels"][r, k]),
                )
            )
    return sorted(out)


def test_pack_shards_round_trip_resume_and_determinism(tmp_path):
    src = tmp_path / "in"
    data = write_input_shards(src)
    logs = []
    cfg = pk.PackConfig(str(src), str(tmp_path / "out"), "lpfhp", 3, seed=7, shards=2, chunk_rows=64, buffer_mb=0)
    meta = pk.pack_shards(cfg, log=logs.append)
    out = tmp_path / "out"
    files = sorted(out.glob("packed_*.hdf5"))
    assert [f.name for f in files] == meta["shards"] and len(files) == 2
    assert ShardSet.open(files[0]).kind == "packed"
    rows = [read_shard(f) for f in files]
    merged = {k: np.concatenate([r[k] for r in rows]) for k in rows[0]}
    assert sequences_of_packed(merged) == sequences_of_unpacked(data)  # every sequence exactly once, intact
    on_disk = json.loads((out / pk.METADATA).read_text())
    assert on_disk["sequences"] == 450 and on_disk["packs"] == len(merged["input_ids"]) < 450
    for key in ("algorithm", "max_per_pack", "avg_seq_per_sample", "packing_efficiency", "theoretical_speedup"):
        assert key in on_disk
    assert not (out / pk.WORK_DIR).exists()
    # packs are shuffled: consecutive rows do not come from one input shard only
    shard_of_first = merged["input_ids"][:, 0] // 1_000_000
    assert len(set(shard_of_first[:20].tolist())) > 1
    # re-run: nothing to do; a deleted shard is re-made identically
    first = files[0].read_bytes()
    assert pk.pack_shards(cfg, log=logs.append) == on_disk
    files[0].unlink()
    pk.pack_shards(cfg, log=logs.append)
    assert files[0].read_bytes() == first
    # same seed elsewhere: identical bytes; another seed: another order
    pk.pack_shards(pk.PackConfig(str(src), str(tmp_path / "again"), "lpfhp", 3, seed=7, shards=2), log=logs.append)
    assert (tmp_path / "again" / files[1].name).read_bytes() == files[1].read_bytes()
    # other settings into the same directory: refused, nothing lost
    with pytest.raises(UserError, match="different run"):
        pk.pack_shards(pk.PackConfig(str(src), str(out), "spfhp", 3, seed=7, shards=2), log=logs.append)
    assert files[1].is_file()


def crash_in_pass_2b(cfg: pk.PackConfig, monkeypatch) -> None:
    """Run `pack_shards` killed (KeyboardInterrupt) while it builds its second output shard."""
    real = pk.build_packed_rows
    calls = {"n": 0}

    def crash_on_second(*a, **kw):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real(*a, **kw)

    monkeypatch.setattr(pk, "build_packed_rows", crash_on_second)
    with pytest.raises(KeyboardInterrupt):
        pk.pack_shards(cfg, log=lambda m: None)
    monkeypatch.setattr(pk, "build_packed_rows", real)


def test_pack_shards_resumes_after_a_crash_in_pass_2b(tmp_path, monkeypatch):
    src = tmp_path / "in"
    data = write_input_shards(src, n_shards=2, rows=80)
    cfg = pk.PackConfig(str(src), str(tmp_path / "out"), "spfhp", 2, seed=1, shards=3)
    crash_in_pass_2b(cfg, monkeypatch)
    out = tmp_path / "out"
    assert len(list(out.glob("packed_*.hdf5"))) == 1 and not (out / pk.METADATA).exists()
    assert not list(out.glob(".*tmp*"))  # no half-written shard
    meta = pk.pack_shards(cfg, log=lambda m: None)
    rows = [read_shard(out / n) for n in meta["shards"]]
    merged = {k: np.concatenate([r[k] for r in rows]) for k in rows[0]}
    assert sequences_of_packed(merged) == sequences_of_unpacked(data)


def test_resume_remakes_a_deleted_shard_after_a_crash_in_pass_2b(tmp_path, monkeypatch):
    """Killed in pass 2b (shard 0 written, its bucket removed), then shard 0 deleted: the re-run opened the
    missing bucket_00000.h5 (FileNotFoundError) instead of making the buckets again."""
    write_input_shards(tmp_path / "in", n_shards=2, rows=80)
    cfg = pk.PackConfig(str(tmp_path / "in"), str(tmp_path / "out"), "spfhp", 2, seed=1, shards=3)
    crash_in_pass_2b(cfg, monkeypatch)
    out = tmp_path / "out"
    (out / "packed_00000.hdf5").unlink()
    meta = pk.pack_shards(cfg, log=lambda m: None)
    got = [read_shard(out / n) for n in meta["shards"]]
    fresh = pk.pack_shards(pk.PackConfig(str(tmp_path / "in"), str(tmp_path / "o2"), "spfhp", 2, 1, 3), lambda m: None)
    want = [read_shard(tmp_path / "o2" / n) for n in fresh["shards"]]
    for g, w in zip(got, want):
        assert all(np.array_equal(g[k], w[k]) for k in w)


def test_pack_refuses_dynamic_and_packed_inputs(tmp_path):
    src = tmp_path / "dyn"
    s = make_samples(10, 16, 4)
    del s["masked_lm_positions"], s["masked_lm_ids"]
    write_shard(src / "shard_0.hdf5", s, attrs={"bertforge_kind": "dynamic"})
    with pytest.raises(UserError, match="on the fly"):
        pk.pack_shards(pk.PackConfig(str(src), str(tmp_path / "o")))
    write_input_shards(tmp_path / "in", n_shards=1, rows=20)
    pk.pack_shards(pk.PackConfig(str(tmp_path / "in"), str(tmp_path / "p"), shards=1), log=lambda m: None)
    with pytest.raises(UserError, match="already packed"):
        pk.pack_shards(pk.PackConfig(str(tmp_path / "p"), str(tmp_path / "q")), log=lambda m: None)


@pytest.mark.parametrize(
    ("change", "flag"),
    [
        ({"chunk_rows": 0}, "--chunk-rows"),
        ({"chunk_rows": -5}, "--chunk-rows"),
        ({"shards": 0}, "--shards"),
        ({"shards": -2}, "--shards"),
        ({"buffer_mb": -1}, "--buffer-mb"),
        ({"max_per_pack": 0}, "--max-per-pack"),
        ({"seed": -1}, "--seed"),
    ],
)
def test_pack_refuses_sizes_below_one_before_writing(tmp_path, change, flag):
    write_input_shards(tmp_path / "in", n_shards=1, rows=20)
    out = tmp_path / "new" / "p"
    with pytest.raises(UserError, match=f"{flag} must be at least"):
        pk.pack_shards(pk.PackConfig(str(tmp_path / "in"), str(out), **change), log=lambda m: None)
    assert not (tmp_path / "new").exists()
    with pytest.raises(UserError, match="fix --in"):
        pk.pack_shards(pk.PackConfig(str(tmp_path / "nope"), str(out)), log=lambda m: None)


def test_pack_refuses_more_shards_than_packs(tmp_path):
    """--shards 100000 on 1,538 sequences wrote thousands of empty shards for ten minutes. Refused, it then left
    --out (which it had made) holding its work dir's plan.json: a failed command removes what it created."""
    write_input_shards(tmp_path / "in", n_shards=1, rows=20)
    with pytest.raises(UserError, match="more than the .* packs"):
        pk.pack_shards(pk.PackConfig(str(tmp_path / "in"), str(tmp_path / "p"), shards=1000), log=lambda m: None)
    assert not (tmp_path / "p").exists()


def test_cli(tmp_path, capsys):
    from bertforge.cli import main

    write_input_shards(tmp_path / "in", n_shards=2, rows=60)
    from bertforge.data.shards import write_manifest

    write_manifest(tmp_path / "in", {"vocab": "/some/vocab.txt", "vocab_size": 123, "tokens": 5})
    rc = main(
        [
            "pack",
            "--in",
            str(tmp_path / "in"),
            "--out",
            str(tmp_path / "out"),
            "--algorithm",
            "nnlshp",
            "--max-per-pack",
            "2",
            "--seed",
            "3",
        ]
    )
    assert rc == 0
    assert "sequences in" in capsys.readouterr().out
    meta = json.loads((tmp_path / "out" / pk.METADATA).read_text())
    assert meta["algorithm"] == "nnlshp" and meta["max_per_pack"] == 2
    assert meta["vocab"] == "/some/vocab.txt" and meta["vocab_size"] == 123 and meta["tokens"] != 5  # vocab carried
    with h5py.File(tmp_path / "out" / meta["shards"][0]) as f:
        assert f["next_sentence_positions"].shape[1] == 2 and f.attrs["bertforge_kind"] == "packed"


def test_bench_callables_small(tmp_path):
    from bertforge.bench import packing as bench

    lengths = bench.wiki_like_lengths(50_000)
    assert lengths.min() >= 5 and lengths.max() == 512 and 0.4 < 1 - lengths.mean() / 512 < 0.6
    r = bench.algorithm("lpfhp", n=50_000, max_per_pack=16, assign=True)
    assert r["efficiency"] > 0.99 and r["speedup"] > 1.9 and r["assign_s"] >= 0
    src = tmp_path / "in"
    for i in range(2):
        s = make_samples(40, 64, 10, seed=i)
        s["input_ids"] %= 30000  # token ids within the vocab
        s["masked_lm_ids"] %= 30000
        write_shard(src / f"shard_{i}.hdf5", s)
    pk.pack_shards(pk.PackConfig(str(src), str(tmp_path / "p")), log=lambda m: None)
    r = bench.packed_vs_unpacked(str(src), str(tmp_path / "p"), preset="tiny", micro_batch=2, steps=1)
    assert r["theoretical_speedup_batches"] > 1 and r["packed_tokens_per_s"] > 0
