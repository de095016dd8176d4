"""The pre-training loop (DESIGN §3.4–3.5, §6): restore → for step → micro-batches → unscale/clip → step →
every N: log / eval / save.

    summary = run_pretrain(load_config("pretrain", "demo_tiny_128"), resume=True)

One update takes `accum = global_batch / (micro_batch × world)` micro-batches per rank; DDP all-reduces the
gradients once, on the last one (`no_sync` before). The gradient norm is taken over all parameters after the
all-reduce and the fp16 unscale; a non-finite norm skips the update (the schedule's step does not advance) and
is counted; `train.max_nonfinite_steps` of them in a row stop the run with a saved checkpoint and a message.

Phases: `train.init_checkpoint` starts phase 2 from a phase-1 checkpoint — weights and optimizer moments, the
step reset to 0, this config's schedule (NVIDIA run_pretraining.py `--phase2`). `--resume` continues from the
newest complete checkpoint in this run's output_dir, whichever phase it belongs to.
"""

from __future__ import annotations

import math
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from bertforge import device as dev
from bertforge.data.loader import PretrainLoader, eval_batches, read_manifest
from bertforge.errors import UserError
from bertforge.optim.lamb import build_optimizer
from bertforge.optim.schedule import lr_at
from bertforge.train import checkpoint as ckpt
from bertforge.runtime import distributed as ddp
from bertforge.train.config import PretrainConfig
from bertforge.runtime.metrics import MetricsLogger


@dataclass
class TrainState:
    """The counters a checkpoint restores (with the optimizer, scaler and RNG states)."""

    step: int = 0
    """Successful updates in this phase (the schedule's step)."""
    batches: int = 0
    """Updates attempted, skipped ones included: the data cursor (micro-batches taken per data lane)."""
    sequences: int = 0
    tokens: int = 0
    skipped: int = 0
    phase: int = 1
    phase_offset: int = 0
    """Updates of the earlier phases: the run-wide step is phase_offset + step."""
    train_seconds: float = 0.0
    """Wall time spent in this phase's loop, over all resumed runs."""


# --------------------------------------------------------------------------------------------- pieces
def resolve_vocab(cfg: PretrainConfig) -> tuple[int, Path | None]:
    """(vocab size, vocab file to ship with checkpoints) from data.vocab, the manifest, or model.vocab_size."""
    source = cfg.data.vocab
    manifest = read_manifest(cfg.data.input_dir) if Path(cfg.data.input_dir).is_dir() else {}
    if source is None:
        for key in ("vocab_file", "vocab"):
            if isinstance(manifest.get(key), str) and Path(manifest[key]).exists():
                source = manifest[key]
                break
    vocab_file = None
    size = cfg.model.vocab_size
    if source is not None:
        path = Path(source)
        if path.is_dir():
            path = next((path / n for n in ("vocab.txt", "tokenizer.json") if (path / n).is_file()), path / "vocab.txt")
        if not path.is_file():
            raise UserError(f"data.vocab {source}: no vocab.txt or tokenizer.json there; fix data.vocab")
        vocab_file = path
        if size is None:
            from bertforge.data.vocab import load_tokenizer

            size = load_tokenizer(path).get_vocab_size()
    if size is None:
        size = int(manifest.get("vocab_size", 30522))
    return size, vocab_file


def build_bert_config(cfg: PretrainConfig, vocab_size: int):
    from bertforge.model.config import BertConfig

    return BertConfig.from_preset(cfg.model.preset, vocab_size=vocab_size,
                                  max_position_embeddings=cfg.model.max_position_embeddings,
                                  hidden_dropout_prob=cfg.model.hidden_dropout,
                                  attention_probs_dropout_prob=cfg.model.attention_dropout)


def model_writer(model: torch.nn.Module, config, task: str, vocab_file: Path | None) -> Callable[[Path], None]:
    """A `write_model(dir)` for checkpoints: the HF-format model dir plus the vocab (so fill-mask works)."""
    from bertforge.model.hf_interop import save_pretrained

    def write(path: Path) -> None:
        save_pretrained(ddp.unwrap(model), config, path, task)
        if vocab_file is not None:
            shutil.copyfile(vocab_file, path / vocab_file.name)

    return write


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for g in optimizer.param_groups:
        g["lr"] = lr


