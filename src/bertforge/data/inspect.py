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
from pathlib import Path
from typing import Any, Sequence

import h5py
import numpy as np

from bertforge.data import shards as shardio
from bertforge.data.instances import num_to_predict
from bertforge.errors import UserError

BLOCK = 65536


def _collect(paths: Sequence[str | Path]) -> list[Path]:
    files: list[Path] = []
    for p in paths:
        p = Path(p)
        if p.is_dir():
            found = shardio.list_shards(p)
            if not found:
                raise UserError(f"{p} holds no .hdf5/.h5 shards")
            files += found
        elif p.is_file():
            files.append(p)
        else:
            raise UserError(f"{p} does not exist")
    return files


def shard_stats(path: str | Path) -> dict[str, Any]:
    """Statistics of one shard (see the module docstring); histograms as lists indexed by value."""
    path = Path(path)
    kind = shardio.shard_kind(path)
    attrs = shardio.read_attrs(path)
    with h5py.File(path, "r") as f:
        for need in ("input_ids", "input_mask"):
            if need not in f:
                raise UserError(f"{path} has no {need} dataset; it is not a pre-training shard")
        n, seq = f["input_ids"].shape
        if "masked_lm_positions" in f:
            max_pred = int(f["masked_lm_positions"].shape[1])
        else:
            max_pred = int(attrs.get("max_pred", 0))
        len_hist = np.zeros(seq + 1, np.int64)
        mask_hist = np.zeros(max(max_pred, 1) + 1, np.int64)
        per_row_hist: np.ndarray | None = None
        tokens = sequences = nsp_random = nsp_count = 0
        max_id = -1
        for a in range(0, n, BLOCK):
            b = min(n, a + BLOCK)
            ids = f["input_ids"][a:b]
            im = f["input_mask"][a:b].astype(np.int64)  # (B, S)
            max_id = max(max_id, int(ids.max())) if ids.size else max_id
            if kind == "packed":
                k = int(im.max()) if im.size else 0
                counts = np.stack([(im == v).sum(1) for v in range(1, k + 1)], 1) if k else np.zeros((b - a, 0), int)
                lens = counts[counts > 0]  # one entry per sequence
                per_row = (counts > 0).sum(1)
                if per_row_hist is None or per_row_hist.size <= per_row.max(initial=0):
                    grown = np.zeros(int(per_row.max(initial=0)) + 1, np.int64)
                    if per_row_hist is not None:
                        grown[: per_row_hist.size] = per_row_hist
                    per_row_hist = grown
                per_row_hist += np.bincount(per_row, minlength=per_row_hist.size)
                if "next_sentence_weights" in f:
                    w = f["next_sentence_weights"][a:b] > 0
                    labels = f["next_sentence_labels"][a:b][w]
                else:
                    labels = np.zeros(0, np.int8)
            else:
                lens = (im != 0).sum(1)
                labels = f["next_sentence_labels"][a:b]
            len_hist += np.bincount(lens, minlength=seq + 1)[: seq + 1]
            tokens += int(lens.sum())
            sequences += int(lens.size)
            nsp_random += int((labels == 1).sum())
            nsp_count += int(labels.size)
            if "masked_lm_positions" in f:
                pos = f["masked_lm_positions"][a:b]
                # a real prediction has a nonzero position (position 0 is [CLS]); packed rows: count per row
                m = (pos != 0).sum(1)  # (B,) predictions per row (packed rows: of all their sequences)
                if m.size and m.max() >= mask_hist.size:
                    mask_hist = np.pad(mask_hist, (0, int(m.max()) + 1 - mask_hist.size))
                mask_hist += np.bincount(m, minlength=mask_hist.size)[: mask_hist.size]
            elif max_pred:
                # dynamic shards: the exact count the loader draws
                m = num_to_predict(lens, max_pred, float(attrs.get("masked_lm_prob", 0.15)))
                mask_hist += np.bincount(m, minlength=mask_hist.size)[: mask_hist.size]
    slots = n * seq
    stats: dict[str, Any] = {
        "file": str(path),
        "kind": kind,
        "rows": int(n),
        "seq_len": int(seq),
        "max_pred": max_pred,
        "sequences": sequences,
        "tokens": tokens,
        "padding_fraction": round(1 - tokens / slots, 6) if slots else 0.0,
        "mean_seq_len": round(tokens / sequences, 3) if sequences else 0.0,
        "nsp_random_fraction": round(nsp_random / nsp_count, 6) if nsp_count else None,
        "masked_per_row_mean": round(float((np.arange(mask_hist.size) * mask_hist).sum() / max(1, mask_hist.sum())), 3),
        "max_token_id": max_id,
        "seq_len_hist": len_hist.tolist(),
        "masked_count_hist": mask_hist.tolist(),
    }
    if per_row_hist is not None:
        stats["sequences_per_row_hist"] = per_row_hist.tolist()
        stats["avg_seq_per_row"] = round(sequences / n, 4) if n else 0.0
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
        out["sequences_per_row_hist"] = add("sequences_per_row_hist") if all(
            "sequences_per_row_hist" in s for s in stats) else None
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
        f"sequence length: mean {t['mean_seq_len']}, p50 {_pct(t['seq_len_hist'], .5)}, "
        f"p90 {_pct(t['seq_len_hist'], .9)}, max {int(np.flatnonzero(t['seq_len_hist']).max(initial=0))}",
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
        lines.append(f"  {s['file']}: {s['kind']}, {s['rows']:,} rows x {s['seq_len']}, padding "
                     f"{s['padding_fraction']:.3f}, NSP {s['nsp_random_fraction']}")
    return "\n".join(lines)


def plot(result: dict[str, Any], path: str | Path) -> Path:
    """Sequence-length and masked-count histograms as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = result["total"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    axes[0].bar(range(len(t["seq_len_hist"])), t["seq_len_hist"], width=1.0)
    axes[0].set(title=f"sequence length ({t['sequences']:,} sequences)", xlabel="tokens", ylabel="sequences")
    axes[1].bar(range(len(t["masked_count_hist"])), t["masked_count_hist"], width=0.8)
    axes[1].set(title="masked predictions per row", xlabel="predictions", ylabel="rows")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def run_inspect(paths: Sequence[str | Path], as_json: bool = False, plot_path: str | None = None) -> int:
    result = inspect_paths(paths)
    if plot_path:
        plot(result, plot_path)
    print(json.dumps(result) if as_json else format_report(result))
    return 0
