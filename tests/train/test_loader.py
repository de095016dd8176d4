"""The shard loader: workers == in-process, lanes independent of world size, resumable cursor, epochs,
dynamic masking, packed rows."""

from __future__ import annotations

import itertools

import h5py
import numpy as np
import pytest
import torch

from bertforge.data.loader import PretrainLoader, assign_pieces, batch_arithmetic, eval_batches
from bertforge.errors import UserError


def _take(it, n):
    return list(itertools.islice(it, n))


def _eq(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_workers_give_the_same_stream(shards):
    mk = lambda w: PretrainLoader.from_dir(shards, 16, 4, 0, 1, seed=3, num_workers=w, chunk_rows=16)  # noqa: E731
    a = _take(mk(0).iterate(), 10)
    b = _take(mk(2).iterate(), 10)
    for x, y in zip(a, b):
        _eq(x, y)
    assert a[0]["input_ids"].shape == (4, 32) and a[0]["masked_positions"].shape == (4, 5)


def test_lanes_do_not_depend_on_world_size(shards):
    one = PretrainLoader.from_dir(shards, 8, 4, 0, 1, seed=1, num_workers=0, chunk_rows=16)
    r0 = PretrainLoader.from_dir(shards, 8, 4, 0, 2, seed=1, num_workers=0, chunk_rows=16)
    r1 = PretrainLoader.from_dir(shards, 8, 4, 1, 2, seed=1, num_workers=0, chunk_rows=16)
    assert one.accum == 2 and r0.accum == 1
    a = _take(one.iterate(), 12)  # update u = micro-batches 2u (lane 0) and 2u+1 (lane 1)
    b0, b1 = _take(r0.iterate(), 6), _take(r1.iterate(), 6)
    for u in range(6):
        _eq(a[2 * u], b0[u])
        _eq(a[2 * u + 1], b1[u])
    # the two ranks read different data
    assert not torch.equal(b0[0]["input_ids"], b1[0]["input_ids"])


def test_cursor_resumes_mid_stream_and_across_epochs(shards):
    loader = PretrainLoader.from_dir(shards, 8, 4, 0, 1, seed=0, num_workers=0, chunk_rows=16)
    # 4 shards x 64 rows over 2 lanes: 128 rows = 32 micro-batches per lane epoch; go past it
    full = _take(loader.iterate(), 2 * 40)
    resumed = _take(loader.iterate(start_batch=33), 2 * 7)
    for x, y in zip(full[66:], resumed):
        _eq(x, y)
    # within one epoch of a lane every row appears exactly once; the next epoch is a new order
    lane0 = torch.cat([b["input_ids"] for b in full[0:64:2]])
    assert len({tuple(r.tolist()) for r in lane0}) == 128
    lane0_next = torch.cat([b["input_ids"] for b in full[64:80:2]])
    assert not torch.equal(lane0[: len(lane0_next)], lane0_next)


def test_fewer_shards_than_lanes():
    lanes = assign_pieces([10, 7], 5)
    assert len(lanes) == 5 and all(lanes)
    covered = sorted((p.shard, r) for lane in lanes for p in lane for r in range(p.start, p.stop))
    assert covered == [(0, r) for r in range(10)] + [(1, r) for r in range(7)]
    with pytest.raises(UserError, match="too few"):
        assign_pieces([1], 3)


def test_batch_arithmetic():
    assert batch_arithmetic(65536, 64, 8) == 128
    with pytest.raises(UserError, match="not a multiple"):
        batch_arithmetic(100, 8, 2)


def test_eval_batches_cover_everything_once(shards):
    n = sum(b["input_ids"].shape[0] for b in eval_batches(shards, 10))
    assert n == 4 * 64
    split = [b["input_ids"].shape[0] for r in (0, 1) for b in eval_batches(shards, 10, rank=r, world_size=2)]
    assert sum(split) == 4 * 64


def _dynamic_shard(path, rows=40, seq_len=24):
    rng = np.random.default_rng(0)
    ids = np.zeros((rows, seq_len), np.int32)
    mask = np.zeros((rows, seq_len), np.int8)
    for r in range(rows):
        n = int(rng.integers(10, seq_len + 1))
        ids[r, :n] = [2, *rng.integers(5, 64, n - 2), 3]
        mask[r, :n] = 1
    with h5py.File(path, "w") as h:
        h.create_dataset("input_ids", data=ids)
        h.create_dataset("input_mask", data=mask)
        h.create_dataset("segment_ids", data=np.zeros_like(mask))
        h.create_dataset("next_sentence_labels", data=np.zeros(rows, np.int8))
        h.attrs.update(
            {
                "bertforge_kind": "dynamic",
                "vocab_size": 64,
                "max_pred": 4,
                "masked_lm_prob": 0.15,
                "pad_id": 0,
                "cls_id": 2,
                "sep_id": 3,
                "mask_id": 4,
                "wwm": False,
            }
        )
    return ids


def test_dynamic_masking(tmp_path):
    d = tmp_path / "dyn"
    d.mkdir()
    original = _dynamic_shard(d / "shard_0.hdf5")
    loader = PretrainLoader.from_dir(d, 4, 4, 0, 1, seed=0, num_workers=0, vocab_size=64)
    assert loader.kind == "dynamic"
    batches = _take(loader.iterate(), 20)  # 2 epochs of 40 rows
    by_row: dict[tuple, list] = {}
    for b in batches:
        assert b["masked_positions"].shape == (4, 4)
        for r in range(4):
            pos = b["masked_positions"][r]
            real = pos[pos > 0]
            assert len(real) >= 1
            # labels are the original tokens at the masked positions, never [CLS]/[SEP]/[PAD]
            labels = b["masked_labels"][r][: len(real)]
            assert (labels >= 5).all()
            unmasked = b["input_ids"][r].clone()
            unmasked[real] = labels
            match = [i for i in range(len(original)) if torch.equal(unmasked, torch.from_numpy(original[i]).long())]
            assert len(match) == 1
            by_row.setdefault(match[0], []).append(tuple(real.tolist()))
    # every row seen twice (two epochs) and most rows get a different mask the second time
    assert all(len(v) == 2 for v in by_row.values()) and len(by_row) == 40
    assert sum(v[0] != v[1] for v in by_row.values()) > 20
    again = _take(PretrainLoader.from_dir(d, 4, 4, 0, 1, seed=0, num_workers=0, vocab_size=64).iterate(), 3)
    for x, y in zip(batches, again):
        _eq(x, y)  # deterministic


def test_packed_rows(tmp_path):
    d = tmp_path / "packed"
    d.mkdir()
    S, W, K = 16, 6, 2
    ids = np.zeros((2, S), np.int32)
    ids[0, :10] = [2, 7, 8, 9, 3, 2, 10, 11, 12, 3]
    ids[1, :5] = [2, 20, 21, 22, 3]
    mask = np.zeros((2, S), np.int8)
    mask[0, :5], mask[0, 5:10], mask[1, :5] = 1, 2, 1
    positions = np.zeros((2, S), np.int32)
    positions[0, :10] = [0, 1, 2, 3, 4, 0, 1, 2, 3, 4]
    positions[1, :5] = range(5)
    arrays = {
        "input_ids": ids,
        "input_mask": mask,
        "segment_ids": np.zeros((2, S), np.int8),
        "positions": positions,
        "masked_lm_positions": np.array([[2, 7, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0]], np.int32),
        "masked_lm_ids": np.array([[8, 11, 0, 0, 0, 0], [20, 0, 0, 0, 0, 0]], np.int32),
        "next_sentence_positions": np.array([[0, 5], [0, 0]], np.int32),
        "next_sentence_labels": np.array([[1, 0], [0, 0]], np.int8),
        "next_sentence_weights": np.array([[1, 1], [1, 0]], np.int8),
    }
    with h5py.File(d / "packed_0.hdf5", "w") as h:
        for k, v in arrays.items():
            h.create_dataset(k, data=v)
    loader = PretrainLoader.from_dir(d, 2, 2, 0, 1, seed=0, num_workers=0)
    assert loader.kind == "packed"
    (b,) = _take(loader.iterate(), 1)
    row = int((b["input_ids"][:, 1] == 20).nonzero())  # which row came first after shuffling
    other = 1 - row
    assert b["attention_mask"][other].tolist() == mask[0].tolist()
    assert b["position_ids"][other].tolist() == positions[0].tolist()
    assert b["nsp_positions"][other].tolist() == [0, 5]
    assert b["nsp_labels"][other].tolist() == [1, 0]
    assert b["nsp_labels"][row].tolist() == [0, -1]  # the empty slot is -1 (ignored by the NSP loss)
    assert b["masked_positions"].shape == (2, W) and b["nsp_positions"].shape == (2, K)


def test_dynamic_masking_packed_on_the_fly(tmp_path):
    """pack_per_row packs each freshly masked window: same sequences, tokens and predictions in fewer rows."""
    d = tmp_path / "dyn"
    d.mkdir()
    original = _dynamic_shard(d / "shard_0.hdf5", seq_len=48)
    plain = _take(PretrainLoader.from_dir(d, 8, 8, 0, 1, seed=0, num_workers=0, vocab_size=64).iterate(), 5)
    packed = _take(
        PretrainLoader.from_dir(d, 8, 8, 0, 1, seed=0, num_workers=0, vocab_size=64, pack_per_row=3).iterate(), 5
    )
    rows_plain = rows_packed = 0
    for a, b in zip(plain, packed):
        assert (b["nsp_labels"] >= 0).sum() == 8  # every sequence of the window, once
        assert (b["attention_mask"] != 0).sum() == (a["attention_mask"] != 0).sum()  # every real token
        assert (b["masked_positions"] > 0).sum() == (a["masked_positions"] > 0).sum()  # every prediction
        # the masked tokens are the same multiset (positions shift, ids do not)
        assert sorted(b["masked_labels"][b["masked_positions"] > 0].tolist()) == sorted(
            a["masked_labels"][a["masked_positions"] > 0].tolist()
        )
        assert int(b["attention_mask"].max()) <= 3 and "position_ids" in b
        rows_plain, rows_packed = rows_plain + a["input_ids"].shape[0], rows_packed + b["input_ids"].shape[0]
    assert rows_packed < rows_plain
    assert len(original) == 40


def test_pack_per_row_needs_dynamic_shards(shards):
    from bertforge.errors import ConfigError

    with pytest.raises(ConfigError, match="bertforge pack"):
        PretrainLoader.from_dir(shards, 4, 4, 0, 1, seed=0, num_workers=0, pack_per_row=3)


def test_loader_reads_through_a_shardset(shards):
    from bertforge.data.shardset import ShardSet

    s = ShardSet.open(shards)
    by_dir = PretrainLoader.from_dir(shards, 8, 4, 0, 1, seed=2, num_workers=0, chunk_rows=16)
    by_set = PretrainLoader.from_dir(s, 8, 4, 0, 1, seed=2, num_workers=0, chunk_rows=16)
    assert by_dir.shards is s and by_set.shards is s and by_dir.kind == s.kind == "nvidia"
    assert by_dir.spec.files == [str(f) for f in s.files] and sum(by_dir.spec.rows) == s.rows
    for x, y in zip(_take(by_dir.iterate(), 3), _take(by_set.iterate(), 3)):
        _eq(x, y)


def test_dynamic_masking_keeps_the_shards_max_pred_unless_a_rate_is_given(tmp_path):
    """Google's rule caps predictions at max_pred (min(max_pred, round(0.15 x length))), as static masking
    does: rows of 64 tokens get 4, not 10. A rate set in data.mlm_probability is not capped by the shards'."""
    from bertforge.data.loader import masking_overrides
    from bertforge.data.shardset import ShardSet

    d = tmp_path / "dyn"
    d.mkdir()
    _dynamic_shard(d / "shard_0.hdf5", seq_len=64)  # max_pred 4, rate 0.15: a full row would take 10
    batch = next(iter(PretrainLoader.from_dir(d, 8, 8, 0, 1, seed=0, num_workers=0, vocab_size=64).iterate()))
    assert batch["masked_positions"].shape[1] == 4 and int((batch["masked_positions"] > 0).sum(1).max()) == 4
    shards = ShardSet.open(d)
    assert masking_overrides(shards, None)["max_pred"] == 4
    assert masking_overrides(shards, 0.15)["max_pred"] == 10 and masking_overrides(shards, 0.3)["max_pred"] == 19


@pytest.mark.parametrize(
    "rows,lanes", [([100] * 3, 2), ([100] * 100, 256), ([100] * 5000, 1024), ([50, 300, 7, 1000], 8), ([10, 7], 5)]
)
def test_every_lane_holds_the_same_rows_so_every_row_is_read_as_often(rows, lanes):
    """Each lane starts its next pass when its own rows run out: lanes of unequal size (3 shards for 2 lanes:
    200 rows against 100) read the small lane's rows twice as often. Every row is in exactly one lane."""
    out = assign_pieces(rows, lanes)
    sizes = [sum(p.rows for p in lane) for lane in out]
    assert max(sizes) - min(sizes) <= max(1, min(sizes) // 100), sizes
    covered = sorted((p.shard, r) for lane in out for p in lane for r in range(p.start, p.stop))
    assert covered == [(s, r) for s, n in enumerate(rows) for r in range(n)]


def test_shard_counts_that_divide_keep_the_layout_runs_had():
    """Balanced already (64 shards for 256 lanes, 4096 for 1024): the same pieces as before, so a run resumed
    across this change reads what it would have."""
    assert [[(p.shard, p.start, p.stop) for p in lane] for lane in assign_pieces([101] * 64, 256)[:5]] == [
        [(0, 0, 25)], [(0, 25, 50)], [(0, 50, 75)], [(0, 75, 101)], [(1, 0, 25)]
    ]  # fmt: skip
    lanes = assign_pieces([1000 + s % 7 for s in range(4096)], 1024)
    assert [p.shard for p in lanes[3]] == [3, 1027, 2051, 3075]
