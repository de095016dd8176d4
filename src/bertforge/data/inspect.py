"""`bertforge data inspect`: statistics of pre-training shards of any kind we read.

Works on NVIDIA-format shards from any writer (NVIDIA's own scripts, MLPerf's, padded-vocab setups with ids up
to 30527), our dynamic-masking and MLM-only shards, and packed shards (DESIGN §3.3: `input_mask` holds the
sequence index 1..k within a row). Every row is read (nothing is sampled), in blocks of at most BLOCK_ELEMENTS
token slots, so memory is bounded at any shard size, row length and number of shards.

Reported per shard and in total: rows, sequences (= rows unless packed), tokens, sequence-length histogram,
padding fraction, NSP balance (fraction labelled random-next; None for MLM-only rows), masked-count distribution
(predictions per sequence — NVIDIA's first-0 rule, a packed row's predictions split by sequence; for dynamic and
MLM-only shards the count the loader will draw), the largest token id (input_ids and masked_lm_ids; None for
empty shards), and for packed shards the sequences per row.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from bertforge.data.instances import BERT_UNCASED_SPECIAL_IDS, num_to_predict
from bertforge.data.shardset import LOADER_MASKED, REMAKE, SHARD_SUFFIXES, ShardInfo, ShardSet, open_shard, reading
from bertforge.errors import UserError

BLOCK_ELEMENTS = 65536 * 128
"""Token slots (rows x seq_len) read per block: 64k rows at seq 128, fewer at longer rows, so the working arrays
stay a few hundred MB at any sequence length (a fixed 64k rows would be 4 GB of input_mask alone at seq 8192)."""


def _collect(paths: Sequence[str | Path]) -> list[tuple[ShardInfo, int]]:
    """(shard, the max_pred its loader falls back to) of each path (a directory or a shard file), read through
    `ShardSet`; a shard named twice (`data inspect dir dir/*.hdf5`) is counted once."""
    out, seen = [], set()
    for p in paths:
        _check_not_a_parent(Path(p))
        shardset = ShardSet.open(p)
        for info in shardset.infos:
            key = info.path.resolve()
            if key in seen:
                print(f"warning: {info.path} is given twice; counted once", file=sys.stderr, flush=True)
                continue
            seen.add(key)
            out.append((info, shardset.max_pred or 20))  # the loader's default (data.loader.loader_spec)
    return out


def _check_not_a_parent(p: Path) -> None:
    """A UserError naming the subdirectories to inspect when `p` holds no shards itself but they do
    (`data inspect runs/demo/data`: shards/ and eval/): else the error would say to create shards that exist."""
    if not p.is_dir() or any(f.suffix in SHARD_SUFFIXES and not f.name.startswith(".") for f in p.iterdir()):
        return
    subs = [
        d
        for d in sorted(p.iterdir())
        if d.is_dir() and not d.name.startswith(".") and any(f.suffix in SHARD_SUFFIXES for f in d.iterdir())
    ]
    if subs:
        raise UserError(
            f"{p} holds no shards itself but its subdirectories {', '.join(d.name for d in subs)} do; inspect "
            f"those (one kind per command), e.g. `bertforge data inspect {subs[0]}`"
        )


class _Counts:
    """Running histograms and sums of one shard, block by block."""

    def __init__(self, seq: int, max_pred: int):
        self.len_hist = np.zeros(seq + 1, np.int64)
        self.mask_hist = np.zeros(max(max_pred, 1) + 1, np.int64)
        self.per_row_hist: np.ndarray | None = None
        self.tokens = self.sequences = self.nsp_random = self.nsp_count = 0
        self.max_id: int | None = None

    def add_ids(self, ids: np.ndarray) -> None:
        """ids: token ids (input_ids, and masked_lm_ids: an id may only be left as a label, under [MASK])."""
        if ids.size:
            self.max_id = max(int(ids.max()), -1 if self.max_id is None else self.max_id)

    def add_lengths(self, lens: np.ndarray, labels: np.ndarray) -> None:
        """lens: (n,) real tokens of each sequence; labels: NSP labels of the real sequences."""
        self.len_hist += np.bincount(lens, minlength=self.len_hist.size)[: self.len_hist.size]
        self.tokens += int(lens.sum())
        self.sequences += int(lens.size)
        self.nsp_random += int((labels == 1).sum())
        self.nsp_count += int(labels.size)

    def add_per_row(self, per_row: np.ndarray) -> None:
        """per_row: (B,) sequences in each packed row."""
        top = int(per_row.max(initial=0))
        if self.per_row_hist is None or self.per_row_hist.size <= top:
            grown = np.zeros(top + 1, np.int64)
            if self.per_row_hist is not None:
                grown[: self.per_row_hist.size] = self.per_row_hist
            self.per_row_hist = grown
        self.per_row_hist += np.bincount(per_row, minlength=self.per_row_hist.size)

    def add_masked(self, m: np.ndarray) -> None:
        """m: (n,) predictions of each sequence."""
        if m.size and m.max() >= self.mask_hist.size:
            self.mask_hist = np.pad(self.mask_hist, (0, int(m.max()) + 1 - self.mask_hist.size))
        self.mask_hist += np.bincount(m, minlength=self.mask_hist.size)[: self.mask_hist.size]


def _real_slots(path: Path, pos: np.ndarray, first_row: int, seq: int) -> np.ndarray:
    """(B, P) bool: the slots before the first 0 of masked_lm_positions (DESIGN §3.2: the count of real
    predictions is the index of the first 0, as NVIDIA's loader reads it); a position outside the row is a
    UserError naming the shard and row."""
    bad = np.flatnonzero(((pos < 0) | (pos >= seq)).any(1))
    if bad.size:
        row = pos[bad[0]]
        raise UserError(
            f"shard {path} row {first_row + int(bad[0])}: masked_lm_positions holds "
            f"{int(row[(row < 0) | (row >= seq)][0])}, outside its {seq}-token rows; the shard is corrupt; {REMAKE}"
        )
    return np.logical_and.accumulate(pos != 0, axis=1)


def _packed_block(
    f: h5py.File, a: int, b: int, im: np.ndarray, pos: np.ndarray | None, real: np.ndarray | None, c: _Counts
) -> None:
    """A packed block: input_mask (B, S) holds the sequence index 1..k of every token; lengths, NSP labels and
    masked counts are per sequence, as for the same sequences unpacked."""
    B, k = b - a, int(im.max(initial=0))
    # a row of S tokens holds at most S sequences; a negative index would count in the row before (bincount below)
    if im.size and (im.min() < 0 or k > im.shape[1]):
        bad = int(im.min()) if im.min() < 0 else k
        raise UserError(f"shard {f.filename}: input_mask holds {bad}, not a sequence index 0..{im.shape[1]}; {REMAKE}")
    rows = np.arange(B)[:, None]
    # (B, k): tokens of sequence j+1 in each row, one bincount for any k
    lens = np.bincount((rows * (k + 1) + im).ravel(), minlength=B * (k + 1)).reshape(B, k + 1)[:, 1:]
    present = lens > 0
    c.add_per_row(present.sum(1))
    if "next_sentence_weights" in f:
        labels = f["next_sentence_labels"][a:b][f["next_sentence_weights"][a:b] > 0]
    else:
        labels = np.zeros(0, np.int8)
    c.add_lengths(lens[present], labels)  # one length per sequence
    if pos is not None and real is not None:
        r, s = np.nonzero(real)
        seq_of = im[r, pos[r, s]]  # the sequence each prediction belongs to
        per_seq = np.bincount(r * (k + 1) + seq_of, minlength=B * (k + 1)).reshape(B, k + 1)[:, 1:]
        c.add_masked(per_seq[present])


def _drawn_counts(ids: np.ndarray, im: np.ndarray, info: ShardInfo, max_pred: int) -> np.ndarray:
    """Predictions the loader draws for unmasked rows (`instances.mask_batch`): Google's count, capped by the
    maskable tokens (not [CLS]/[SEP]/padding); whole-word masking may take fewer (a word that does not fit)."""
    n = (im != 0).sum(1)
    a = info.attrs
    special = [int(a[k]) for k in ("pad_id", "cls_id", "sep_id") if k in a] or list(BERT_UNCASED_SPECIAL_IDS)
    cand = (np.arange(ids.shape[1])[None, :] < n[:, None]) & ~np.isin(ids, special)
    return np.minimum(num_to_predict(n, max_pred, float(a.get("masked_lm_prob", 0.15))), cand.sum(1))


def shard_stats(info: ShardInfo | str | Path, default_max_pred: int = 20) -> dict[str, Any]:
    """Statistics of one shard (see the module docstring); histograms as lists indexed by value.
    `default_max_pred`: an unmasked shard's masked-LM slots when its attributes name none (the manifest's)."""
    info = info if isinstance(info, ShardInfo) else ShardInfo.read(Path(info))
    n, seq, kind = info.rows, info.seq_len, info.kind
    max_pred = info.max_pred or int(info.attrs.get("max_pred", 0)) or default_max_pred
    c = _Counts(seq, max_pred)
    step = max(1, BLOCK_ELEMENTS // max(seq, 1))
    with open_shard(info.path) as f, reading(info.path):
        for a in range(0, n, step):
            b = min(n, a + step)
            ids = f["input_ids"][a:b]
            im = f["input_mask"][a:b].astype(np.int64)  # (B, S)
            c.add_ids(ids)
            pos = real = None
            if "masked_lm_positions" in f:
                pos = f["masked_lm_positions"][a:b]
                real = _real_slots(info.path, pos, a, seq)
                if "masked_lm_ids" in f:
                    c.add_ids(f["masked_lm_ids"][a:b][real])
            if kind == "packed":
                _packed_block(f, a, b, im, pos, real, c)
                continue
            nsp = f["next_sentence_labels"][a:b] if "next_sentence_labels" in f else np.zeros(0, np.int8)
            c.add_lengths((im != 0).sum(1), nsp)  # MLM-only rows have no NSP label
            if real is not None:
                c.add_masked(real.sum(1))
            else:  # dynamic and MLM-only shards: the count the loader draws
                c.add_masked(_drawn_counts(ids, im, info, max_pred))
    return _stats_dict(info, max_pred, c)


def _mean(hist: Sequence[int] | np.ndarray) -> float:
    h = np.asarray(hist, np.int64)
    return round(float((np.arange(h.size) * h).sum() / max(1, h.sum())), 3)


def _stats_dict(info: ShardInfo, max_pred: int, c: _Counts) -> dict[str, Any]:
    n, seq = info.rows, info.seq_len
    slots = n * seq
    mh = c.mask_hist
    predictions = int((np.arange(mh.size) * mh).sum())
    stats: dict[str, Any] = {
        "file": str(info.path),
        "kind": info.kind,
        "rows": int(n),
        "seq_len": int(seq),
        "max_pred": max_pred,
        "sequences": c.sequences,
        "tokens": c.tokens,
        "padding_fraction": round(1 - c.tokens / slots, 6) if slots else 0.0,
        "mean_seq_len": round(c.tokens / c.sequences, 3) if c.sequences else 0.0,
        "nsp_random_fraction": round(c.nsp_random / c.nsp_count, 6) if c.nsp_count else None,
        "nsp_random": c.nsp_random,
        "nsp_labelled": c.nsp_count,
        "masked_predictions": predictions,
        "masked_per_sequence_mean": _mean(mh),
        "masked_per_row_mean": round(predictions / n, 3) if n else 0.0,
        "max_token_id": c.max_id,
        "seq_len_hist": c.len_hist.tolist(),
        "masked_count_hist": mh.tolist(),
    }
    if c.per_row_hist is not None:
        stats["sequences_per_row_hist"] = c.per_row_hist.tolist()
        stats["avg_seq_per_row"] = round(c.sequences / n, 4) if n else 0.0
    return stats


def merge(stats: list[dict[str, Any]]) -> dict[str, Any]:
    def add(key: str) -> list[int]:
        width = max(len(s[key]) for s in stats)
        total = np.zeros(width, np.int64)
        for s in stats:
            total[: len(s[key])] += s[key]
        return total.tolist()

    rows = sum(s["rows"] for s in stats)
    seqs = sum(s["sequences"] for s in stats)
    toks = sum(s["tokens"] for s in stats)
    slots = sum(s["rows"] * s["seq_len"] for s in stats)
    labelled = sum(s["nsp_labelled"] for s in stats)
    predictions = sum(s["masked_predictions"] for s in stats)
    ids = [s["max_token_id"] for s in stats if s["max_token_id"] is not None]
    mh = add("masked_count_hist")
    out = {
        "shards": len(stats),
        "kinds": sorted({s["kind"] for s in stats}),
        "rows": rows,
        "sequences": seqs,
        "tokens": toks,
        "padding_fraction": round(1 - toks / slots, 6) if slots else 0.0,
        "mean_seq_len": round(toks / seqs, 3) if seqs else 0.0,
        "nsp_random_fraction": round(sum(s["nsp_random"] for s in stats) / labelled, 6) if labelled else None,
        "nsp_random": sum(s["nsp_random"] for s in stats),
        "nsp_labelled": labelled,
        "masked_predictions": predictions,
        "masked_per_sequence_mean": _mean(mh),
        "masked_per_row_mean": round(predictions / rows, 3) if rows else 0.0,
        "max_token_id": max(ids) if ids else None,
        "seq_len_hist": add("seq_len_hist"),
        "masked_count_hist": mh,
    }
    packed = [s for s in stats if "sequences_per_row_hist" in s]
    if packed:
        out["sequences_per_row_hist"] = add("sequences_per_row_hist") if len(packed) == len(stats) else None
        packed_rows = sum(s["rows"] for s in packed)  # the packed shards' own rows, not those of unpacked ones
        out["avg_seq_per_row"] = round(sum(s["sequences"] for s in packed) / packed_rows, 4) if packed_rows else 0.0
    return out


def inspect_paths(paths: Sequence[str | Path]) -> dict[str, Any]:
    per = [shard_stats(info, default_max_pred) for info, default_max_pred in _collect(paths)]
    return {"total": merge(per), "shards": per}


def _pct(hist: list[int], q: float) -> int:
    c = np.cumsum(hist)
    return int(np.searchsorted(c, q * c[-1])) if c.size and c[-1] else 0


def _nsp(fraction: float | None) -> str:
    """An NSP fraction as printed: "n/a" where no sequence has a label (MLM-only rows), per shard and in total."""
    return "n/a" if fraction is None else str(fraction)


def _masked_what(kinds: Sequence[str]) -> str:
    """What the masked-count histogram counts: stored predictions, or for unmasked kinds the loader's draw."""
    drawn = [k for k in kinds if k in LOADER_MASKED]
    return "masked predictions per sequence" + (f" ({'/'.join(drawn)}: as the loader draws them)" if drawn else "")


