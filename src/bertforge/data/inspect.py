"""`bertforge data inspect`: statistics of pre-training shards of any kind we read.

Works on NVIDIA-format shards from any writer (NVIDIA's own scripts, padded-vocab setups with ids up to
30527), our dynamic-masking shards, and packed shards (DESIGN §3.3: `input_mask` holds the sequence index
1..k within a row). Reads in row blocks, so any shard size fits in memory.

Reported per shard and in total: rows, sequences (= rows unless packed), tokens, sequence-length histogram,
padding fraction, NSP balance (fraction labelled random-next), masked-count distribution (predictions per
sequence; for dynamic shards the count the loader will draw), the largest token id, and for packed shards
the sequences per row.
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

from bertforge.data.instances import num_to_predict
from bertforge.data.shardset import ShardInfo, ShardSet, open_shard, reading
from bertforge.errors import UserError

BLOCK = 65536


def _collect(paths: Sequence[str | Path]) -> list[ShardInfo]:
    """The shards of each path (a directory or a shard file), read through `ShardSet`."""
    return [info for p in paths for info in ShardSet.open(p).infos]


class _Counts:
    """Running histograms and sums of one shard, block by block."""

    def __init__(self, seq: int, max_pred: int):
        self.len_hist = np.zeros(seq + 1, np.int64)
        self.mask_hist = np.zeros(max(max_pred, 1) + 1, np.int64)
        self.per_row_hist: np.ndarray | None = None
        self.tokens = self.sequences = self.nsp_random = self.nsp_count = 0
        self.max_id = -1

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
        """m: (B,) predictions per row."""
        if m.size and m.max() >= self.mask_hist.size:
            self.mask_hist = np.pad(self.mask_hist, (0, int(m.max()) + 1 - self.mask_hist.size))
        self.mask_hist += np.bincount(m, minlength=self.mask_hist.size)[: self.mask_hist.size]


def _packed_block(f: h5py.File, a: int, b: int, im: np.ndarray, c: _Counts) -> None:
    """A packed block: input_mask (B, S) holds the sequence index 1..k of every token."""
    k = int(im.max()) if im.size else 0
    counts = np.stack([(im == v).sum(1) for v in range(1, k + 1)], 1) if k else np.zeros((b - a, 0), int)  # (B, k)
    c.add_per_row((counts > 0).sum(1))
    if "next_sentence_weights" in f:
        labels = f["next_sentence_labels"][a:b][f["next_sentence_weights"][a:b] > 0]
    else:
        labels = np.zeros(0, np.int8)
    c.add_lengths(counts[counts > 0], labels)  # one length per sequence


def shard_stats(info: ShardInfo | str | Path) -> dict[str, Any]:
    """Statistics of one shard (see the module docstring); histograms as lists indexed by value."""
    info = info if isinstance(info, ShardInfo) else ShardInfo.read(Path(info))
    n, seq, kind = info.rows, info.seq_len, info.kind
    max_pred = info.max_pred or int(info.attrs.get("max_pred", 0))
    c = _Counts(seq, max_pred)
    with open_shard(info.path) as f, reading(info.path):
        for a in range(0, n, BLOCK):
            b = min(n, a + BLOCK)
            ids = f["input_ids"][a:b]
            im = f["input_mask"][a:b].astype(np.int64)  # (B, S)
            c.max_id = max(c.max_id, int(ids.max())) if ids.size else c.max_id
            if kind == "packed":
                _packed_block(f, a, b, im, c)
            else:
                nsp = f["next_sentence_labels"][a:b] if "next_sentence_labels" in f else np.zeros(0, np.int8)
                c.add_lengths((im != 0).sum(1), nsp)  # MLM-only rows have no NSP label
            if "masked_lm_positions" in f:
                # a real prediction has a nonzero position (position 0 is [CLS]); packed rows: count per row
                c.add_masked((f["masked_lm_positions"][a:b] != 0).sum(1))
            elif max_pred:  # dynamic shards: the exact count the loader draws
                c.add_masked(num_to_predict((im != 0).sum(1), max_pred, float(info.attrs.get("masked_lm_prob", 0.15))))
    return _stats_dict(info, max_pred, c)


def _stats_dict(info: ShardInfo, max_pred: int, c: _Counts) -> dict[str, Any]:
    n, seq = info.rows, info.seq_len
    slots = n * seq
    mh = c.mask_hist
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
        "masked_per_row_mean": round(float((np.arange(mh.size) * mh).sum() / max(1, mh.sum())), 3),
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
    nsp = [(s["nsp_random_fraction"], s["sequences"]) for s in stats if s["nsp_random_fraction"] is not None]
    mh = add("masked_count_hist")
    out = {
        "shards": len(stats),
        "kinds": sorted({s["kind"] for s in stats}),
        "rows": rows,
        "sequences": seqs,
        "tokens": toks,
        "padding_fraction": round(1 - toks / slots, 6) if slots else 0.0,
        "mean_seq_len": round(toks / seqs, 3) if seqs else 0.0,
        "nsp_random_fraction": round(sum(f * w for f, w in nsp) / max(1, sum(w for _, w in nsp)), 6) if nsp else None,
        "masked_per_row_mean": round(float((np.arange(len(mh)) * np.asarray(mh)).sum() / max(1, sum(mh))), 3),
        "max_token_id": max(s["max_token_id"] for s in stats),
        "seq_len_hist": add("seq_len_hist"),
        "masked_count_hist": mh,
    }
    if any("sequences_per_row_hist" in s for s in stats):
        out["sequences_per_row_hist"] = (
            add("sequences_per_row_hist") if all("sequences_per_row_hist" in s for s in stats) else None
        )
        out["avg_seq_per_row"] = round(seqs / rows, 4) if rows else 0.0
    return out


def inspect_paths(paths: Sequence[str | Path]) -> dict[str, Any]:
    files = _collect(paths)
    per = [shard_stats(f) for f in files]
    return {"total": merge(per), "shards": per}


def _pct(hist: list[int], q: float) -> int:
    c = np.cumsum(hist)
    return int(np.searchsorted(c, q * c[-1])) if c.size and c[-1] else 0


def format_report(result: dict[str, Any]) -> str:
    t = result["total"]
    lines = [
        f"{t['shards']} shard(s), kind {'/'.join(t['kinds'])}: {t['rows']:,} rows, {t['sequences']:,} sequences, "
        f"{t['tokens']:,} tokens",
        f"sequence length: mean {t['mean_seq_len']}, p50 {_pct(t['seq_len_hist'], 0.5)}, "
        f"p90 {_pct(t['seq_len_hist'], 0.9)}, max {int(np.flatnonzero(t['seq_len_hist']).max(initial=0))}",
        f"padding fraction: {t['padding_fraction']:.3f}",
        f"NSP random-next fraction: {t['nsp_random_fraction'] if t['nsp_random_fraction'] is not None else 'n/a'}",
        f"masked predictions per row: mean {t['masked_per_row_mean']}, distribution "
        + ", ".join(f"{i}:{v}" for i, v in enumerate(t["masked_count_hist"]) if v),
        f"largest token id: {t['max_token_id']}",
    ]
    if "avg_seq_per_row" in t:
        lines.append(f"packed: {t['avg_seq_per_row']} sequences per row on average")
    lines.append("per shard:")
    for s in result["shards"]:
        lines.append(
            f"  {s['file']}: {s['kind']}, {s['rows']:,} rows x {s['seq_len']}, padding "
            f"{s['padding_fraction']:.3f}, NSP {s['nsp_random_fraction']}"
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
    axes[1].set(title="masked predictions per row", xlabel="predictions", ylabel="rows")
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
