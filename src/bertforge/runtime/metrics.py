"""Metrics: few, decision-grade numbers from rank 0 — console, metrics.jsonl, dllogger JSON, TensorBoard, a PNG.

    log = MetricsLogger(out_dir, is_main=True, total_steps=1000, json_summary="dllogger.json")
    log.log(step, {"loss": 6.41, "mlm_acc": 0.18, "lr": 2.1e-3, "seq_per_s": 1900.0, "mfu": 0.41})
    log.finish(summary)     # summary.json + loss/accuracy PNG

The console line reads `step 120/1000 (12%) | loss 6.41 | mlm_acc 0.180 | lr 2.1e-03 | 1.9k seq/s | MFU 41% |
eta 3m12s`. `metrics.jsonl` holds one JSON object per logged step (at least step, loss, mlm_acc, lr, seq_per_s;
DESIGN §2a). `--json-summary` writes NVIDIA dllogger's JSON-stream format (`DLLL {...}` lines with
timestamp, elapsedtime, type LOG/PARAMETER, step and data) so tools that parse DeepLearningExamples logs
read ours. Nothing here is specific to pre-training: fine-tuning logs its own keys through the same class.
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from bertforge.runtime.io import atomic_path, raise_if_disk_full, writable_file, write_text
from bertforge.runtime.progress import format_duration

# console formatting per key: (label, format function); unknown keys print as `key value`
_FMT = {
    "loss": ("loss", lambda v: f"{v:.4f}"),
    "mlm_acc": ("mlm_acc", lambda v: f"{v:.3f}"),
    "nsp_acc": ("nsp_acc", lambda v: f"{v:.3f}"),
    "lr": ("lr", lambda v: f"{v:.2e}"),
    "grad_norm": ("gnorm", lambda v: f"{v:.2f}"),
    "seq_per_s": ("seq/s", lambda v: _si(v)),
    "mfu": ("MFU", lambda v: f"{100 * v:.1f}%"),
    "data_wait": ("data wait", lambda v: f"{100 * v:.0f}%"),
    "skipped": ("skipped", lambda v: f"{int(v)}"),
    "eval_mlm_acc": ("eval mlm_acc", lambda v: f"{v:.3f}"),
    "eval_nsp_acc": ("eval nsp_acc", lambda v: f"{v:.3f}"),
    "eval_loss": ("eval loss", lambda v: f"{v:.4f}"),
}
CONSOLE_KEYS = (
    "loss",
    "mlm_acc",
    "nsp_acc",
    "lr",
    "grad_norm",
    "seq_per_s",
    "mfu",
    "data_wait",
    "skipped",
    "eval_loss",
    "eval_mlm_acc",
    "eval_nsp_acc",
)


def _si(v: float) -> str:
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= div:
            return f"{v / div:.1f}{suffix}"
    return f"{v:.1f}"


def format_line(step: int, metrics: dict[str, Any], total_steps: int | None = None, eta_s: float | None = None) -> str:
    head = f"step {step}" + (f"/{total_steps} ({100 * step / total_steps:.0f}%)" if total_steps else "")
    parts = [head]
    for key in CONSOLE_KEYS:
        if key in metrics and metrics[key] is not None:
            label, fmt = _FMT[key]
            v = metrics[key]  # a non-finite number arrives as its string ("nan", see _clean): shown as it is
            parts.append(f"{label} {fmt(v) if isinstance(v, (int, float)) else v}")
    if eta_s is not None:
        parts.append(f"eta {format_duration(eta_s)}")
    return " | ".join(parts)


def _clean(v: Any) -> Any:
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)  # JSON has no NaN/inf
    return v


def _append(fh, line: str) -> None:
    """One record, flushed; a full disk is one line naming the file (the rows before it stay readable)."""
    try:
        fh.write(line)
        fh.flush()
    except OSError as e:
        raise_if_disk_full(e, fh.name)
        raise


class TextSink(Protocol):
    """What the console line needs of a stream (`print(..., file=stream, flush=True)`): a text file such as
    sys.stdout, or a forwarder to a log function."""

    def write(self, text: str, /) -> object: ...

    def flush(self) -> object: ...


class MetricsLogger:
    """Writes one record per logged step to every sink; does nothing on ranks other than 0."""

    def __init__(
        self,
        output_dir: str | Path,
        is_main: bool = True,
        total_steps: int | None = None,
        json_summary: str | Path | None = None,
        tensorboard: bool = True,
        stream: TextSink | None = None,
        resume: bool = False,
    ):
        self.dir = Path(output_dir)
        self.is_main = is_main
        self.total_steps = total_steps
        self.stream: TextSink = stream or sys.stdout
        self.t0 = time.perf_counter()
        self._first: tuple[int, float] | None = None
        self._tb = None
        self._jsonl = self._dll = None
        if not is_main:
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        # a resumed run appends; a fresh one starts the files over
        mode = "a" if resume else "w"
        last = _last_step(self.dir / "metrics.jsonl") if resume else None
        self._jsonl = open(self.dir / "metrics.jsonl", mode, encoding="utf-8")
        if json_summary:
            self._dll = open(writable_file(json_summary, "--json-summary"), mode, encoding="utf-8")
        if tensorboard:
            with contextlib.suppress(ImportError):
                from torch.utils.tensorboard import SummaryWriter

                # TensorBoard reads every event file in the directory: the earlier run's events past the rows
                # metrics.jsonl keeps (all of them for a fresh run) are hidden, not drawn twice over the new ones
                purge = 0 if last is None else last + 1
                self._tb = SummaryWriter(log_dir=str(self.dir / "tensorboard"), purge_step=purge)

    def _dllogger(self, step: Any, data: dict[str, Any], kind: str = "LOG") -> None:
        if self._dll is None:
            return
        rec = {
            "timestamp": time.time(),
            "datetime": time.strftime("%Y-%m-%d %H:%M:%S"),
            "elapsedtime": time.perf_counter() - self.t0,
            "type": kind,
            "step": step,
            "data": data,
        }
        _append(self._dll, "DLLL " + json.dumps(rec) + "\n")

    def params(self, params: dict[str, Any]) -> None:
        """The run's configuration, once (dllogger PARAMETER record)."""
        if self.is_main:
            self._dllogger("PARAMETER", {k: _clean(v) for k, v in params.items()}, kind="PARAMETER")

    def print(self, msg: str) -> None:
        if self.is_main:
            print(msg, file=self.stream, flush=True)

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        if not self.is_main:
            return
        if self._jsonl is None:
            raise RuntimeError("MetricsLogger.log() after close()")
        metrics = {k: _clean(v) for k, v in metrics.items() if v is not None}
        now = time.perf_counter()
        if self._first is None:
            self._first = (step, now)
        eta = None
        done, t_first = self._first
        if self.total_steps and step > done:
            eta = (now - t_first) / (step - done) * (self.total_steps - step)
        self.print(format_line(step, metrics, self.total_steps, eta))
        rec = {"step": step, **metrics, "elapsed_s": round(now - self.t0, 3)}
        _append(self._jsonl, json.dumps(rec) + "\n")
        self._dllogger(step, metrics)
        if self._tb is not None:
            for k, v in metrics.items():
                if isinstance(v, (int, float)):
                    self._tb.add_scalar(k, v, step)

    def finish(self, summary: dict[str, Any], plot: bool = True) -> None:
        """summary.json (atomic), the dllogger final record, the loss/accuracy PNG; closes the files."""
        if not self.is_main:
            return
        summary = {k: _clean(v) for k, v in summary.items()}
        write_text(self.dir / "summary.json", json.dumps(summary, indent=1, default=str))
        self._dllogger((), summary)
        self.close()
        if plot:
            plot_metrics(self.dir / "metrics.jsonl", self.dir / "metrics.png")

    def close(self) -> None:
        for f in (self._jsonl, self._dll):
            if f is not None:
                f.close()
        self._jsonl = self._dll = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None