def format_report(result: dict[str, Any]) -> str:
    t = result["total"]
    lines = [
        f"{t['shards']} shard(s), kind {'/'.join(t['kinds'])}: {t['rows']:,} rows, {t['sequences']:,} sequences, "
        f"{t['tokens']:,} tokens"
    ]
    if not t["rows"]:  # no histogram, mean or id to show: "largest token id: -1" read as a real id
        lines.append(
            "no rows: every shard is empty; re-create them with the command that wrote them (`bertforge data "
            "shards` or `bertforge pack`) or delete them"
        )
    else:
        lines += [
            f"sequence length: mean {t['mean_seq_len']}, p50 {_pct(t['seq_len_hist'], 0.5)}, "
            f"p90 {_pct(t['seq_len_hist'], 0.9)}, max {int(np.flatnonzero(t['seq_len_hist']).max(initial=0))}",
            f"padding fraction: {t['padding_fraction']:.3f}",
            f"NSP random-next fraction: {_nsp(t['nsp_random_fraction'])}",
            f"{_masked_what(t['kinds'])}: mean {t['masked_per_sequence_mean']}, distribution "
            + ", ".join(f"{i}:{v}" for i, v in enumerate(t["masked_count_hist"]) if v),
            f"largest token id: {t['max_token_id']}",
        ]
    if "avg_seq_per_row" in t:
        lines.append(
            f"packed: {t['avg_seq_per_row']} sequences per row on average, "
            f"{t['masked_per_row_mean']} masked predictions per row"
        )
    lines.append("per shard:")
    for s in result["shards"]:
        lines.append(
            f"  {s['file']}: {s['kind']}, {s['rows']:,} rows x {s['seq_len']}"
            + (
                f", padding {s['padding_fraction']:.3f}, NSP {_nsp(s['nsp_random_fraction'])}"
                if s["rows"]
                else " (empty)"
            )
        )
    return "\n".join(lines)


