"""Packing audit: the greedy algorithms against a transcription of Graphcore's reference on random histograms, and
regression tests for what the audit found (each docstring says what went wrong; each failed before its fix)."""

from __future__ import annotations

import json
from collections import defaultdict

import numpy as np
import pytest
import scipy.optimize
from tests.data.test_packing import (
    crash_in_pass_2b,
    make_samples,
    sequences_of_packed,
    sequences_of_unpacked,
    write_input_shards,
)

from bertforge.data import packing as pk
from bertforge.data import packing_algorithms as pa
from bertforge.data.shards import read_shard, write_shard
from bertforge.errors import UserError


# ============================================================================================ reference
def graphcore_greedy(histogram: np.ndarray, S: int, K: int, longest_first: bool) -> dict[tuple[int, ...], int]:
    """Graphcore's pack_using_lpfhp / pack_using_spfhp (tutorials/blogs_code/packedBERT), condensed: histogram[l]
    sequences of length l (index 0 unused) -> {combination (longest first): repeat count}."""
    open_, final = defaultdict(list), defaultdict(int)

    def add(pack: list[int], count: int) -> None:
        if len(pack) == K or sum(pack) == S:
            final[tuple(sorted(pack, reverse=True))] += count
        elif count:
            open_[S - sum(pack)].append((count, pack))

    for length in range(S, 0, -1):
        n = int(histogram[length])
        while n > 0:
            # lpfhp: the least space that fits (best fit); spfhp: the most (worst fit)
            keys = sorted(k for k in open_ if k >= length and open_[k])
            space = (keys[0] if longest_first else keys[-1]) if keys else None
            if space is None:
                repeat = min(S // length, K, n) if longest_first else 1
                add([length] * repeat, n // repeat)
                n -= n // repeat * repeat
                continue
            count, pack = open_[space].pop()
            repeat = min(space // length, K - len(pack), n) if longest_first else 1
            take = min(count, n // repeat)
            if count > take:
                open_[space].append((count - take, pack))
            n -= take * repeat
            add(pack + [length] * repeat, take)
    for groups in open_.values():
        for count, pack in groups:
            final[tuple(sorted(pack, reverse=True))] += count
    return {c: n for c, n in final.items() if n}


@pytest.mark.parametrize("alg", ["lpfhp", "spfhp"])
def test_greedy_strategies_equal_graphcore_on_random_histograms(alg):
    rng = np.random.default_rng(0)
    for _ in range(150):
        S, K, n = int(rng.integers(1, 40)), int(rng.integers(1, 7)), int(rng.integers(0, 60))
        short = rng.integers(1, 5, n // 2)  # a tail of short sequences: where distribute matters
        lengths = np.concatenate([rng.integers(1, S + 1, n), short]).clip(1, S)
        h = pa.length_histogram(lengths, S)
        st = pa.pack_histogram(h, S, K, alg)
        st.check(h)
        assert dict(zip(st.combos, st.counts.tolist())) == graphcore_greedy(h, S, K, alg == "lpfhp"), (S, K)


# ============================================================================================ nnlshp round-off
def test_nnlshp_keeps_an_integer_that_nnls_returns_with_round_off(monkeypatch):
    """nnls returns exact-fit counts like 2.9999999999999996; a bare floor dropped one whole pack of every such
    combination to the LPFHP leftovers (on WikiText-2 at S = 512, K = 3: 846 packs instead of 830) and made the plan
    depend on the last bit of the arithmetic. Here nnls is made to answer each integer count just below it."""
    combos = {(9, 4, 3): 3, (10, 6): 2, (8, 8): 1, (12, 4): 2, (7, 5, 4): 2}  # 10 exactly full rows
    lengths = np.array([length for c, n in combos.items() for _ in range(n) for length in c])
    S, K = 16, 3
    h = pa.length_histogram(lengths, S)
    real = scipy.optimize.nnls

    def just_below(A, b, **kw):
        x, r = real(A, b, **kw)
        x = np.rint(x)
        return np.where(x > 0, x - 8 * np.finfo(float).eps * x, 0.0), r

    monkeypatch.setattr(scipy.optimize, "nnls", just_below)
    st = pa.nnlshp(h, S, K)
    st.check(h)
    assert dict(zip(st.combos, st.counts.tolist())) == combos
    assert st.efficiency == 1.0 and pa.lpfhp(h, S, K).packs > st.packs


# ============================================================================================ bad input
def test_an_empty_row_is_named_by_shard_and_row(tmp_path):
    """A row whose input_mask is all 0 (a zeroed region of a damaged shard) stopped the run with "sequence lengths
    must lie in 1..64; found 0..63": no shard, no row, nothing to do about it."""
    src = tmp_path / "in"
    src.mkdir()
    write_shard(src / "a.hdf5", make_samples(30, 64))
    bad = make_samples(30, 64, seed=3)
    for k in ("input_mask", "input_ids", "segment_ids", "masked_lm_positions", "masked_lm_ids"):
        bad[k][17] = 0
    write_shard(src / "b.hdf5", bad)
    with pytest.raises(UserError, match=r"b\.hdf5 row 17 is empty"):
        pk.pack_shards(pk.PackConfig(str(src), str(tmp_path / "out"), chunk_rows=8), log=lambda m: None)


def test_too_many_default_shards_names_the_default(tmp_path):
    """More input shards than packs (a small corpus split 16 ways) said "--shards 4 is more than the 2 packs" to a
    user who never passed --shards."""
    src = tmp_path / "in"
    src.mkdir()
    for i in range(4):
        write_shard(src / f"s{i}.hdf5", make_samples(1, 64, lengths=[20], seed=i))
    with pytest.raises(UserError, match=r"default --shards \(one per input shard, 4\).*--shards 2 or fewer"):
        pk.pack_shards(pk.PackConfig(str(src), str(tmp_path / "out")), log=lambda m: None)


def test_more_than_127_sequences_per_pack_is_refused(tmp_path):
    """input_mask stores each token's sequence index as int8: a 128th sequence would wrap to -128 and a 256th to
    0, which reads as padding, silently."""
    src = tmp_path / "in"
    src.mkdir()
    write_shard(src / "a.hdf5", make_samples(4, 64))
    with pytest.raises(UserError, match="--max-per-pack must be at most 127"):
        pk.pack_shards(pk.PackConfig(str(src), str(tmp_path / "out"), max_per_pack=128), log=lambda m: None)
    assert not (tmp_path / "out").exists()


# ============================================================================================ resume
def other_plan(monkeypatch) -> None:
    """The same inputs and settings planned otherwise (as another scipy's nnls or another version would)."""
    real = pk.assign_packs
    monkeypatch.setattr(pk, "assign_packs", lambda *a, **kw: real(*a, **kw)[::-1].copy())


def test_resume_refuses_shards_of_another_plan(tmp_path, monkeypatch):
    """A killed run resumed with software that plans the same inputs differently went on with the new plan beside
    the old plan's shards; its buckets (made for the old plan) then failed as "incomplete: delete .pack_work and
    re-run", which led to a refusal naming other inputs or settings."""
    src = tmp_path / "in"
    write_input_shards(src, n_shards=2, rows=80)
    out = tmp_path / "out"
    cfg = pk.PackConfig(str(src), str(out), "lpfhp", 2, seed=1, shards=3)
    crash_in_pass_2b(cfg, monkeypatch)
    other_plan(monkeypatch)
    with pytest.raises(UserError, match="another plan"):
        pk.pack_shards(cfg, log=lambda m: None)
    assert len(list(out.glob("packed_*.hdf5"))) == 1  # nothing written is lost


def test_remaking_a_deleted_shard_refuses_another_plan(tmp_path, monkeypatch):
    """A finished run's deleted shard was remade from whatever plan the software now computes: some sequences in
    two shards, others in none, and no error. The same plan still remakes it, every sequence exactly once."""
    src = tmp_path / "in"
    data = write_input_shards(src, n_shards=2, rows=80)
    out = tmp_path / "out"
    cfg = pk.PackConfig(str(src), str(out), "lpfhp", 2, seed=1, shards=3)
    meta = pk.pack_shards(cfg, log=lambda m: None)
    (out / meta["shards"][0]).unlink()
    other_plan(monkeypatch)
    with pytest.raises(UserError, match="another plan"):
        pk.pack_shards(cfg, log=lambda m: None)
    monkeypatch.undo()
    pk.pack_shards(cfg, log=lambda m: None)
    rows = [read_shard(out / n) for n in meta["shards"]]
    merged = {k: np.concatenate([r[k] for r in rows]) for k in rows[0]}
    assert sequences_of_packed(merged) == sequences_of_unpacked(data)
    assert json.loads((out / pk.METADATA).read_text())["packs_sha"] == meta["packs_sha"]


@pytest.mark.parametrize("algorithm", ["nnlshp", "lpfhp"])
def test_an_unfinished_run_of_an_earlier_version_without_a_packs_digest(tmp_path, monkeypatch, algorithm):
    """An interrupted directory written before packs_sha existed: nnlshp's rounding has changed since, so its
    plan cannot be trusted to match and the run is refused (nothing written is lost); a greedy plan (unchanged)
    goes on."""
    src = tmp_path / "in"
    write_input_shards(src, n_shards=2, rows=80)
    out = tmp_path / "out"
    cfg = pk.PackConfig(str(src), str(out), algorithm, 2, seed=1, shards=3)
    crash_in_pass_2b(cfg, monkeypatch)
    monkeypatch.undo()
    plan_file = out / pk.WORK_DIR / "plan.json"
    plan_file.write_text(json.dumps({"plan_id": json.loads(plan_file.read_text())["plan_id"]}))  # as written before
    if algorithm == "nnlshp":
        with pytest.raises(UserError, match="unfinished nnlshp run of an earlier bertforge"):
            pk.pack_shards(cfg, log=lambda m: None)
        assert len(list(out.glob("packed_*.hdf5"))) == 1
    else:
        assert pk.pack_shards(cfg, log=lambda m: None)["packs"] > 0