def to_device(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


@torch.no_grad()
def evaluate(model: torch.nn.Module, directory: str, device: torch.device, precision: str, batch_size: int,
             max_batches: int, info: ddp.DistInfo, vocab_size: int, seed: int) -> dict[str, float]:
    """MLM and NSP accuracy (and loss) on held-out shards, summed over ranks."""
    was_training = model.training
    model.eval()
    sums = torch.zeros(6, dtype=torch.float64, device=device)  # loss·n, n, mlm ok, mlm n, nsp ok, nsp n
    for batch in eval_batches(directory, batch_size, info.rank, info.world_size, max_batches or None,
                              vocab_size=vocab_size, seed=seed):
        batch = to_device(batch, device)
        with dev.autocast(device, precision):
            out = model(**batch)
        sums += torch.stack([out.loss.double(), torch.ones((), dtype=torch.float64, device=device),
                             out.mlm_correct.double(), out.mlm_count.double(),
                             out.nsp_correct.double(), out.nsp_count.double()])
    ddp.all_reduce_sum(sums)
    model.train(was_training)
    s = sums.tolist()
    return {"eval_loss": s[0] / max(s[1], 1), "eval_mlm_acc": s[2] / max(s[3], 1), "eval_nsp_acc": s[4] / max(s[5], 1)}


# ---------------------------------------------------------------------------------------------- the run
def run_pretrain(cfg: PretrainConfig, resume: bool = False, json_summary: str | None = None,
                 _save_hook: Callable[[Path], None] | None = None) -> dict[str, Any]:
    """One pre-training phase; returns the summary (also written to train.output_dir/summary.json)."""
    t, o, d = cfg.train, cfg.optim, cfg.data
    info, device = ddp.init_distributed(t.device)
    precision = dev.resolve_precision(t.precision, device)
    out_dir = Path(t.output_dir)
    ckpt_root = out_dir / "checkpoints"
    vocab_size, vocab_file = resolve_vocab(cfg)
    bert_cfg = build_bert_config(cfg, vocab_size)

    # ---- model, optimizer, scaler (the same init on every rank; DDP checks it)
    torch.manual_seed(t.seed)
    if cfg.model.init_from:
        from bertforge.model.hf_interop import load_pretrained

        model, bert_cfg = load_pretrained(cfg.model.init_from, "pretraining", attention=cfg.train.attention,
                                          activation_checkpointing=cfg.train.activation_checkpointing)
    else:
        from bertforge.model import build_model

        model = build_model(bert_cfg, "pretraining", attention=cfg.train.attention,
                            activation_checkpointing=cfg.train.activation_checkpointing)
    model.to(device)
    optimizer = build_optimizer(model, o.name, o.lr, o.weight_decay, (o.beta1, o.beta2), o.eps, device.type)
    scaler = dev.grad_scaler(device, precision)
    torch.manual_seed(t.seed + info.rank)  # dropout differs per rank
    state = TrainState()

    # ---- restore: a checkpoint of this run (--resume), else phase 2's init checkpoint
    found = ckpt.latest_checkpoint(ckpt_root) if resume else None
    if found is not None:
        _load_weights(model, found.model_dir)
        saved = found.load_state()
        optimizer.load_state_dict(saved["optimizer"])
        scaler.load_state_dict(saved["scaler"])
        state = TrainState(**saved["train_state"])
        rng = saved["rng"][info.rank] if info.rank < len(saved["rng"]) else saved["rng"][0]
        dev.set_rng_state(device, rng)
        _log0(info, f"resumed from {found.path} (phase {state.phase}, step {state.step}, "
                    f"{state.sequences:,} sequences seen)")
    elif t.init_checkpoint:
        src = ckpt.find_checkpoint(t.init_checkpoint)
        _load_weights(model, src.model_dir)
        saved = src.load_state()
        optimizer.load_state_dict(saved["optimizer"])
        _reset_optimizer_step(optimizer)
        prev = TrainState(**saved["train_state"])
        state = TrainState(phase=prev.phase + 1, phase_offset=prev.phase_offset + prev.step)
        _log0(info, f"phase {state.phase} from {src.path}: weights and optimizer moments loaded, step reset")
    elif resume:
        _log0(info, f"--resume: no checkpoint in {ckpt_root}; starting from scratch")

    model_ddp = ddp.wrap_ddp(model, device, info)
    sync_owner = model_ddp  # no_sync lives on the DDP wrapper, not on the compiled module around it
    if cfg.train.compile:
        model_ddp = torch.compile(model_ddp)
    global_rows = rows_per_update(d.input_dir, t.global_batch_size, t.micro_batch_size, info.world_size)
    loader = PretrainLoader.from_dir(d.input_dir, global_rows, t.micro_batch_size, info.rank,
                                     info.world_size, t.seed, d.num_workers, d.prefetch, d.chunk_rows,
                                     vocab_size=vocab_size, pack_per_row=d.pack_per_row)
    accum = loader.accum
    batches = loader.iterate(start_batch=state.batches)
    logger = MetricsLogger(out_dir, info.is_main, t.max_steps, json_summary, tensorboard=t.tensorboard,
                           resume=found is not None)
    logger.params({"phase": state.phase, "world_size": info.world_size, "accumulation": accum,
                   "precision": precision, "device": str(device), "data_kind": loader.kind,
                   **{f"{k}.{kk}": vv for k, v in asdict(cfg).items() for kk, vv in v.items()}})
    _log0(info, f"pretrain phase {state.phase}: {cfg.model.preset} ({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M "
                f"params) on {info.world_size} x {device} in {precision}; global batch {t.global_batch_size} = "
                f"{t.micro_batch_size} x {info.world_size} ranks x {accum} accumulation; {loader.kind} shards")

    def save() -> ckpt.Checkpoint | None:
        state.train_seconds = seconds_before + time.perf_counter() - t_start
        rngs = _gather_rng(device)
        saved_ckpt = None
        if info.is_main:
            saved_ckpt = ckpt.save_checkpoint(
                ckpt_root, state.phase_offset + state.step, model_writer(model, bert_cfg, "pretraining", vocab_file),
                {"optimizer": optimizer.state_dict(), "scaler": scaler.state_dict(), "rng": rngs,
                 "train_state": asdict(state)},
                {"phase": state.phase, "phase_step": state.step, "sequences": state.sequences,
                 "tokens": state.tokens, "precision": precision, "world_size": info.world_size,
                 "config": asdict(cfg)},
                keep_last=t.keep_last, _before_rename=_save_hook)
        ddp.barrier()
        return saved_ckpt

    params = [p for p in model.parameters() if p.requires_grad]
    window = _Window(device)
    nonfinite_run = 0
    last_saved = state.step if found is not None else -1  # a resumed finished run does not re-save
    last_eval = -1
    eval_metrics: dict[str, float] = {}
    t_start = time.perf_counter()
    seconds_before = state.train_seconds
    model_ddp.train()

    # ---- the loop: one iteration = one attempted update
    stop_at = min(t.max_steps, t.stop_after_steps) if t.stop_after_steps > 0 else t.max_steps
    while state.step < stop_at:
        lr = lr_at(state.step + 1, o.lr, t.max_steps, o.warmup, o.schedule)
        set_lr(optimizer, lr)
        for micro in range(accum):
            t0 = time.perf_counter()
            batch = next(batches)
            window.data_wait += time.perf_counter() - t0
            batch = to_device(batch, device)
            with ddp.maybe_no_sync(sync_owner, micro < accum - 1), dev.autocast(device, precision):
                out = model_ddp(**batch)
                loss = out.loss / accum
            scaler.scale(loss).backward()
            window.add(out, batch)
        state.batches += 1
        scaler.unscale_(optimizer)
        max_norm = o.max_grad_norm if o.max_grad_norm > 0 else math.inf
        grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)
        if torch.isfinite(grad_norm).item():  # one host sync per update
            scaler.step(optimizer)
            state.step += 1
            nonfinite_run = 0
            window.grad_norm_sum += grad_norm.detach().double()
            window.updates += 1
        else:
            state.skipped += 1
            window.skipped += 1
            nonfinite_run += 1
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        if nonfinite_run >= t.max_nonfinite_steps:
            saved_ckpt = save()
            raise UserError(
                f"{nonfinite_run} non-finite gradient steps in a row at step {state.step} ({precision}"
                f"{f', loss scale {scaler.get_scale():g}' if scaler.is_enabled() else ''}); the last good state is "
                f"saved in {saved_ckpt.path if saved_ckpt else ckpt_root}. Lower optim.lr, use train.precision=bf16 "
                "or fp32, or check the data, then run again with --resume")
        if nonfinite_run:
            continue
        step = state.step
        t_pause = time.perf_counter()  # eval and checkpoint time stays out of the throughput window
        if step % t.log_every == 0 or step == t.max_steps:
            metrics = window.flush(info, t.global_batch_size, lr, state)
            metrics["mfu"] = _mfu(bert_cfg, loader, metrics["rows_per_s"], device, precision, info)
            logger.log(state.phase_offset + step, {**metrics, "step_in_phase": step})
        if d.eval_dir and (step % t.eval_every == 0 or step == t.max_steps):
            eval_metrics = evaluate(model_ddp, d.eval_dir, device, precision, t.micro_batch_size, d.eval_batches,
                                    info, vocab_size, t.seed)
            logger.log(state.phase_offset + step, eval_metrics)
            last_eval = step
        if step % t.save_every == 0 or step == t.max_steps:
            save()
            last_saved = step
        window.t0 += time.perf_counter() - t_pause

    if last_saved != state.step:
        save()
    if d.eval_dir and last_eval != state.step:
        eval_metrics = evaluate(model_ddp, d.eval_dir, device, precision, t.micro_batch_size, d.eval_batches, info,
                                vocab_size, t.seed)
    final = ckpt.latest_checkpoint(ckpt_root)
    summary = {
        "phase": state.phase, "step": state.step, "global_step": state.phase_offset + state.step,
        "sequences": state.sequences, "tokens": state.tokens, "skipped_steps": state.skipped,
        "train_time_s": seconds_before + time.perf_counter() - t_start, "precision": precision, "device": str(device),
        "world_size": info.world_size, "model_preset": cfg.model.preset,
        "final_loss": window.last.get("loss"), "final_mlm_acc": window.last.get("mlm_acc"),
        **{f"final_{k}": v for k, v in eval_metrics.items()},
        "checkpoint": str(final.path) if final else None,
        "model_dir": str(final.model_dir) if final else None,
    }
    logger.finish(summary, plot=t.plot)
    return summary


