"""`bertforge data inspect` against a direct h5py/numpy computation, on every kind of shard bertforge reads:
NVIDIA static-masked, dynamic, MLM-only, packed by `bertforge pack`, Habana packed (no packing.json), MLPerf-like
(int16 ids, (N, 1) NSP labels, float masked_lm_weights); empty, duplicated, nested and damaged inputs."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest

from bertforge.cli import main
from bertforge.data import inspect as insp
from bertforge.data.instances import mask_tokens
from bertforge.data.shardset import ShardSet
from bertforge.errors import UserError

S, P = 32, 5


def _nvidia(path, n=40, seed=0, ids_dtype="i4", nsp_shape=None, weights=False, max_id=None):
    """An NVIDIA-schema shard written with h5py: varied lengths, 1..P predictions sorted and 0-padded."""
    rng = np.random.default_rng(seed)
    lens = rng.integers(6, S + 1, n)
    lens[0] = S
    ids = np.zeros((n, S), ids_dtype)
    mask = np.zeros((n, S), "i1")
    pos = np.zeros((n, P), "i4")
    lab = np.zeros((n, P), "i4")
    for r, L in enumerate(lens):
        ids[r, :L] = rng.integers(5, 100, L)
        ids[r, 0], ids[r, L - 1] = 2, 3
        mask[r, :L] = 1
        k = int(rng.integers(1, min(P, L - 2) + 1))
        pos[r, :k] = np.sort(rng.choice(np.arange(1, L - 1), k, replace=False))
        lab[r, :k] = ids[r, pos[r, :k]]
        ids[r, pos[r, :k]] = 4  # [MASK]
    if max_id is not None:
        lab[1, 0] = max_id  # the largest id survives only as a label, under [MASK]
    nsp = rng.integers(0, 2, n).astype("i1")
    arrays = {
        "input_ids": ids,
        "input_mask": mask,
        "segment_ids": np.zeros((n, S), "i1"),
        "masked_lm_positions": pos,
        "masked_lm_ids": lab,
        "next_sentence_labels": nsp.reshape(nsp_shape or (n,)),
    }
    if weights:
        arrays["masked_lm_weights"] = (pos != 0).astype("f4")
    with h5py.File(path, "w") as f:
        for k, v in arrays.items():
            f.create_dataset(k, data=v, compression="gzip")
    return path


def _unmasked(path, kind, n=30, seed=1, prob=0.15, max_pred=P):
    """A dynamic (pairs, NSP labels) or MLM-only (no NSP) shard as `data shards` writes them: attributes."""
    rng = np.random.default_rng(seed)
    lens = rng.integers(3 if kind == "mlm" else 5, S + 1, n)
    ids = np.zeros((n, S), "i4")
    mask = np.zeros((n, S), "i1")
    for r, L in enumerate(lens):
        ids[r, :L] = rng.integers(5, 100, L)
        ids[r, 0], ids[r, L - 1] = 2, 3
        if kind == "dynamic":
            ids[r, L // 2] = 3  # [CLS] A [SEP] B [SEP]
        mask[r, :L] = 1
    with h5py.File(path, "w") as f:
        f.create_dataset("input_ids", data=ids)
        f.create_dataset("input_mask", data=mask)
        f.create_dataset("segment_ids", data=np.zeros((n, S), "i1"))
        if kind == "dynamic":
            f.create_dataset("next_sentence_labels", data=(np.arange(n) % 3 == 0).astype("i1"))
        f.attrs.update(
            bertforge_kind=kind, max_pred=max_pred, masked_lm_prob=prob, pad_id=0, cls_id=2, sep_id=3, mask_id=4
        )
    return path


def _direct(path):
    """The numbers of one shard, computed row by row from the raw datasets."""
    with h5py.File(path, "r") as f:
        a = {k: f[k][()] for k in f}
        attrs = dict(f.attrs)
    im = a["input_mask"].astype(np.int64)
    packed = "next_sentence_positions" in a
    lengths, masked, labels = [], [], []
    max_id = int(a["input_ids"].max())
    for r in range(len(im)):
        pos = a.get("masked_lm_positions")
        k = None
        if pos is not None:
            zeros = np.flatnonzero(pos[r] == 0)
            k = int(zeros[0]) if zeros.size else pos.shape[1]  # the first-0 rule
            if k:
                max_id = max(max_id, int(a["masked_lm_ids"][r, :k].max()))
        if packed:
            for v in sorted(set(im[r][im[r] > 0].tolist())):
                lengths.append(int((im[r] == v).sum()))
                masked.append(int(sum(im[r, p] == v for p in pos[r, :k])))
            labels += a["next_sentence_labels"][r][a["next_sentence_weights"][r] > 0].tolist()
            continue
        n = int((im[r] != 0).sum())
        lengths.append(n)
        if k is not None:
            masked.append(k)
        else:  # what the loader draws
            rng = np.random.default_rng(r)
            _, p, _ = mask_tokens(
                a["input_ids"][r], rng, 100, int(attrs["max_pred"]), float(attrs["masked_lm_prob"]), (0, 2, 3),
                mask_id=4, length=n,
            )  # fmt: skip
            masked.append(int((p != 0).sum()))
        if "next_sentence_labels" in a:
            labels.append(int(np.ravel(a["next_sentence_labels"][r])[0]))
    return {
        "rows": len(im),
        "sequences": len(lengths),
        "tokens": sum(lengths),
        "padding_fraction": round(1 - sum(lengths) / im.size, 6),
        "lengths": sorted(lengths),
        "masked": sorted(masked),
        "nsp": round(sum(labels) / len(labels), 6) if labels else None,
        "max_token_id": max_id,
    }


def _expand(hist):
    return sorted(v for v, c in enumerate(hist) for _ in range(c))


def _check(stats, want):
    assert stats["rows"] == want["rows"] and stats["sequences"] == want["sequences"]
    assert stats["tokens"] == want["tokens"] and stats["padding_fraction"] == want["padding_fraction"]
    assert _expand(stats["seq_len_hist"]) == want["lengths"]
    assert _expand(stats["masked_count_hist"]) == want["masked"]
    assert stats["nsp_random_fraction"] == want["nsp"] and stats["max_token_id"] == want["max_token_id"]


def test_packed_shards_report_per_sequence_like_the_same_data_unpacked(tmp_path, capsys):
    """`bertforge pack`'s rows hold several sequences: lengths, NSP and the masked counts are per sequence, so
    the packed data reads as the same sequences unpacked. The masked counts used to be per row (up to K x
    max_pred, a histogram past max_pred)."""
    (tmp_path / "nv").mkdir()
    for i in range(2):
        _nvidia(tmp_path / "nv" / f"part_{i}.hdf5", seed=i)
    assert main(["pack", "--in", str(tmp_path / "nv"), "--out", str(tmp_path / "packed"), "--shards", "2"]) == 0
    capsys.readouterr()
    nv, packed = insp.inspect_paths([tmp_path / "nv"]), insp.inspect_paths([tmp_path / "packed"])
    assert packed["total"]["rows"] < nv["total"]["rows"]  # the rows really hold several sequences
    for key in ("sequences", "tokens", "seq_len_hist", "nsp_random_fraction", "max_token_id"):
        assert packed["total"][key] == nv["total"][key], key
    # the packed histogram is as wide as the packed rows' slots (max_pred + K): no sequence has more than P
    assert _expand(packed["total"]["masked_count_hist"]) == _expand(nv["total"]["masked_count_hist"])
    assert max(_expand(packed["total"]["masked_count_hist"])) <= P
    for s in packed["shards"]:
        _check(s, _direct(s["file"]))
    t = packed["total"]
    assert t["masked_per_row_mean"] == round(sum(_expand(t["masked_count_hist"])) / t["rows"], 3)
    assert "masked predictions per sequence" in insp.format_report(packed)


def test_every_kind_matches_a_direct_computation(tmp_path):
    """NVIDIA (first-0 rule; the largest id only as a label), MLPerf-like, dynamic and MLM-only (the count the
    loader draws, capped by the maskable tokens at a high rate) and Habana packed shards."""
    paths = [
        _nvidia(tmp_path / "nv.hdf5", max_id=30527),
        _nvidia(tmp_path / "mlperf.hdf5", ids_dtype="i2", nsp_shape=(40, 1), weights=True),
        _unmasked(tmp_path / "dyn.hdf5", "dynamic"),
        _unmasked(tmp_path / "dyn_hi.hdf5", "dynamic", prob=0.8, max_pred=S),
        _unmasked(tmp_path / "mlm.hdf5", "mlm", prob=0.8, max_pred=S),
    ]
    for p in paths:
        _check(insp.inspect_paths([p])["shards"][0], _direct(p))
    assert insp.inspect_paths([paths[0]])["total"]["max_token_id"] == 30527


def test_nvidia_count_is_the_index_of_the_first_zero(tmp_path):
    """DESIGN §3.2: real predictions end at the first 0 of masked_lm_positions (NVIDIA's loader); a nonzero
    after it is not a prediction."""
    p = _nvidia(tmp_path / "s.hdf5", n=4)
    with h5py.File(p, "r+") as f:
        f["masked_lm_positions"][0] = [3, 0, 7, 0, 0]
    assert insp.inspect_paths([p])["total"]["masked_count_hist"][1] >= 1
    _check(insp.inspect_paths([p])["shards"][0], _direct(p))


def test_habana_packed_without_packing_json(tmp_path):
    """Habana's packer: int32 everywhere, no packing.json; a packed row with a sequence that has no prediction."""
    n, K, W = 6, 3, P + 3
    out = {k: np.zeros((n, S), np.int32) for k in ("input_ids", "input_mask", "segment_ids", "positions")}
    out |= {k: np.zeros((n, W), np.int32) for k in ("masked_lm_positions", "masked_lm_ids")}
    out |= {k: np.zeros((n, K), np.int32) for k in ("next_sentence_positions", "next_sentence_labels")}
    out["next_sentence_weights"] = np.zeros((n, K), np.int32)
    for r in range(n):
        off, slot = 0, 0
        for s in range(1 + r % K):
            L = 4 + r + s
            out["input_ids"][r, off : off + L] = 7 + s
            out["input_mask"][r, off : off + L] = s + 1
            out["next_sentence_positions"][r, s] = off
            out["next_sentence_labels"][r, s] = (r + s) % 2
            out["next_sentence_weights"][r, s] = 1
            for j in range(s):  # sequence s gets s predictions (sequence 1 none)
                out["masked_lm_positions"][r, slot] = off + 1 + j
                out["masked_lm_ids"][r, slot] = 9
                slot += 1
            off += L
    with h5py.File(tmp_path / "packed.hdf5", "w") as f:
        for k, v in out.items():
            f.create_dataset(k, data=v)
    stats = insp.inspect_paths([tmp_path / "packed.hdf5"])["shards"][0]
    _check(stats, _direct(tmp_path / "packed.hdf5"))
    assert stats["sequences_per_row_hist"] == [0, 2, 2, 2] and stats["masked_count_hist"][0] == 6


def test_mlm_only_nsp_is_na_per_shard_and_in_total(tmp_path):
    """MLM-only rows have no NSP label: "n/a" per shard as in the total (it printed "NSP None" per shard)."""
    (tmp_path / "mlm").mkdir()
    _unmasked(tmp_path / "mlm" / "a.hdf5", "mlm")
    _unmasked(tmp_path / "mlm" / "b.hdf5", "mlm", seed=2)
    report = insp.format_report(insp.inspect_paths([tmp_path / "mlm"]))
    assert "NSP random-next fraction: n/a" in report
    assert "None" not in report and report.count("NSP n/a") == 2


def test_nsp_total_is_exact_over_shards(tmp_path):
    """The total NSP fraction is counted, not averaged from rounded per-shard fractions."""
    paths = [_nvidia(tmp_path / f"s{i}.hdf5", n=n, seed=i) for i, n in enumerate((7, 11, 13))]
    labels = np.concatenate([h5py.File(p, "r")["next_sentence_labels"][()] for p in paths])
    assert insp.inspect_paths(paths)["total"]["nsp_random_fraction"] == round(labels.mean(), 6)


def test_empty_shard_reports_no_rows(tmp_path, capsys):
    """An empty shard said "largest token id: -1" and "distribution " with nothing after it."""
    with h5py.File(tmp_path / "empty.hdf5", "w") as f:
        for k, w in (("input_ids", S), ("input_mask", S), ("segment_ids", S), ("masked_lm_positions", P)):
            f.create_dataset(k, shape=(0, w), dtype="i4")
        f.create_dataset("masked_lm_ids", shape=(0, P), dtype="i4")
        f.create_dataset("next_sentence_labels", shape=(0,), dtype="i1")
    assert main(["data", "inspect", str(tmp_path / "empty.hdf5"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["total"]["max_token_id"] is None
    assert main(["data", "inspect", str(tmp_path / "empty.hdf5")]) == 0
    out = capsys.readouterr().out
    assert "no rows: every shard is empty" in out and "-1" not in out and "(empty)" in out


def test_a_shard_named_twice_is_counted_once(tmp_path, capsys):
    """`data inspect dir dir/*.hdf5` counted the shards twice."""
    _nvidia(tmp_path / "a.hdf5")
    t = insp.inspect_paths([tmp_path, tmp_path / "a.hdf5"])["total"]
    assert t["rows"] == 40 and t["shards"] == 1
    assert "given twice" in capsys.readouterr().err


def test_a_parent_of_shard_directories_names_them(tmp_path, capsys):
    """`data inspect runs/demo/data` (shards/ and eval/ below it) said to run `data shards` to create shards."""
    for d in ("shards", "eval"):
        (tmp_path / d).mkdir()
        _nvidia(tmp_path / d / "part_0.hdf5")
    assert main(["data", "inspect", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "eval, shards" in err and "run `bertforge data shards`" not in err
    assert insp.inspect_paths([tmp_path / "shards", tmp_path / "eval"])["total"]["rows"] == 80


def test_a_damaged_shard_is_one_line(tmp_path, capsys):
    """A flipped bit in the compressed rows."""
    p = _nvidia(tmp_path / "s.hdf5", n=400)
    data = bytearray(p.read_bytes())
    for i in range(8000, len(data) - 2000, 500):
        data[i] ^= 0xFF
    p.write_bytes(bytes(data))
    assert main(["data", "inspect", str(p)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "corrupt" in err and str(p) in err


def test_a_masked_position_outside_its_row_is_one_line(tmp_path):
    """A corrupt masked_lm_positions (beyond the row) was counted as a prediction without a word."""
    q = _nvidia(tmp_path / "q.hdf5", n=4)
    with h5py.File(q, "r+") as f:
        f["masked_lm_positions"][2, 0] = S + 5
    with pytest.raises(UserError, match=r"row 2: masked_lm_positions holds 37"):
        insp.inspect_paths([q])


def test_blocks_are_bounded_by_tokens_not_rows(tmp_path, monkeypatch):
    """Reads go in blocks of at most BLOCK_ELEMENTS token slots: 64k rows at seq 8192 would be 4 GB of input_mask
    as int64. The numbers do not depend on where the blocks split."""
    seq, n = 8192, 1100
    with h5py.File(tmp_path / "long.hdf5", "w") as f:
        mask = np.zeros((n, seq), "i1")
        mask[:, :300] = 1
        f.create_dataset("input_ids", data=mask.astype("i4") * 7, compression="gzip", chunks=(64, seq))
        f.create_dataset("input_mask", data=mask, compression="gzip", chunks=(64, seq))
        f.create_dataset("segment_ids", shape=(n, seq), dtype="i1")
        f.attrs.update(bertforge_kind="mlm", max_pred=20, masked_lm_prob=0.15)
    read = []
    real_getitem = h5py.Dataset.__getitem__

    def spy(self, key):
        out = real_getitem(self, key)
        if self.name == "/input_mask":
            read.append(out.size)
        return out

    monkeypatch.setattr(h5py.Dataset, "__getitem__", spy)
    t = insp.inspect_paths([tmp_path / "long.hdf5"])["total"]
    assert t["tokens"] == 300 * n and t["seq_len_hist"][300] == n
    assert max(read) <= 65536 * 128 and len(read) > 1  # old: all 1100 rows (9M slots) at once


def test_plot_caption_matches_its_bars(tmp_path, monkeypatch, capsys):
    """The masked-count panel of a packed data set shows sequences (its caption), written atomically."""
    (tmp_path / "nv").mkdir()
    _nvidia(tmp_path / "nv" / "part_0.hdf5")
    assert main(["pack", "--in", str(tmp_path / "nv"), "--out", str(tmp_path / "packed"), "--shards", "1"]) == 0
    capsys.readouterr()
    import bertforge.runtime.metrics as metrics

    figs = []
    real = metrics.save_figure
    monkeypatch.setattr(metrics, "save_figure", lambda fig, path: (figs.append(fig), real(fig, path))[1])
    assert main(["data", "inspect", str(tmp_path / "packed"), "--plot", str(tmp_path / "p.png")]) == 0
    capsys.readouterr()
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary file left
    lengths, masked = figs[0].axes
    assert "per sequence" in masked.get_title() and masked.get_ylabel() == "sequences"
    rows = ShardSet.open(tmp_path / "packed").rows
    sequences = sum(b.get_height() for b in lengths.patches)
    assert sequences == 40 > rows and sum(b.get_height() for b in masked.patches) == sequences


def test_a_packed_input_mask_beyond_its_row_is_one_line(tmp_path):
    """A packed input_mask is a sequence index 0..S: a corrupt 99 in a 32-token row (or a negative one) is a
    UserError, not a histogram of 99 sequences (a huge value: a bincount of that size)."""
    p = tmp_path / "packed.hdf5"
    mask = np.zeros((2, S), np.int8)
    mask[:, :10] = 1
    mask[1, 3] = 99
    with h5py.File(p, "w") as f:
        for k in ("input_ids", "segment_ids", "positions"):
            f.create_dataset(k, data=np.zeros((2, S), np.int32))
        f.create_dataset("input_mask", data=mask)
        for k in ("masked_lm_positions", "masked_lm_ids"):
            f.create_dataset(k, data=np.zeros((2, P), np.int32))
        for k in ("next_sentence_positions", "next_sentence_labels", "next_sentence_weights"):
            f.create_dataset(k, data=np.zeros((2, 3), np.int32))
    with pytest.raises(UserError, match=r"input_mask holds 99, not a sequence index 0..32"):
        insp.inspect_paths([p])
    with h5py.File(p, "r+") as f:
        f["input_mask"][1, 3] = -1
    with pytest.raises(UserError, match=r"input_mask holds -1"):
        insp.inspect_paths([p])