def plot(result: dict[str, Any], path: str | Path) -> Path:
    """Sequence-length and masked-count histograms as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from bertforge.runtime.metrics import save_figure

    t = result["total"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    axes[0].bar(range(len(t["seq_len_hist"])), t["seq_len_hist"], width=1.0)
    axes[0].set(title=f"sequence length ({t['sequences']:,} sequences)", xlabel="tokens", ylabel="sequences")
    axes[1].bar(range(len(t["masked_count_hist"])), t["masked_count_hist"], width=0.8)
    axes[1].set(title=_masked_what(t["kinds"]), xlabel="predictions", ylabel="sequences")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return save_figure(fig, path)


_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def check_plot_path(path: str | Path) -> Path:
    """--plot names a PNG file, refused before any shard is read: a directory, a path under a file, a name that
    is not .png (`--plot s/*.hdf5` lets the shell make a shard the target), an existing file that is not a PNG,
    or a folder we cannot write."""
    p = Path(path)
    if p.is_dir() or str(path).endswith(("/", "\\")):
        raise UserError(f"--plot {path} is a directory; give a file name, e.g. --plot {p / 'shards.png'}")
    if p.suffix.lower() != ".png":
        raise UserError(f"--plot {path}: the plot is a PNG; give a name ending in .png (e.g. --plot shards.png)")
    if any(parent.exists() and not parent.is_dir() for parent in p.parents):
        raise UserError(f"--plot {path}: a parent of it is a file, not a directory; choose another path")
    if p.is_file():
        with open(p, "rb") as f:
            if f.read(len(_PNG_MAGIC)) != _PNG_MAGIC:
                raise UserError(f"--plot {path} exists and is not a PNG; it is kept: choose another name")
    folder = next((d for d in p.parents if d.exists()), Path("."))
    if not os.access(folder, os.W_OK):
        raise UserError(f"--plot {path}: {folder} is not writable; choose another path")
    return p


def run_inspect(paths: Sequence[str | Path], as_json: bool = False, plot_path: str | None = None) -> int:
    png = check_plot_path(plot_path) if plot_path else None
    result = inspect_paths(paths)
    print(json.dumps(result) if as_json else format_report(result))
    if png is not None:
        # stderr under --json: stdout stays one JSON document
        print(f"plot: wrote {plot(result, png)}", file=sys.stderr if as_json else sys.stdout)
    return 0