def _last_step(path: Path) -> int | None:
    """The step of the last readable row of a metrics.jsonl (a torn last line is skipped), None without one."""
    with contextlib.suppress(OSError, ValueError):  # unreadable or not UTF-8: no row to go on from
        for line in reversed(path.read_text(encoding="utf-8").splitlines()):
            with contextlib.suppress(ValueError, AttributeError):
                step = json.loads(line).get("step")
                if isinstance(step, int):
                    return step
    return None


def plot_points(ax: Any, pts: list[tuple[Any, Any]], label: str | None = None, marker: str | None = None) -> None:
    """(step, value) points as a line on `ax`; a lone point is a line of no length, so it gets a marker (a run of
    one logged step would show nothing)."""
    if pts:
        ax.plot(*zip(*pts), label=label, marker=marker or ("." if len(pts) == 1 else None))


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    path = Path(path)
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def plot_metrics(jsonl: str | Path, png: str | Path) -> Path | None:
    """Loss and accuracies against the step, from metrics.jsonl, written atomically as a PNG."""
    rows = read_jsonl(jsonl)
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 4))
    for key, ax in (
        ("loss", ax_loss),
        ("eval_loss", ax_loss),
        ("mlm_acc", ax_acc),
        ("nsp_acc", ax_acc),
        ("eval_mlm_acc", ax_acc),
        ("eval_nsp_acc", ax_acc),
    ):
        pts = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
        plot_points(ax, pts, key, "." if key.startswith("eval") else None)
    ax_loss.set_xlabel("step")
    ax_loss.set_title("loss")
    ax_acc.set_xlabel("step")
    ax_acc.set_title("accuracy")
    for ax in (ax_loss, ax_acc):
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    fig.tight_layout()
    return save_figure(fig, png)


def save_figure(fig, png: str | Path) -> Path:
    """Write a matplotlib figure as a PNG, atomically, and close it."""
    import matplotlib.pyplot as plt

    with atomic_path(png) as tmp:
        fig.savefig(tmp, dpi=100, format="png")
    plt.close(fig)
    return Path(png)


def plot_lines(
    series: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    png: str | Path,
    xlabel: str,
    ylabel: str,
    marker: str | None = None,
    hline: tuple[float, str] | None = None,
) -> Path:
    """One chart of named (x, y) series, with an optional labelled horizontal line, as a PNG (atomic)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, (xs, ys) in series.items():
        ax.plot(xs, ys, marker=marker, label=name)
    if hline is not None:
        ax.axhline(hline[0], color="grey", linestyle="--", label=hline[1])
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return save_figure(fig, png)
