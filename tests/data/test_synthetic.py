"""The synthetic pre-training source: the loader's batch conventions, well-formed rows, Google's masking rule,
the length histograms, packed rows, exact resume, world-size independence, and a model step on its batches."""

from __future__ import annotations

import importlib.util
import itertools
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from bertforge.data import packing as pk
from bertforge.data import packing_algorithms as pa
from bertforge.data import packing_rows as pr
from bertforge.data import synthetic as syn
from bertforge.data.instances import num_to_predict
from bertforge.data.loader import PretrainLoader
from bertforge.errors import ConfigError, UserError


def _make_shards():
    """tests/train/conftest.py's shard maker (importlib mode: a conftest cannot be imported by name)."""
    path = Path(__file__).resolve().parents[1] / "train" / "conftest.py"
    spec = importlib.util.spec_from_file_location("_train_conftest", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.make_shards


def _loader(**kw) -> syn.SyntheticLoader:
    args = dict(
        seq_len=64,
        max_pred=10,
        vocab_size=30522,
        global_batch=8,
        micro_batch=8,
        rank=0,
        world_size=1,
        seed=3,
        histogram="wiki",
        pack=0,
    )
    args.update(kw)
    return syn.SyntheticLoader(**args)


def _batches(loader: syn.SyntheticLoader, n: int, start: int = 0) -> list[dict[str, torch.Tensor]]:
    return list(itertools.islice(loader.iterate(start), n))


# ---------------------------------------------------------------------------------------- same as the loader
def test_keys_dtypes_and_shapes_equal_the_real_loaders(tmp_path):
    make_shards = _make_shards()
    shards = make_shards(tmp_path / "shards", n_shards=2, rows=32, seq_len=32, max_pred=5)
    pk.pack_shards(pk.PackConfig(str(shards), str(tmp_path / "packed"), max_per_pack=3), log=lambda m: None)
    for directory, pack in ((shards, 0), (tmp_path / "packed", 3)):
        real = next(PretrainLoader.from_dir(directory, 4, 4, 0, 1, seed=0, num_workers=0).iterate())
        ours = next(_loader(seq_len=32, max_pred=5, vocab_size=64, global_batch=4, micro_batch=4, pack=pack).iterate())
        assert ours.keys() == real.keys()
        for k in real:
            assert ours[k].dtype == real[k].dtype == torch.int64 and ours[k].device.type == "cpu"
            assert ours[k].shape[0] == 4 and ours[k].dim() == real[k].dim(), k
        assert ours["input_ids"].shape == real["input_ids"].shape
        if pack:
            assert ours["nsp_positions"].shape == real["nsp_positions"].shape == (4, 3)
            assert ours["masked_positions"].shape[1] == pr.mlm_width(5, 3) == 8
            assert set(ours["nsp_labels"].unique().tolist()) <= {-1, 0, 1}
        else:
            assert ours["masked_positions"].shape == real["masked_positions"].shape


def test_properties():
    lo = _loader(global_batch=32, micro_batch=4, world_size=2, rank=1)
    assert lo.accum == 4 and lo.my_lanes == [4, 5, 6, 7] and lo.kind == "synthetic"
    assert lo.seq_len == 64 and lo.max_pred == 10 and lo.avg_seq_per_sample == 1.0
    packed = _loader(seq_len=512, max_pred=80, pack=3)
    assert packed.kind == "synthetic-packed" and packed.max_pred >= 83
    assert 1.7 < packed.avg_seq_per_sample < 2.0  # LPFHP K=3 on the phase-2 imitation
    with pytest.raises(UserError, match="not a multiple"):
        _loader(global_batch=10, micro_batch=4)


@pytest.mark.parametrize("vocab_size", [1000, 1999, 2000, 30522])
def test_every_vocab_size_leaves_many_word_ids(vocab_size):
    """A vocab of 1000 in BERT's layout (words from 999) held one word id: "random" rows every MLM guessed."""
    t = syn.token_ids(vocab_size)
    assert vocab_size - t.first_word >= 995


# ---------------------------------------------------------------------------------------- well-formed rows
def _check_unpacked_row(ids, mask, seg, pos, lab, nsp, vocab_size, max_pred):
    t = syn.token_ids(vocab_size)
    L = int(mask.sum())
    assert mask[:L].all() and not mask[L:].any() and (ids[L:] == t.pad).all()
    sep1 = int(((seg == 0) & (mask == 1)).sum()) - 1  # segment 0: [CLS] A [SEP]
    assert 2 <= sep1 <= L - 3 and (seg[sep1 + 1 : L] == 1).all() and not seg[L:].any()
    assert ids[0] == t.cls and ids[sep1] == t.sep and ids[L - 1] == t.sep
    real = pos[pos != 0]
    assert (pos[len(real) :] == 0).all() and (np.diff(real) > 0).all()  # sorted, empty slots last
    assert len(real) == num_to_predict(L, max_pred, 0.15)  # Google: min(max_pred, max(1, round(0.15 L)))
    assert not set(real.tolist()) & {0, sep1, L - 1} and real.max() < L
    assert (lab[: len(real)] >= t.first_word).all() and (lab[len(real) :] == 0).all()
    assert nsp in (0, 1)


@pytest.mark.parametrize("vocab_size", [64, 30522])
def test_unpacked_rows_are_well_formed(vocab_size):
    lo = _loader(vocab_size=vocab_size, micro_batch=64, global_batch=64)
    for b in _batches(lo, 3):
        cols = [
            b[k].numpy()
            for k in (
                "input_ids",
                "attention_mask",
                "token_type_ids",
                "masked_positions",
                "masked_labels",
                "nsp_labels",
            )
        ]
        for row in zip(*cols):
            _check_unpacked_row(*row, vocab_size, 10)


def test_80_10_10_replacement():
    lo = _loader(seq_len=128, max_pred=20, micro_batch=256, global_batch=256)
    b = lo.batch(0, 0)
    ids, pos, lab = b["input_ids"], b["masked_positions"], b["masked_labels"]
    got = ids.gather(1, pos)[pos != 0]
    lab = lab[pos != 0]
    n = len(got)
    assert n > 4000
    mask_share = (got == syn.token_ids(30522).mask).float().mean().item()
    kept_share = (got == lab).float().mean().item()
    assert abs(mask_share - 0.8) < 0.03 and abs(kept_share - 0.1) < 0.02  # the rest: random words
    assert 0.4 < b["nsp_labels"].float().mean().item() < 0.6


@pytest.mark.parametrize("seq_len, histogram", [(128, "wiki"), (512, "wiki"), (64, [[10, 1], [50, 3]])])
def test_mean_length_within_sampling_error(seq_len, histogram):
    lo = _loader(seq_len=seq_len, max_pred=20, micro_batch=256, global_batch=256, histogram=histogram)
    lengths = torch.cat([b["attention_mask"].sum(1) for b in _batches(lo, 8)]).double().numpy()
    pmf = syn.length_pmf(histogram, seq_len)
    mean = (pmf * np.arange(seq_len + 1)).sum()
    sd = np.sqrt((pmf * (np.arange(seq_len + 1) - mean) ** 2).sum())
    assert abs(lengths.mean() - mean) < 4 * sd / np.sqrt(len(lengths))
    assert lo.mean_length == pytest.approx(mean)
    if not isinstance(histogram, str):
        assert set(np.unique(lengths).tolist()) == {10.0, 50.0}


def test_histograms():
    p2 = syn.wiki_phase2_pmf(512)
    assert p2[512] == pytest.approx(0.234) and p2[:5].sum() == 0 and p2.sum() == pytest.approx(1)
    assert np.argmax(p2[:512]) == 50 and 0.49 < 1 - (p2 * np.arange(513)).sum() / 512 < 0.53
    sample = syn.wiki_like_lengths(200_000)  # the sampler draws from the same distribution
    assert abs(sample.mean() - (p2 * np.arange(513)).sum()) < 1.0
    p1 = syn.length_pmf("wiki", 128)
    assert p1[128] == pytest.approx(0.76 + 0.10 / 124) and p1[:5].sum() == 0 and p1.sum() == pytest.approx(1)
    assert 0.08 < 1 - (p1 * np.arange(129)).sum() / 128 < 0.14  # ~11% padding
    assert syn.length_pmf("full", 64)[64] == 1.0
    for bad in ("zipf", [[3, 1.0]], [[70, 1.0]], [[10, -1]], [[10, 0]], [["x"]]):
        with pytest.raises(ConfigError):
            syn.length_pmf(bad, 64)


# ---------------------------------------------------------------------------------------- packed rows
def _sequence(b: dict[str, torch.Tensor], r: int, j: int, width: int) -> tuple:
    """Sequence j (1-based) of packed row r as an unpacked row: (ids, mask, seg, positions, labels) with its
    masked positions shifted back by its offset."""
    mask = b["attention_mask"][r].numpy()
    where = np.flatnonzero(mask == j)
    start, L = int(where[0]), len(where)
    assert (where == start + np.arange(L)).all()  # one contiguous block
    pos, lab = b["masked_positions"][r].numpy(), b["masked_labels"][r].numpy()
    mine = (pos >= start) & (pos < start + L) & (pos != 0)
    own_pos, own_lab = np.zeros(width, np.int64), np.zeros(width, np.int64)
    own_pos[: mine.sum()], own_lab[: mine.sum()] = pos[mine] - start, lab[mine]
    return b["input_ids"][r].numpy()[where], np.ones(L), b["token_type_ids"][r].numpy()[where], own_pos, own_lab


def test_packed_rows_follow_the_packed_schema():
    lo = _loader(
        seq_len=128, max_pred=20, micro_batch=64, global_batch=64, pack=3, histogram=[[20, 1], [60, 1], [128, 1]]
    )
    seqs = 0
    for b in _batches(lo, 2):
        for r in range(64):
            mask, pid = b["attention_mask"][r].numpy(), b["position_ids"][r].numpy()
            nsp_pos, nsp = b["nsp_positions"][r].numpy(), b["nsp_labels"][r].numpy()
            pos = b["masked_positions"][r].numpy()
            k = int(mask.max())
            n_real = int((mask > 0).sum())
            assert k >= 1 and (np.diff(mask[:n_real]) == np.diff(mask[:n_real]).clip(0, 1)).all()
            assert (mask[:n_real] > 0).all() and not mask[n_real:].any()  # sequences 1..k, then padding
            assert (nsp[:k] >= 0).all() and (nsp[k:] == -1).all()  # empty NSP slots: -1
            real = pos[pos != 0]
            assert (np.diff(real) > 0).all() and (pos[len(real) :] == 0).all()
            for j in range(1, k + 1):
                ids, ones, seg, own_pos, own_lab = _sequence(b, r, j, lo.max_pred)
                start = int(np.flatnonzero(mask == j)[0])
                assert len(ids) in (20, 60, 128) and nsp_pos[j - 1] == start  # nsp_positions at each [CLS]
                assert (pid[start : start + len(ids)] == np.arange(len(ids))).all()  # positions restart at 0
                _check_unpacked_row(ids, ones, seg, own_pos, own_lab, nsp[j - 1], 30522, 20)
            seqs += k
    assert seqs / 128 == pytest.approx(lo.avg_seq_per_sample, rel=0.25)


@pytest.mark.parametrize(
    "seq_len, k, histogram", [(512, 3, "wiki"), (64, 5, [[5, 1], [9, 2], [30, 1], [64, 1]]), (32, 1, "wiki")]
)
def test_pack_in_order_equals_build_packed_rows(seq_len, k, histogram):
    plan = syn.pack_plan(seq_len, syn._hashable(histogram), k, 10)
    rng = np.random.default_rng(k)
    lengths = plan.table[np.searchsorted(plan.cdf, rng.random(64) * plan.cdf[-1], side="right")]  # (64, K)
    used = lengths > 0
    samples = syn.make_sequences(lengths[used], seq_len, 10, 30522, rng)
    packs = np.where(used, np.cumsum(used.ravel()).reshape(used.shape) - 1, -1)  # (64, K) sequence indices
    fast, reference = syn.pack_in_order(samples, lengths, plan.width), pr.build_packed_rows(samples, packs, plan.width)
    assert fast.keys() == reference.keys()
    for name in reference:
        assert fast[name].dtype == reference[name].dtype and np.array_equal(fast[name], reference[name]), name


def test_pack_plan_matches_bertforge_pack():
    plan = syn.pack_plan(512, "wiki", 3, 80)
    assert plan.table.shape[1] == 3 and (plan.table.sum(1) <= 512).all() and plan.width >= 83
    strategy = pa.lpfhp(np.rint(syn.wiki_phase2_pmf(512) * syn.PACK_SAMPLE).astype(np.int64), 512, 3)
    assert plan.avg_seq_per_sample == pytest.approx(strategy.sequences / strategy.packs)
    assert 0.85 < plan.efficiency < 0.95
    assert syn.packed_rows_per_update(256, 1.8, 8, 2) == 144 and syn.packed_rows_per_update(256, 1.0, 8, 2) == 256


# ---------------------------------------------------------------------------------------- determinism
@pytest.mark.parametrize("pack, workers", [(0, 0), (2, 0), (2, 2)])
def test_exact_resume(pack, workers):
    lo = _loader(global_batch=8, micro_batch=2, pack=pack)
    full = _batches(lo, 5 * lo.accum)
    lo.num_workers = workers  # worker processes hand the same batches out in the same order
    resumed = _batches(lo, 2 * lo.accum, start=3)
    for a, b in zip(full[3 * lo.accum :], resumed):
        assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(full[0]["input_ids"], full[1]["input_ids"])


def test_update_data_does_not_depend_on_world_size():
    one = _batches(_loader(global_batch=8, micro_batch=2, world_size=1), 8)  # accum 4: 2 updates
    ranks = [_batches(_loader(global_batch=8, micro_batch=2, world_size=2, rank=r), 4) for r in (0, 1)]  # accum 2
    for update in range(2):
        two = ranks[0][2 * update : 2 * update + 2] + ranks[1][2 * update : 2 * update + 2]
        for a, b in zip(one[4 * update : 4 * update + 4], two):
            assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(one[0]["input_ids"], one[1]["input_ids"])  # lanes differ
    assert not torch.equal(_loader(seed=4).batch(0, 0)["input_ids"], _loader(seed=3).batch(0, 0)["input_ids"])


# ---------------------------------------------------------------------------------------- model + config
@pytest.mark.parametrize("pack", [0, 3])
def test_tiny_model_trains_on_synthetic_batches(pack):
    from bertforge.model import BertConfig, build_model

    torch.manual_seed(0)
    model = build_model(BertConfig.from_preset("tiny", vocab_size=64, max_position_embeddings=64), "pretraining")
    batch = _loader(vocab_size=64, pack=pack).batch(0, 0)
    out = model(**batch)
    out.loss.backward()
    assert torch.isfinite(out.loss) and out.loss.item() > 0
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    assert model.bert.embeddings.word_embeddings.weight.grad.abs().sum() > 0


def test_config_keys_and_loader_for():
    from bertforge.config import build_config
    from bertforge.train.config import PretrainConfig

    cfg = build_config(
        PretrainConfig,
        {},
        [
            "data.input_dir=synthetic",
            "data.synthetic_seq_len=512",
            "data.synthetic_max_pred=80",
            "data.synthetic_pack=3",
        ],
    )
    assert cfg.data.synthetic and cfg.data.synthetic_histogram == "wiki" and cfg.data.synthetic_vocab_size == 30522
    lo = syn.loader_for(cfg.data, global_batch=256, micro_batch=8, rank=0, world_size=1, seed=1)
    assert lo.kind == "synthetic-packed" and lo.accum == round(256 / lo.avg_seq_per_sample / 8)
    assert lo.num_workers == cfg.data.num_workers and lo.prefetch == cfg.data.prefetch
    assert syn.loader_for(SimpleNamespace(**{**vars(cfg.data), "synthetic_pack": 0}), 256, 8, 0, 1, 1).accum == 32
    custom = build_config(
        PretrainConfig, {"data": {"input_dir": "synthetic", "synthetic_histogram": [[64, 1]], "synthetic_seq_len": 64}}
    )
    assert syn.loader_for(custom.data, 8, 8, 0, 1, 0).batch(0, 0)["attention_mask"].sum() == 8 * 64
    for bad in (
        ["data.synthetic_histogram=zipf"],
        ["data.synthetic_pack=-1"],
        ["data.synthetic_max_pred=200"],
        ["data.synthetic_vocab_size=8"],
        ["data.synthetic_seq_len=4"],
        ["data.synthetic_pack_algorithm=best"],
        ["data.input_dir=synthetic", "data.pack_per_row=3"],
    ):
        with pytest.raises(ConfigError):
            build_config(PretrainConfig, {}, bad)


def test_a_packing_plan_is_solved_once_per_machine(tmp_path, monkeypatch):
    """NNLSHP's least squares took ~11 s at seq 512 in a benchmark's process and again in its child's set-up:
    the plan is solved once and read back (equal), and a damaged file is solved again."""
    import numpy as np

    from bertforge.data import packing_algorithms as pa
    from bertforge.data import synthetic

    monkeypatch.setenv("BERTFORGE_CACHE", str(tmp_path))
    solved = []
    real = pa.pack_histogram
    monkeypatch.setattr(pa, "pack_histogram", lambda *a: solved.append(a) or real(*a))

    def plan():
        synthetic.pack_plan.cache_clear()  # a new process
        return synthetic.pack_plan(64, "wiki", 3, 10, algorithm="nnlshp")

    first, again = plan(), plan()
    assert len(solved) == 1
    assert np.array_equal(first.table, again.table) and np.array_equal(first.cdf, again.cdf)
    assert (first.avg_seq_per_sample, first.width) == (again.avg_seq_per_sample, again.width)
    (saved,) = (tmp_path / "packing").iterdir()
    saved.write_text('{"combos": [[1]], "counts": [1]}')  # not this histogram's
    plan()
    assert len(solved) == 2
    synthetic.pack_plan.cache_clear()