# ------------------------------------------------------------------------------------------- helpers
def rows_per_update(directory: str, global_batch: int, micro_batch: int, world_size: int) -> int:
    """Rows per update: the global batch in sequences, or for packed shards global / avg_seq_per_sample packs
    rounded to a multiple of micro x world (DESIGN §3.3: an update still sees about the same sequences)."""
    from bertforge.data.loader import inspect_shards, shard_files

    kind = inspect_shards(shard_files(directory)[:1])[0].kind
    avg = float(read_manifest(directory).get("avg_seq_per_sample", 1.0)) if kind == "packed" else 1.0
    if avg <= 1.0:
        return global_batch
    unit = micro_batch * world_size
    return max(unit, round(global_batch / avg / unit) * unit)



class _Window:
    """Metric sums between two log lines, kept on the device (no host sync per step)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.last: dict[str, float] = {}
        self.reset()

    def reset(self) -> None:
        # loss sum, micro-batches, mlm ok, mlm n, nsp ok, nsp n, sequences, tokens, rows
        self.sums = torch.zeros(9, dtype=torch.float64, device=self.device)
        self.grad_norm_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        self.updates = self.skipped = 0
        self.data_wait = 0.0
        self.t0 = time.perf_counter()

    @torch.no_grad()
    def add(self, out, batch: dict[str, torch.Tensor]) -> None:
        mask = batch["attention_mask"]
        nsp = batch["nsp_labels"]
        seqs = (nsp >= 0).sum() if nsp.dim() == 2 else torch.tensor(nsp.shape[0], device=mask.device)
        self.sums += torch.stack([
            out.loss.detach().double(), torch.ones((), dtype=torch.float64, device=self.device),
            out.mlm_correct.double(), out.mlm_count.double(), out.nsp_correct.double(), out.nsp_count.double(),
            seqs.double(), (mask != 0).sum().double(), torch.tensor(float(mask.shape[0]), device=self.device,
                                                                     dtype=torch.float64)])

    def flush(self, info: ddp.DistInfo, global_batch: int, lr: float, state: TrainState) -> dict[str, float]:
        dev.synchronize(self.device)
        elapsed = time.perf_counter() - self.t0
        packed = torch.cat([self.sums, self.grad_norm_sum.view(1),
                            torch.tensor([self.data_wait], dtype=torch.float64, device=self.device)])
        ddp.all_reduce_sum(packed)
        s = packed.tolist()
        state.sequences += int(s[6])
        state.tokens += int(s[7])
        metrics = {
            "loss": s[0] / max(s[1], 1), "mlm_acc": s[2] / max(s[3], 1), "nsp_acc": s[4] / max(s[5], 1),
            "lr": lr, "grad_norm": s[9] / info.world_size / max(self.updates, 1),
            "seq_per_s": s[6] / elapsed, "tokens_per_s": s[7] / elapsed, "rows_per_s": s[8] / elapsed,
            "data_wait": s[10] / info.world_size / elapsed, "skipped": state.skipped,
            "sequences": state.sequences,
        }
        self.last = metrics
        self.reset()
        return metrics


def _mfu(bert_cfg, loader: PretrainLoader, rows_per_s: float, device: torch.device, precision: str,
         info: ddp.DistInfo) -> float | None:
    """Model FLOPs utilisation: training FLOPs per row (3 x forward) x rows/s over the measured matmul peak."""
    try:
        from bertforge.model.flops import flops_per_sequence
    except ImportError:
        return None
    seq_len = _seq_len(loader)
    flops = flops_per_sequence(bert_cfg, seq_len, loader.spec.max_pred, task="pretraining", training=True)
    return flops * rows_per_s / (dev.peak_flops(device, precision) * info.world_size)


def _seq_len(loader: PretrainLoader) -> int:
    import h5py

    with h5py.File(loader.spec.files[0], "r") as h:
        return int(h["input_ids"].shape[1])


def _load_weights(model: torch.nn.Module, model_dir: Path) -> None:
    from bertforge.model.hf_interop import load_hf_state_dict, normalise_keys, read_state_dict, _weights_file

    sd = normalise_keys(read_state_dict(_weights_file(Path(model_dir))), model.config.model_type)
    load_hf_state_dict(model, sd, source=str(model_dir))


def _reset_optimizer_step(optimizer: torch.optim.Optimizer) -> None:
    """Phase 2 keeps the moments but restarts the step (bias correction and schedule), as NVIDIA's --phase2."""
    for g in optimizer.param_groups:
        if "step" in g:
            g["step"] = 0
    for st in optimizer.state.values():
        if "step" in st:
            st["step"] = torch.zeros_like(st["step"]) if torch.is_tensor(st["step"]) else 0


def _gather_rng(device: torch.device) -> list[dict[str, Any]]:
    """Every rank's RNG state (dropout differs per rank), gathered for rank 0's checkpoint."""
    mine = dev.rng_state(device)
    if not torch.distributed.is_initialized():
        return [mine]
    out: list[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(out, {k: v.cpu() for k, v in mine.items()})
    return out


def _log0(info: ddp.DistInfo, msg: str) -> None:
    if info.is_main:
        print(msg, flush=True)
