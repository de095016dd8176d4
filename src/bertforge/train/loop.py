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

An output_dir that holds an earlier run (checkpoints or metrics) is refused unless `resume` (continue it) or
`overwrite` (delete it and start afresh): a fresh run would truncate its metrics and report its model. On a
resume, metrics.jsonl rows after the checkpoint's step are dropped — those steps run again, and the rows of the
re-run are the record of the weights that exist. SIGTERM/SIGINT stop the run at the next step boundary with a
checkpoint saved (`runtime.preempt`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from bertforge import device as dev
from bertforge.config import compile_keys, compile_mode, compile_notice, resolve_auto, save_config, step_kind
from bertforge.data import synthetic
from bertforge.data.loader import PretrainLoader, eval_batches, masking_overrides, with_segments
from bertforge.data.shardset import ShardSet
from bertforge.errors import UserError, first_line
from bertforge.optim.lamb import optimizer_for
from bertforge.optim.schedule import lr_at
from bertforge.runtime import distributed as ddp
from bertforge.runtime import fp8
from bertforge.runtime.choices import apply_model_choices
from bertforge.runtime.io import delete_outputs, write_text
from bertforge.runtime.metrics import MetricsLogger, read_jsonl
from bertforge.runtime.preempt import Preempted, Preemption
from bertforge.runtime.profile import PROFILE_WARMUP, PowerSampler, StepProfiler, StepTimeline, format_parts
from bertforge.runtime.step import TrainStep, set_lr, to_device, train_step, wants_segments
from bertforge.train import checkpoint as ckpt
from bertforge.train.config import PretrainConfig, PretrainTrainConfig

if TYPE_CHECKING:
    from bertforge.model.bert import BertForTask


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
    fp8_fallen_back: bool = False
    """train.fp8 went back to bf16 after non-finite steps: for the rest of the run, resumed runs included."""

    @classmethod
    def of(cls, saved: Any, path: Path) -> TrainState:
        """The counters a checkpoint's training state holds; one line, not a TypeError, for a state this version
        cannot read (a newer bertforge's counters, or not a mapping)."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(saved) - known) if isinstance(saved, dict) else ["(not a mapping)"]
        if unknown:
            raise UserError(
                f"{path}: its training state holds {', '.join(map(str, unknown))}, which this version of bertforge "
                "does not know: resume it with the version that wrote it"
            )
        return cls(**saved)


# --------------------------------------------------------------------------------------------- pieces
def resolve_vocab(cfg: PretrainConfig, shards: ShardSet | None) -> tuple[int, int, Path | None]:
    """(the data's vocab rows, the model's vocab size, vocab file to ship with checkpoints) from data.vocab, the
    shards' manifest, or model.vocab_size (synthetic data: data.synthetic_vocab_size). The data's rows bound the
    loader's random MLM words: a model.vocab_size set above them (NVIDIA's 30528, ModernBERT's 50368) adds rows
    that are no token, which Google's masking never draws. Where nothing records them, the model's size serves."""
    source = cfg.data.vocab
    if source is None and shards is not None and shards.vocab_file is not None:
        source = str(shards.vocab_file)
    vocab_file = None
    rows = None if shards is None else shards.vocab_size
    if source is not None:
        path = Path(source)
        if path.is_dir():
            path = next((path / n for n in ("vocab.txt", "tokenizer.json") if (path / n).is_file()), path / "vocab.txt")
        if not path.is_file():
            raise UserError(f"data.vocab {source}: no vocab.txt or tokenizer.json there; fix data.vocab")
        if cfg.data.vocab is not None and shards is not None:
            shards.check_vocab(path)
        vocab_file = path
        from bertforge.data.vocab import load_tokenizer, vocab_rows

        rows = vocab_rows(load_tokenizer(path))
    size = cfg.model.vocab_size or rows
    if size is None:
        size = cfg.data.synthetic_vocab_size if shards is None else 30522
    if rows is not None and size < rows:
        where = vocab_file or "the shards' manifest"
        raise UserError(
            f"model.vocab_size {size} is smaller than the vocab of the data ({rows} rows, {where}): its token ids "
            f"would fall outside the embedding; set model.vocab_size to at least {rows}, or leave it unset"
        )
    return rows or size, size, vocab_file


def open_data(cfg: PretrainConfig, info: ddp.DistInfo) -> ShardSet | None:
    """The training shards, read once (None for the synthetic source), and the eval shards checked against
    them now — a missing or mismatched eval directory, shards of the other objective or masking settings the
    shards cannot take fail at start-up, not at the first step or evaluation."""
    d = cfg.data
    shards = None if d.synthetic else ShardSet.open(d.input_dir, "data.input_dir")
    held_out = ShardSet.open(d.eval_dir, "data.eval_dir") if d.eval_dir else None
    train_masking = {"mlm_probability": d.mlm_probability, "mask_split": d.mask_split}
    for s, masking in ((shards, train_masking), (held_out, d.eval_masking)):
        if s is not None:
            s.check_datasets()
            s.check_objective(cfg.train.objective)
            masking_overrides(s, **masking)
    if shards is not None and held_out is not None:
        shards.check_compatible(held_out)
    if held_out is not None and held_out.rows == 0:  # would score 0 loss and 0 accuracy, as if measured
        raise UserError(
            f"data.eval_dir {d.eval_dir} holds no rows (the corpus was too small to hold any out); build it from "
            "more text, or set data.eval_dir=null"
        )
    if shards is not None and shards.rows == 0:
        raise UserError(
            f"data.input_dir {d.input_dir} holds no rows (the documents are too few or too short for its "
            f"seq_len {shards.seq_len}); build it from more text"
        )
    return shards


def build_loader(cfg: PretrainConfig, shards: ShardSet | None, info: ddp.DistInfo, vocab_size: int):
    t, d = cfg.train, cfg.data
    if shards is None:
        return synthetic.loader_for(d, t.global_batch_size, t.micro_batch_size, info.rank, info.world_size, t.seed)
    rows = shards.rows_per_update(t.global_batch_size, t.micro_batch_size, info.world_size)
    return PretrainLoader.from_dir(
        shards,
        rows,
        t.micro_batch_size,
        info.rank,
        info.world_size,
        t.seed,
        d.num_workers,
        d.prefetch,
        d.chunk_rows,
        vocab_size=vocab_size,
        pack_per_row=d.pack_per_row,
        mlm_probability=d.mlm_probability,
        mask_split=d.mask_split,
    )


def check_fits(
    loader, shards: ShardSet | None, bert_cfg, eval_dir: str | None = None, init_from: str | None = None
) -> None:
    """Sequence length and token ids against the model, before the first step (a device-side assert later); a
    sample of the eval shards' rows too (their seq_len and vocab were checked against the training shards').
    With `init_from`, the checkpoint's config.json decides the model: a too-long row is named against it (the
    model.* keys that would raise the limit are not used)."""
    seq_len = shards.seq_len if shards is not None else loader.seq_len
    positions = bert_cfg.usable_positions  # RoBERTa's start after its padding index
    if init_from and seq_len > positions:
        raise UserError(
            f"the data's rows have {seq_len} tokens but model.init_from {init_from} has {positions} positions: "
            "build shorter rows, or start from a checkpoint with more positions"
        )
    if shards is not None:
        shards.check_model(bert_cfg.vocab_size, positions)
    elif loader.vocab_size > bert_cfg.vocab_size:
        raise UserError(
            f"data.synthetic_vocab_size {loader.vocab_size} is larger than the model's vocab of "
            f"{bert_cfg.vocab_size} (data.vocab / model.vocab_size): its token ids would fall outside the "
            f"embedding; set data.synthetic_vocab_size={bert_cfg.vocab_size}"
        )
    elif loader.seq_len > positions:
        raise UserError(
            f"data.synthetic_seq_len {loader.seq_len} is longer than the model's {positions} positions "
            "(model.max_position_embeddings); lower one or raise the other"
        )
    if eval_dir:  # seq_len too: a synthetic run has no training shards that the eval shards were compared with
        ShardSet.open(eval_dir).check_model(bert_cfg.vocab_size, positions)


def model_rows(cfg: PretrainConfig, vocab_size: int, resumed: ckpt.Checkpoint | None) -> int:
    """The model's vocab rows: the data's `vocab_size` rounded up to model.pad_vocab_multiple (NVIDIA's
    run_pretraining pads 30522 to 30528), or the rows of the checkpoint the run starts from (--resume's, else
    train.init_checkpoint's), so that a run written with other padding, or none, goes on as it was."""
    t = cfg.train
    start = resumed or (init_checkpoint(t.init_checkpoint) if t.init_checkpoint else None)
    saved = _saved_config(start.model_dir) if start is not None else None
    if saved is not None and saved.vocab_size >= vocab_size:
        return saved.vocab_size
    m = cfg.model.pad_vocab_multiple
    return -(-vocab_size // m) * m


def build_bert_config(cfg: PretrainConfig, vocab_size: int):
    from bertforge.model.config import BertConfig

    theta = cfg.model.global_rope_theta  # ModernBERT only (validated, or at init_from's load): None keeps the preset's
    return BertConfig.from_preset(
        cfg.model.preset,
        vocab_size=vocab_size,
        max_position_embeddings=cfg.model.max_position_embeddings,
        hidden_dropout_prob=cfg.model.hidden_dropout,
        attention_probs_dropout_prob=cfg.model.attention_dropout,
        **({} if theta is None else {"global_rope_theta": theta}),
    )


def model_writer(model: torch.nn.Module, config, task: str, vocab_file: Path | None) -> Callable[[Path], None]:
    """A `write_model(dir)` for checkpoints: the HF-format model dir plus its tokenizer files (so transformers'
    AutoTokenizer and fill-mask, and our serving, tokenize as the model was trained)."""
    from bertforge.data.vocab import save_hf_tokenizer
    from bertforge.model.hf_interop import save_pretrained

    def write(path: Path) -> None:
        save_pretrained(ddp.unwrap(model), config, path, task)
        if vocab_file is not None:
            save_hf_tokenizer(vocab_file, path, config.max_position_embeddings)

    return write


@torch.no_grad()
def evaluate(
    model: torch.nn.Module,
    directory: str,
    device: torch.device,
    precision: str,
    batch_size: int,
    max_batches: int,
    info: ddp.DistInfo,
    vocab_size: int,
    seed: int,
    masking: dict[str, Any] | None = None,
    segments: bool = False,
) -> dict[str, float]:
    """MLM and NSP accuracy (and loss) on held-out shards, summed over ranks; no NSP accuracy for an MLM-only
    model. `masking`: eval_batches' mlm_probability and mask_split (`PretrainDataConfig.eval_masking`).
    `segments`: batches carry their sequence bounds, as the run's training batches do (`with_segments`), so a
    compiled model evaluates in the layout it was compiled for."""
    was_training = model.training
    model.eval()
    sums = torch.zeros(6, dtype=torch.float64, device=device)  # mlm loss·n, nsp loss·n, mlm ok, mlm n, nsp ok, nsp n
    for batch in eval_batches(
        directory,
        batch_size,
        info.rank,
        info.world_size,
        max_batches or None,
        vocab_size=vocab_size,
        seed=seed,
        **(masking or {}),
    ):
        batch = to_device(with_segments(batch) if segments else batch, device)
        with dev.autocast(device, precision):
            out = model(**batch)
        scores = _scores(out, device)  # the losses weighted by their slots: a short last batch weighs its share
        mlm_n, nsp_n = scores[1], scores[3]
        nsp_loss = out.nsp_loss.double() * nsp_n if out.nsp_loss is not None else torch.zeros_like(nsp_n)
        sums += torch.stack([out.mlm_loss.double() * mlm_n, nsp_loss, *scores])
    ddp.all_reduce_sum(sums)
    model.train(was_training)
    s = sums.tolist()
    # the loss of the whole held-out set, as training's: MLM mean over its masked tokens + NSP mean over its pairs
    metrics = {"eval_loss": s[0] / max(s[3], 1) + s[1] / max(s[5], 1), "eval_mlm_acc": s[2] / max(s[3], 1)}
    if s[5]:
        metrics["eval_nsp_acc"] = s[4] / s[5]
    return metrics


def _scores(out, device: torch.device) -> list[torch.Tensor]:
    """[mlm correct, mlm count, nsp correct, nsp count] of a model output as float64; NSP 0 when the model has
    no NSP head (train.objective mlm)."""
    zero = torch.zeros((), dtype=torch.float64, device=device)
    vals = (out.mlm_correct, out.mlm_count, out.nsp_correct, out.nsp_count)
    return [zero if v is None else v.double() for v in vals]


# ---------------------------------------------------------------------------------------------- set-up
# what a run writes into output_dir and `overwrite` deletes (config.yaml is rewritten by every run)
RUN_OUTPUTS = ("checkpoints", "metrics.jsonl", "summary.json", "metrics.png", "tensorboard", "profile")
_RUN_DIRS = ("checkpoints", "tensorboard", "profile")  # the rest of RUN_OUTPUTS, and config.yaml, are files


def holds_run(out: Path) -> bool:
    """Whether `out` holds a run that got anywhere: a checkpoint or a logged step."""
    metrics = out / "metrics.jsonl"
    return ckpt.latest_checkpoint(out / "checkpoints") is not None or (metrics.is_file() and metrics.stat().st_size > 0)


@contextlib.contextmanager
def unstarted_removed(output_dir: str | Path, is_main: bool = True) -> Iterator[None]:
    """Around a run (pre-training or fine-tuning) in `output_dir`: if the run fails before its first logged step
    in an output_dir it created, remove the directory (config.yaml and empty logs), so a failed start leaves
    nothing behind and the re-run is not refused. A stop on a signal (`Preempted`) keeps what it saved; only
    rank 0 removes, and with the directory the parents the run created for it, when they are left empty."""
    out = Path(output_dir)
    created = [p for p in (out, *out.parents) if not p.exists()] if is_main else []
    try:
        yield
    except Preempted:
        raise
    except BaseException:
        if created and out.is_dir() and not holds_run(out):
            shutil.rmtree(out, ignore_errors=True)
            for p in created[1:]:  # deepest first
                with contextlib.suppress(OSError):
                    p.rmdir()  # only when empty
        raise


def check_output_dir(
    output_dir: str | Path, resume: bool, overwrite: bool, inputs: dict[str, str | None] | None = None
) -> None:
    """Refuse an output_dir holding an earlier run unless `resume` or `overwrite` (carried out by
    `claim_output_dir` once every input has passed its checks), and an input the run starts from (`inputs`:
    setting -> path, `start_inputs`) that `overwrite` would delete before this run has saved anything of its own."""
    out = Path(output_dir)
    if resume and overwrite:
        raise UserError("--resume continues the run in train.output_dir, --overwrite deletes it: pass one of them")
    deleted = [out.resolve()] + [(out / n).resolve() for n in RUN_OUTPUTS]  # the run dir: its latest checkpoint
    for key, given in (inputs or {}).items():
        init = Path(given).resolve() if given else None
        inside = init is not None and (init == deleted[0] or any(init.is_relative_to(d) for d in deleted[1:]))
        if overwrite and inside and holds_run(out):
            raise UserError(
                f"{key} {given} is in train.output_dir {out}, which --overwrite deletes: give this run another "
                "train.output_dir"
            )
    for name in (*RUN_OUTPUTS, "config.yaml"):  # not a traceback at the first save, after the training
        path, is_dir = out / name, name in _RUN_DIRS
        if path.is_symlink() and not path.exists():
            raise UserError(
                f"{path} is a link to {path.readlink()}, which does not exist (storage not mounted here?); mount "
                "it, remove the link, or choose another train.output_dir"
            )
        if path.exists() and path.is_dir() != is_dir:
            raise UserError(
                f"{path} is a {'file' if is_dir else 'directory'}, where the run writes its "
                f"{'directory' if is_dir else 'file'} {name}; move it away or choose another train.output_dir"
            )
    if holds_run(out) and not (resume or overwrite):
        raise UserError(
            f"train.output_dir {out} holds an earlier run (checkpoints or metrics.jsonl); pass --resume to "
            "continue it, --overwrite to delete it and start afresh, or choose another train.output_dir"
        )


def start_inputs(cfg: PretrainConfig) -> dict[str, str | None]:
    """The weights a run starts from, by setting: what --overwrite must not delete."""
    return {"train.init_checkpoint": cfg.train.init_checkpoint, "model.init_from": cfg.model.init_from}


def claim_output_dir(
    cfg: PretrainConfig, overwrite: bool, resumed_step: int | None, json_summary: str | None = None
) -> None:
    """Rank 0, once the data, vocab, model and checkpoint have passed their checks: delete an earlier run
    (`overwrite`: nothing of it is mistaken for this run's), drop metrics.jsonl (and --json-summary) rows past
    the resumed checkpoint's step, write config.yaml. Nothing in output_dir changes before this, so a refused
    start leaves an earlier run as it was."""
    out = Path(cfg.train.output_dir)
    if overwrite and holds_run(out):
        delete_outputs([out / n for n in RUN_OUTPUTS if (out / n).exists()], out, say=lambda m: print(m, flush=True))
    logs = [(out / "metrics.jsonl", _row_step), *([(Path(json_summary), _dll_step)] if json_summary else [])]
    for path, step_of in logs:
        if resumed_step is not None and (n := trim_metrics(path, resumed_step, step_of)):
            print(f"{path.name}: dropped {n} rows after the checkpoint's step; those steps run again", flush=True)
    out.mkdir(parents=True, exist_ok=True)  # the CLI has made it; a caller of run_pretrain may not have
    save_config(cfg, out / "config.yaml")


def trim_metrics(path: Path, global_step: int, step_of: Callable[[str], int | None] | None = None) -> int:
    """Drop metrics.jsonl rows after `global_step` (and a torn last line), atomically; returns rows dropped.
    `step_of`: a line's step (None: drop it), for another format than metrics.jsonl's."""
    if not path.is_file():
        return 0
    lines = path.read_text(encoding="utf-8").splitlines()
    steps = [(step_of or _row_step)(line) for line in lines]  # None: a torn or foreign line
    kept = [line for line, step in zip(lines, steps) if step is not None and step <= global_step]
    if len(kept) != len(lines):
        write_text(path, "".join(line + "\n" for line in kept))
    return len(lines) - len(kept)


def _dll_step(line: str) -> int | None:
    """A dllogger line's step; -1 (kept) for records of no step (PARAMETER, the summary); None when torn."""
    try:
        step = json.loads(line.removeprefix("DLLL ")).get("step") if line.startswith("DLLL ") else None
    except (json.JSONDecodeError, AttributeError):
        return None
    return step if isinstance(step, int) else -1


def _row_step(line: str) -> int | None:
    try:
        step = json.loads(line).get("step")
    except (json.JSONDecodeError, AttributeError):
        return None
    return step if isinstance(step, int) else None


@dataclass
class Run:
    """Everything one pre-training phase holds, built by `setup` (torchtitan's split: set-up, `train`, eval, save)."""

    cfg: PretrainConfig
    info: ddp.DistInfo
    device: torch.device
    precision: str
    model: torch.nn.Module
    """The bare model (what checkpoints save)."""
    bert_cfg: Any
    vocab_size: int
    """The data's vocab rows: the bound of dynamic masking's random words (the model may have more rows)."""
    vocab_file: Path | None
    step: TrainStep
    loader: Any
    logger: MetricsLogger
    state: TrainState
    resumed: bool
    ckpt_root: Path
    seconds_before: float = 0.0
    t_start: float = 0.0
    t_created: float = field(default_factory=time.perf_counter)
    """When set-up began: the first step's end minus this is the time to the first step (compile included)."""
    first_step_s: float | None = None
    fp8_guard: fp8.Fp8Guard | None = None
    power: PowerSampler | None = None
    """NVML power, clocks and temperature on NVIDIA GPUs (a no-op elsewhere)."""
    save_hook: Callable[[Path], None] | None = None

    @property
    def train_seconds(self) -> float:
        return self.seconds_before + time.perf_counter() - self.t_start


_SHAPE = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "max_position_embeddings")


def _shape_diff(a, b) -> list[str]:
    """The _SHAPE fields in which two BertConfigs differ."""
    return [k for k in _SHAPE if getattr(a, k) != getattr(b, k)]


def model_name(cfg: PretrainConfig, bert_cfg) -> str:
    """The preset's name, or for model.init_from the loaded shape (its config.json, not the preset, decides)."""
    if not cfg.model.init_from:
        return cfg.model.preset
    shape = f"{bert_cfg.num_hidden_layers} layers, hidden {bert_cfg.hidden_size}"
    return f"{cfg.model.init_from} ({shape}, {bert_cfg.max_position_embeddings} positions)"


def build_model_for(
    cfg: PretrainConfig, bert_cfg, info: ddp.DistInfo, resumed: ckpt.Checkpoint | None = None
) -> tuple[torch.nn.Module, Any]:
    """A fresh model of the preset, or the weights of model.init_from (its config.json decides the shape; the
    config's dropout rates and rotary base replace its own; heads it lacks, a masked-LM checkpoint's pooler and
    NSP head, start fresh, said in one line); runtime choices applied from outside. `resumed`: this run's
    checkpoint. The checkpoint a run starts from (`resumed`, else train.init_checkpoint's) holds every weight and
    restore() loads them all: then only its config.json is read, which init_from's decided when it was written.
    Reading init_from's weights first was wasted, and one moved away or damaged since stopped the run."""
    m = cfg.model
    if m.init_from:
        from bertforge.model.hf_interop import config_from_hf, load_pretrained, read_config

        start = resumed or (init_checkpoint(cfg.train.init_checkpoint) if cfg.train.init_checkpoint else None)
        asked, source = bert_cfg, str(start.model_dir) if start is not None else m.init_from
        raw, path = read_config(source)  # before any weight is read
        own = config_from_hf(raw, str(path))
        _check_init_from(cfg, own)
        overrides = m.loaded_overrides() or {}
        if own.model_type == "modernbert":  # rotary positions, no table to outgrow: a phase extends the context
            overrides["max_position_embeddings"] = max(asked.max_position_embeddings, own.max_position_embeddings)
        if start is not None:
            model, bert_cfg = _built_as_loaded(own, overrides, cfg)
        else:
            model, bert_cfg = load_pretrained(
                source,
                cfg.train.task,
                attention=cfg.train.attention,
                config_overrides=overrides or None,
                allow_missing_head=True,
            )
        differ = [f"{k} {getattr(asked, k)}" for k in _shape_diff(asked, bert_cfg)]
        differ += [f"vocab_size {m.vocab_size}"] if m.vocab_size and m.vocab_size != bert_cfg.vocab_size else []
        if differ:
            _log0(
                info,
                f"model.init_from {m.init_from}: its config.json decides the model's shape, not model.preset "
                f"{m.preset} / model.max_position_embeddings / model.vocab_size ({', '.join(differ)} not used)",
            )
        if start is None and (fresh := model.hf_load_info["initialised"]):
            _log0(
                info,
                f"model.init_from {m.init_from} lacks {len(fresh)} weight(s), which start fresh: {', '.join(fresh)}",
            )
    else:
        from bertforge.model import build_model

        model = build_model(bert_cfg, cfg.train.task, attention=cfg.train.attention)
    apply_model_choices(model, cfg.train)
    return model, bert_cfg


def _built_as_loaded(own, overrides: dict[str, Any], cfg: PretrainConfig) -> tuple[BertForTask, Any]:
    """The model `load_pretrained(..., config_overrides=overrides)` builds from a checkpoint whose config is `own`,
    its weights left to restore() (which loads every one of them from that checkpoint)."""
    from bertforge.model import build_model

    config = own.replace(**overrides)  # as load_pretrained applies them (BertConfig.replace owns the dropout rule)
    return build_model(config, cfg.train.task, attention=cfg.train.attention), config


def _check_init_from(cfg: PretrainConfig, own) -> None:
    """Refuse an init_from the objective cannot train: only a BERT with two token types can take mlm_nsp's
    sentence pairs (a RoBERTa has one token type, so the pairs' segment 1 is no row of its table, and no NSP head)."""
    m, t, model_type = cfg.model, cfg.train, own.model_type
    if m.global_rope_theta is not None and model_type != "modernbert":
        raise UserError(
            f"model.global_rope_theta is a ModernBERT setting; model.init_from {m.init_from} is a "
            f"{model_type} model: leave it out"
        )
    if t.objective == "mlm_nsp" and (model_type != "bert" or own.type_vocab_size < 2):
        what = "has no next-sentence head" if model_type != "bert" else "has one token type (the pairs need two)"
        raise UserError(
            f"model.init_from {m.init_from} is a {model_type} model, which {what}: set train.objective=mlm "
            "(MLM-only shards: data shards --objective mlm)"
        )


RESUME_KEYS = (
    "train.global_batch_size",
    "train.micro_batch_size",
    "train.seed",
    "data.input_dir",
    "data.chunk_rows",
    "optim.lr",
    "optim.warmup",
    "optim.schedule",
    "optim.decay",
    "optim.decay_shape",
    "model.global_rope_theta",
    "train.max_steps",
    "optim.weight_decay",
    "optim.beta1",
    "optim.beta2",
    "optim.eps",
    "optim.max_grad_norm",
    "data.mlm_probability",
    "data.mask_replace_prob",
    "data.random_replace_prob",
    "data.synthetic_seq_len",
    "data.synthetic_max_pred",
    "data.synthetic_histogram",
    "data.synthetic_pack",
    "data.synthetic_pack_algorithm",
    "data.synthetic_vocab_size",
)
"""What --resume must share with the checkpoint's run: the data order (the loader's lanes are global / micro
batch, its shuffles follow the seed and chunk_rows; the shards), the data itself (the masks drawn for shards
masked in the loader, the synthetic source's rows), the schedule and the optimizer's settings (clipping too)."""


def data_signature(loader: Any) -> dict[str, Any] | None:
    """The shards the data order is dealt from, beyond data.input_dir's path: their count, rows and a digest of each
    file's name, rows, size and the manifest's sha256 (where it records one), so a shard added to or removed from
    the directory, or rebuilt from other documents, is seen on --resume (the lanes are dealt from the row counts:
    another order, rows read twice or never). No file is read; a size is one `stat`. None for synthetic data."""
    shards: ShardSet | None = getattr(loader, "shards", None)
    if shards is None:
        return None
    listed = {e.get("file"): e.get("sha256") for e in shards.manifest.get("shards") or [] if isinstance(e, dict)}
    parts = [[i.path.name, i.rows, _size(i.path), listed.get(i.path.name)] for i in shards.infos]
    digest = hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]
    return {"shards": len(parts), "rows": shards.rows, "sha256": digest}


def _size(path: Path) -> int | None:
    """A shard's size; None when it cannot be read now (the save goes on: the reader names a lost shard)."""
    try:
        return path.stat().st_size
    except OSError:
        return None


def _data_changed(saved: Any, now: dict[str, Any] | None) -> list[str]:
    """The shards' change since the checkpoint (`data_signature`), as one `changed` entry; none when either
    side has no signature (synthetic data, a checkpoint from before it was recorded)."""
    if not (isinstance(saved, dict) and now is not None) or saved.get("sha256") == now["sha256"]:
        return []
    how = "added or removed" if saved.get("shards") != now["shards"] else "rebuilt or replaced"
    return [
        f"data.input_dir's shards ({saved.get('shards')} files, {saved.get('rows')} rows -> {now['shards']} files, "
        f"{now['rows']} rows; {how})"
    ]


def check_resume(
    cfg: PretrainConfig,
    found: ckpt.Checkpoint,
    allow_changed: bool,
    info: ddp.DistInfo,
    lanes: int | None = None,
    data: dict[str, Any] | None = None,
) -> None:
    """Compare RESUME_KEYS with the config the checkpoint recorded, the data `lanes` (micro-batches per update
    over all ranks) and the shards (`data`: `data_signature`) with the checkpoint's: a change is refused (it
    would not continue the saved run: another data order, another learning-rate curve) unless `allow_changed`
    (--allow-changed)."""
    meta = found.meta()
    saved = meta.get("config")
    if (name := _recorded(saved, "optim.name")) not in (None, cfg.optim.name):
        raise UserError(
            f"--resume: checkpoint {found.path} holds {name}'s state, and optim.name is now {cfg.optim.name}: "
            f"set optim.name={name} to continue the run, or start a new phase from it with "
            "train.init_checkpoint (its weights, the optimizer afresh)"
        )
    now = asdict(cfg)
    changed = _data_changed(meta.get("data"), data)
    if lanes is not None and isinstance(meta.get("lanes"), int) and meta["lanes"] != lanes:
        # packed rows per update round to micro x processes: another process count can change them; so can the
        # micro-batch, or the packed shards' sequences per row (counted since 2026-11-27 where no packing.json says)
        was = meta.get("world_size")
        why = (
            f"{was} -> {info.world_size} processes: run on {was} to keep them"
            if was != info.world_size
            else "rows per update: train.micro_batch_size, or the packed shards' sequences per row"
        )
        changed.append(f"data lanes {meta['lanes']} -> {lanes} ({why})")
    recorded_cfg: dict[str, Any] = saved if isinstance(saved, dict) else {}  # none recorded: nothing to compare
    for key in RESUME_KEYS:
        section, name = key.split(".")
        recorded = recorded_cfg.get(section) or {}
        if name not in recorded:
            continue  # a checkpoint from before the key existed: nothing to compare
        if name.startswith("decay") and cfg.optim.schedule != "wsd":
            continue  # only wsd reads them (a run of another schedule may have recorded any value, ignored)
        # as meta.json holds it (a histogram's pairs are lists there, whatever the config made of them)
        old, new = recorded[name], json.loads(json.dumps(now[section][name], default=str))
        if key == "data.input_dir" and old and new:
            old, new = str(Path(old).resolve()), str(Path(new).resolve())
        if key == "model.global_rope_theta":  # null is the model's own base: compare the base that runs
            from bertforge.model.config import BertConfig

            old, new = (BertConfig.global_rope_theta if v is None else float(v) for v in (old, new))
        if old != new:
            changed.append(f"{key} {old} -> {new}")
    if not changed:
        return
    what = ", ".join(changed)
    if not allow_changed:
        raise UserError(
            f"--resume: {what} since checkpoint {found.path}; the run would not continue as saved (data order, "
            "learning-rate schedule): set them back with --set KEY=VALUE, or pass --allow-changed to continue "
            "with the new values"
        )
    _log0(info, f"--allow-changed: resuming {found.path} with {what}")


def _check_objective(cfg: PretrainConfig, found: ckpt.Checkpoint) -> None:
    """A checkpoint of the other objective has other heads (NSP's or none) and optimizer groups: one line
    before loading, not a size mismatch inside torch."""
    objective = _recorded(found.meta().get("config"), "train.objective")
    if objective and objective != cfg.train.objective:
        raise UserError(
            f"checkpoint {found.path} was trained with train.objective={objective}, and this run has "
            f"{cfg.train.objective}: set train.objective={objective}"
        )


def _load_optimizer(optimizer, state: dict) -> None:
    """The saved moments, with this config's settings: torch's load_state_dict also brings back the saved run's
    weight decay, betas and eps, which would then run although config.yaml says otherwise (phase 2 with its
    own recipe; a resume with --allow-changed)."""
    # only what the config sets per group; lr and the schedule's keys are state that a resume must keep
    mine = [{k: group[k] for k in ("weight_decay", "betas", "eps") if k in group} for group in optimizer.param_groups]
    try:
        optimizer.load_state_dict(state)
    except ValueError as e:  # another head layout: the groups' sizes differ (MLM-only against MLM + NSP)
        raise UserError(
            f"the checkpoint's optimizer state does not fit this model and optimizer ({first_line(e)}); start "
            "from another checkpoint"
        ) from None
    for group, settings in zip(optimizer.param_groups, mine):
        group.update(settings)


def restore(
    cfg: PretrainConfig,
    ckpt_root: Path,
    resume: bool,
    model,
    optimizer,
    scaler,
    device,
    info: ddp.DistInfo,
    vocab_file: Path | None = None,
) -> tuple[TrainState, bool]:
    """A checkpoint of this run (--resume), else phase 2's init checkpoint, else a fresh state. `vocab_file`: the
    data's (`resolve_vocab`), which the checkpoint's tokenizer must be."""
    found = ckpt.latest_checkpoint(ckpt_root) if resume else None
    if found is not None:
        _check_objective(cfg, found)
        _check_vocab(vocab_file, found, f"--resume: checkpoint {found.path}")
        _load_weights(model, found.model_dir, found.resume_fix)
        saved = found.load_state(require=ckpt.STATE_KEYS)
        _load_optimizer(optimizer, saved["optimizer"])
        if saved["scaler"] or not scaler.is_enabled():
            scaler.load_state_dict(saved["scaler"])
        else:  # written in bf16/fp32 (precision auto on another GPU): fp16 starts its loss scale afresh
            _log0(info, f"{found.path} was written without loss scaling: fp16 starts a fresh loss scale")
        state = TrainState.of(saved["train_state"], found.path)
        _restore_rng(saved["rng"], cfg.train.seed, state.batches, device, info)
        _log0(
            info,
            f"resumed from {found.path} (phase {state.phase}, step {state.step}, {state.sequences:,} sequences seen)",
        )
        return state, True
    if cfg.train.init_checkpoint:
        src = init_checkpoint(cfg.train.init_checkpoint)
        # not this run's: deleting it would not help, and an untrusted file must never be loaded unsafely
        fix = "set train.init_checkpoint to an intact checkpoint of `bertforge pretrain` from a source you trust"
        _check_objective(cfg, src)
        _check_vocab(vocab_file, src, f"train.init_checkpoint {cfg.train.init_checkpoint}")
        _load_weights(model, src.model_dir, fix)
        saved = src.load_state(fix=fix, require=ckpt.STATE_KEYS)
        prev = TrainState.of(saved["train_state"], src.path)
        _check_finished(cfg.train.init_checkpoint, src, prev)
        if (name := _recorded(src.meta().get("config"), "optim.name")) in (None, cfg.optim.name):
            _load_optimizer(optimizer, saved["optimizer"])
            _reset_optimizer_step(optimizer)
            _log0(info, f"phase {prev.phase + 1} from {src.path}: weights and optimizer moments loaded, step reset")
        else:  # another optimizer's state (LAMB's moments under AdamW's keys) cannot carry over
            _log0(
                info,
                f"phase {prev.phase + 1} from {src.path}: weights loaded; its {name} moments not "
                f"({cfg.optim.name} starts afresh)",
            )
        return TrainState(phase=prev.phase + 1, phase_offset=prev.phase_offset + prev.step), False
    if resume:
        _log0(info, f"--resume: no checkpoint in {ckpt_root}; starting from scratch")
    return TrainState(), False


def _restore_rng(rngs: list[Any], seed: int, batches: int, device: torch.device, info: ddp.DistInfo) -> None:
    """Each rank's own saved RNG states: dropout continues as in the uninterrupted run. On another process count
    (the lanes, so the data order, can stay the same) a rank the checkpoint has no state for is seeded afresh from
    (seed, rank, data cursor): given rank 0's state, as it was, it drew rank 0's dropout masks for the rest of the
    run. Either way the random draws cannot continue as saved, and the run says so."""
    if info.rank < len(rngs):
        dev.set_rng_state(device, rngs[info.rank])
    else:
        torch.manual_seed(int(np.random.SeedSequence([seed, info.rank, batches]).generate_state(1)[0]))
    if len(rngs) != info.world_size:
        _log0(
            info,
            f"--resume: the checkpoint was written by {len(rngs)} process{'es' if len(rngs) > 1 else ''} and this "
            f"run has {info.world_size} processes: the data order goes on as saved, the random draws (dropout) do not",
        )


def init_checkpoint(given: str) -> ckpt.Checkpoint:
    """train.init_checkpoint's checkpoint (a step_N directory, or the newest under a run directory). A model
    directory given there (a Hugging Face one, or a checkpoint's model/) holds weights without the optimizer state
    and counters a phase starts from: the one line names the setting for it, not just "no complete checkpoint"."""
    path = Path(given)
    if (path / "config.json").is_file() and not (path / ckpt.META_FILE).is_file():
        parent = path.parent
        if ckpt.STEP_DIR.match(parent.name) and (parent / ckpt.META_FILE).is_file():
            raise UserError(
                f"train.init_checkpoint {given} is the model directory of checkpoint {parent}: set "
                f"train.init_checkpoint={parent} (its weights and optimizer moments start the phase)"
            )
        raise UserError(
            f"train.init_checkpoint {given} is a model directory, not a checkpoint of `bertforge pretrain` (no "
            f"{ckpt.META_FILE}, no optimizer state): to start from its weights with a fresh optimizer, set "
            f"model.init_from={given} and train.init_checkpoint=null"
        )
    return ckpt.find_checkpoint(given)


def _check_vocab(vocab_file: Path | None, src: ckpt.Checkpoint, what: str) -> None:
    """The checkpoint's vocab (the tokenizer files its model directory ships) must be this run's data vocab: phase-2
    shards built with another vocab of the same size would train phase 1's embeddings on ids that mean other words,
    and ship the other vocab.txt with them. Nothing to compare where either side has no vocab file."""
    from bertforge.data.vocab import load_tokenizer

    saved = src.model_dir
    if vocab_file is None or not any((saved / n).is_file() for n in ("vocab.txt", "tokenizer.json")):
        return
    try:
        theirs_vocab = load_tokenizer(saved).get_vocab()
    except UserError:  # a damaged tokenizer file: the weights are what a phase or a resume needs from there
        return
    if theirs_vocab == load_tokenizer(vocab_file).get_vocab():
        return
    theirs = saved / "vocab.txt" if (saved / "vocab.txt").is_file() else saved
    raise UserError(
        f"{what} was trained with the vocab in {saved}, and this run's data has another ({vocab_file}): its token "
        f"ids would mean other words; set data.vocab={theirs}, with shards built from it (bertforge data shards "
        f"--vocab {theirs})"
    )


def _check_finished(given: str | None, src: ckpt.Checkpoint, prev: TrainState) -> None:
    """train.init_checkpoint given as a run directory means the result of that run's phase: its newest checkpoint
    must be the phase's last step. A phase stopped early by train.stop_after_steps exits 0, so a next phase chained
    on it (sbatch --dependency=afterok) started from a partly trained model without a word. A step directory
    named as such is started from on purpose."""
    if given is None or Path(given).resolve() == src.path.resolve():
        return
    config = src.meta().get("config")
    total = (config.get("train") or {}).get("max_steps") if isinstance(config, dict) else None
    if isinstance(total, int) and prev.step < total:
        raise UserError(
            f"train.init_checkpoint {given}: its newest checkpoint {src.path.name} is at step {prev.step} of its "
            f"{total} (train.max_steps): that phase has not finished; continue it with --resume first, or set "
            f"train.init_checkpoint={src.path} to start from this checkpoint anyway"
        )


def _resolved(
    cfg: PretrainConfig, device: torch.device, info: ddp.DistInfo, fixed: bool, precision: str
) -> PretrainConfig:
    """`config.resolve_auto` for this run: its device and process count, fixed-shape rows and precision."""
    fast = dev.compiles_fast(device, info.distributed)
    train, optim = resolve_auto(cfg.train, cfg.optim, fast, fixed, precision)
    return replace(cfg, train=train, optim=optim)


def setup(
    cfg: PretrainConfig,
    resume: bool = False,
    json_summary: str | None = None,
    save_hook: Callable[[Path], None] | None = None,
    allow_changed: bool = False,
    overwrite: bool = False,
    profile_steps: int = 0,
) -> Run:
    """Device, model, optimizer, restored state, the compiled step, the data and the logger. Everything the
    files record (shards, vocab, the checkpoint's config) is checked before the model is built."""
    t_created = time.perf_counter()
    info, device = ddp.init_distributed(cfg.train.device, cfg.train.ddp_timeout)
    precision = dev.resolve_precision(cfg.train.precision, device)
    shards = open_data(cfg, info)
    data_rows, vocab_size, vocab_file = resolve_vocab(cfg, shards)
    loader = build_loader(cfg, shards, info, data_rows)  # reads nothing yet (workers start at step 1)
    packed, fixed = "packed" in loader.kind or cfg.data.pack_per_row > 0, "packed" in loader.kind  # see resolve_auto
    cfg = _resolved(cfg, device, info, fixed, precision)  # auto settings made concrete, as config.yaml records
    t, o = cfg.train, cfg.optim
    dev.check_compile_toolchain(device, compile_keys(t, o))
    ckpt_root = Path(t.output_dir) / "checkpoints"
    if (found := ckpt.latest_checkpoint(ckpt_root) if resume else None) is not None:
        check_resume(cfg, found, allow_changed, info, loader.accum * info.world_size, data_signature(loader))
    torch.manual_seed(t.seed)  # the same init on every rank; DDP checks it
    model, bert_cfg = build_model_for(cfg, build_bert_config(cfg, model_rows(cfg, vocab_size, found)), info, found)
    model.to(device)
    guard = _enter_fp8(cfg, model, device, precision, info, shards.seq_len if shards else loader.seq_len)
    optimizer = optimizer_for(model, o, device.type)
    scaler = dev.grad_scaler(device, precision)
    state, resumed = restore(cfg, ckpt_root, resume, model, optimizer, scaler, device, info, vocab_file)
    guard = _fp8_as_saved(guard, state, model, info)
    if not resumed:
        torch.manual_seed(t.seed + info.rank)  # dropout differs per rank
    step = TrainStep.build(  # DDP wraps the restored model (it broadcasts rank 0's weights); compile wraps DDP
        model,
        optimizer,
        device,
        precision,
        o.max_grad_norm,
        compile_mode(t),
        ddp=ddp.wrap_ddp(model, device, info) if info.distributed else None,
        scaler=scaler,
        compile_scope=t.compile_scope,
    )
    loader.pin_memory = device.type == "cuda"  # page-locked batches: the non-blocking copies overlap the step
    loader.segments = wants_segments(device, t.attention, packed, fixed=bool(compile_mode(t)) or t.fp8)
    check_fits(loader, shards, bert_cfg, cfg.data.eval_dir, cfg.model.init_from)
    check_profile(profile_steps, t, state)
    if info.is_main:
        claim_output_dir(cfg, overwrite, state.phase_offset + state.step if resumed else None, json_summary)
    # steps are logged run-wide (a phase 2 goes on from phase 1's count), so the total is too: "step 7040/8601"
    total = state.phase_offset + t.max_steps
    logger = MetricsLogger(
        Path(t.output_dir), info.is_main, total, json_summary, tensorboard=t.tensorboard, resume=resumed
    )
    run = Run(
        cfg,
        info,
        device,
        precision,
        model,
        bert_cfg,
        data_rows,
        vocab_file,
        step,
        loader,
        logger,
        state,
        resumed,
        ckpt_root,
        seconds_before=state.train_seconds,
        t_created=t_created + _measure_peak(device),  # after every check, before the loader's workers start
        fp8_guard=guard,
        power=PowerSampler(device) if info.is_main else None,
        save_hook=save_hook,
    )
    _announce(run)
    return run


def _enter_fp8(
    cfg: PretrainConfig, model: torch.nn.Module, device: torch.device, precision: str, info: ddp.DistInfo, seq_len: int
) -> fp8.Fp8Guard | None:
    t = cfg.train
    if not t.fp8:
        return None
    if not (t.fp8_emulate or fp8.fp8_usable(device)):
        raise UserError(
            f"train.fp8 needs a GPU with FP8 tensor cores (H100, Ada) and torchao installed "
            f"(pip install torchao); {device} has none here. Set train.fp8=false"
        )
    if precision != "bf16":
        raise UserError(
            f"train.fp8 runs the other ops in bf16, but {device} resolved precision {precision}; "
            "set train.precision=bf16 or train.fp8=false"
        )
    if not t.fp8_emulate and (t.micro_batch_size * seq_len) % 16:
        # the encoder's linears run on micro-batch x seq_len token rows (FP8 keeps the fixed, segmented layout), and
        # torch._scaled_mm's weight-gradient product needs that count in multiples of 16 on CUDA: not a crash at step 1
        raise UserError(
            f"train.fp8 needs train.micro_batch_size x the rows' seq_len in multiples of 16 (torch._scaled_mm), not "
            f"{t.micro_batch_size} x {seq_len}; change train.micro_batch_size or set train.fp8=false"
        )
    n = fp8.convert(model, emulate=t.fp8_emulate)
    _log0(
        info,
        f"fp8: {n} linear layers in float8 (tensorwise scaling); back to bf16 after "
        f"{t.fp8_fallback_after} non-finite steps in a row",
    )
    return fp8.Fp8Guard(t.fp8_fallback_after)


def _fp8_as_saved(
    guard: fp8.Fp8Guard | None, state: TrainState, model: torch.nn.Module, info: ddp.DistInfo
) -> fp8.Fp8Guard | None:
    """A run whose FP8 fell back to bf16 before it saved goes on in bf16: the fall-back is for the whole run."""
    if guard is None or not state.fp8_fallen_back:
        return guard
    _log0(info, f"fp8: {fp8.revert(model)} layers back in bf16, as the run was when it saved (fp8 fell back)")
    return None


def _leave_fp8(run: Run) -> None:
    n = fp8.revert(run.model)
    run.state.fp8_fallen_back = True
    _log(run, {"fp8_fallback": 1.0})
    _log0(
        run.info,
        f"fp8: {run.fp8_guard.fallback_after if run.fp8_guard else '?'} non-finite steps in a row; "
        f"{n} layers back to bf16 for the rest of the run",
    )


def _announce(run: Run) -> None:
    cfg, info, state = run.cfg, run.info, run.state
    run.logger.params(
        {
            "phase": state.phase,
            "world_size": info.world_size,
            "accumulation": run.loader.accum,
            "precision": run.precision,
            "device": str(run.device),
            "data_kind": run.loader.kind,
            **{f"{k}.{kk}": vv for k, v in asdict(cfg).items() for kk, vv in v.items()},
        }
    )
    n_params = sum(p.numel() for p in run.model.parameters()) / 1e6
    t = cfg.train
    _log0(
        info,
        f"pretrain phase {state.phase}: {model_name(cfg, run.bert_cfg)} ({n_params:.1f}M params) on "
        f"{info.world_size} x {run.device} in {run.precision}; global batch {t.global_batch_size} = "
        f"{t.micro_batch_size} x {info.world_size} ranks x {run.loader.accum} accumulation; {run.loader.kind} "
        f"shards; step: {step_kind(t, cfg.optim)}",
    )


# ------------------------------------------------------------------------------------------ eval, save
def save(run: Run, window: _Window) -> ckpt.Checkpoint | None:
    """A checkpoint of the whole state (rank 0 writes, every rank's RNG included); the sequences and tokens of
    steps not yet logged are counted first, so the checkpoint's totals are exact whatever log_every is."""
    state = run.state
    window.settle(state)
    state.train_seconds = run.train_seconds
    rngs = _gather_rng(run.device)

    def write() -> ckpt.Checkpoint:
        step = run.step
        return ckpt.save_checkpoint(
            run.ckpt_root,
            state.phase_offset + state.step,
            model_writer(run.model, run.bert_cfg, run.cfg.train.task, run.vocab_file),
            {
                "optimizer": step.optimizer.state_dict(),
                "scaler": step.scaler.state_dict(),
                "rng": rngs,
                "train_state": asdict(state),
            },
            {
                "phase": state.phase,
                "phase_step": state.step,
                "sequences": state.sequences,
                "tokens": state.tokens,
                "precision": run.precision,
                "world_size": run.info.world_size,
                "lanes": run.loader.accum * run.info.world_size,  # micro-batches per update: --resume compares them
                "data": data_signature(run.loader),  # the shards the lanes were dealt from: --resume compares them
                "config": asdict(run.cfg),
            },
            keep_last=run.cfg.train.keep_last,
            _before_rename=run.save_hook,
        )

    return ddp.on_main(write)  # rank 0 writes; a full disk there is the same one line on every rank


def evaluate_run(run: Run) -> dict[str, float]:
    d, t = run.cfg.data, run.cfg.train
    if not d.eval_dir:  # callers check data.eval_dir first
        raise ValueError("evaluate_run needs data.eval_dir")
    return evaluate(
        run.step.model,
        d.eval_dir,
        run.device,
        run.precision,
        t.micro_batch_size,
        d.eval_batches,
        run.info,
        run.vocab_size,
        t.seed,
        d.eval_masking,
        segments=run.loader.segments,
    )


# ---------------------------------------------------------------------------------------------- the loop


@contextlib.contextmanager
def _closed_on_error(run: Run, prof: StepProfiler | None) -> Iterator[None]:
    """Left open when the loop raises, torch.profiler recorded every op of the calling process from then on (and
    refused the next profile), and the power sampler's thread went on sampling: both closed, and the metrics
    file; the loop's error is the one reported."""
    try:
        yield
    except BaseException:
        with contextlib.suppress(Exception):
            if prof is not None:
                prof.__exit__(*sys.exc_info())
        with contextlib.suppress(Exception):
            run.logger.close()
        if run.power is not None:
            run.power.close()
        raise


def _wind_up(
    run: Run,
    window: _Window,
    lr: float,
    last_saved: int,
    last_eval: int,
    eval_metrics: dict[str, float],
    start: int,
) -> dict[str, float]:
    """After the loop: the row of steps since the last log line (a stop between two, train.stop_after_steps), the
    final checkpoint and evaluation where the loop's last step had none; the latest evaluation's metrics.
    `start`: the step this call began at."""
    t, step = run.cfg.train, run.state.step
    if window.updates:
        _log_window(run, window, lr)
    if t.save_every and last_saved != step:
        save(run, window)
    if run.cfg.data.eval_dir and last_eval != step:
        metrics = evaluate_run(run)
        # a stop between evaluations: its numbers go into metrics.jsonl and TensorBoard as the summary's do (they
        # were in summary.json alone). A resumed finished run, which ran no step, logged this step's already
        if step > start:
            _log(run, metrics)
        return metrics
    return eval_metrics


def train(run: Run, profile_steps: int = 0, preempt: Preemption | None = None) -> dict[str, Any]:
    """restore -> for step: one `train_step` over accum micro-batches -> every N: log / eval / save.
    `profile_steps`: record that many steps (after one warm-up step) with torch.profiler into
    output_dir/profile/ (trace.json for Perfetto/TensorBoard, top_ops.txt) and print the top kernels.
    `preempt`: its signal flag is read at each step boundary; set, the run saves and raises `Preempted`."""
    t, o, state = run.cfg.train, run.cfg.optim, run.state
    start = state.step
    stop_at = _stop_at(t, start)
    prof = _profiler(run, profile_steps)
    with _closed_on_error(run, prof):  # a loop that raises (a non-finite stop, a signal, a damaged shard)
        batches = _one_line_errors(run.loader.iterate(start_batch=state.batches))
        window = _Window(run.device)
        nonfinite_run = 0
        last_saved = state.step if run.resumed else -1  # a resumed finished run does not re-save
        last_eval, lr = -1, 0.0  # lr: the last update's, for a row the wind-up logs
        eval_metrics: dict[str, float] = {}
        run.t_start = time.perf_counter()
        run.step.model.train()
        if (notice := compile_notice(t)) and state.step < stop_at:
            _log0(run.info, notice)
        while state.step < stop_at:
            lr = lr_at(state.step + 1, o.lr, t.max_steps, o.warmup, o.schedule, o.decay, o.decay_shape)
            set_lr(run.step.optimizer, lr)
            result = train_step(run.step, window.timed(batches, run.loader.accum), run.loader.accum, window.add)
            state.batches += 1
            if prof is not None and not prof.done:
                prof.step()
                if prof.done:
                    _profiled(run, prof)
            fell_back = run.fp8_guard is not None and run.fp8_guard.observe(result.finite)
            if fell_back:
                _leave_fp8(run)
            if run.first_step_s is None:  # train_step synced the host: the device has finished the step
                run.first_step_s = time.perf_counter() - run.t_created
                _log0(run.info, f"first step done {run.first_step_s:.1f}s after set-up began (compile included)")
            if result.finite:
                state.step += 1
                nonfinite_run = 0
                window.grad_norm_sum += result.grad_norm.double()
                window.updates += 1
            else:
                state.skipped += 1
                window.skipped += 1
                nonfinite_run = 0 if fell_back else nonfinite_run + 1  # bf16 gets its own max_nonfinite_steps tries
                if nonfinite_run >= t.max_nonfinite_steps:
                    _stop_nonfinite(run, window, nonfinite_run)
                continue
            last = state.step == t.max_steps
            logging = state.step % t.log_every == 0 or last
            evaluating = bool(run.cfg.data.eval_dir) and (state.step % t.eval_every == 0 or last)
            saving = bool(t.save_every) and (state.step % t.save_every == 0 or last)
            if logging:  # the window ends once the device has finished this update (its optimizer kernels too)
                _log_window(run, window, lr)
            elif evaluating or saving:
                dev.synchronize(run.device)  # this update's last kernels are its window's time, not the pause's
            t_pause = time.perf_counter()  # the log line, eval and checkpoints stay out of the throughput window
            if evaluating:
                eval_metrics = evaluate_run(run)
                _log(run, eval_metrics)
                last_eval = state.step
            if saving:
                save(run, window)
                last_saved = state.step
            # a flushed window starts now; an open one skips the pause. (Not `t0 += pause` after a flush: flush()
            # already restarted t0 after its device sync, which that window counted, and the next would lose it)
            window.t0 = time.perf_counter() if logging else window.t0 + time.perf_counter() - t_pause
            if preempt is not None and preempt.agreed(run.device):  # an all-reduce under torchrun: loop time
                _stop_preempted(run, preempt, window, lr, last_saved)
        eval_metrics = _wind_up(run, window, lr, last_saved, last_eval, eval_metrics, start)
    if prof is not None:
        prof.__exit__(None, None, None)
    return _finish(run, window, eval_metrics)


def _profiler(run: Run, steps: int) -> StepProfiler | None:
    """The profiler of `--profile N` (main rank), with a timeline of the step's parts over the same steps."""
    if steps <= 0 or not run.info.is_main:
        return None
    run.step.timeline = StepTimeline(run.device)
    return StepProfiler(Path(run.cfg.train.output_dir) / "profile", steps=steps, device=run.device).__enter__()


def check_profile(steps: int, t: PretrainTrainConfig, state: TrainState) -> None:
    """`--profile N` records N steps after PROFILE_WARMUP steps (StepProfiler's default): refused at start-up when
    the steps this run has left cannot hold them (the profile would end with the run, unwritten)."""
    left, w = _stop_at(t, state.step) - state.step, PROFILE_WARMUP
    if steps > 0 and w + steps > left:
        raise UserError(
            f"--profile {steps} records {steps} steps after {w} warm-up step, and this run has {left} left: "
            + (f"lower --profile to {left - w} or raise train.max_steps" if left > w else "raise train.max_steps")
        )


def _stop_at(t: PretrainTrainConfig, start: int) -> int:
    """The step this process ends at: train.max_steps, or train.stop_after_steps updates after `start` (the step it
    resumed at) before it. Counted from this process's start, not from the phase's: a time-limited job is resubmitted
    with the same command line (examples/pretrain.sbatch), and a phase step would end every job after the first
    where it began, without a step."""
    return min(t.max_steps, start + t.stop_after_steps) if t.stop_after_steps > 0 else t.max_steps


def _profiled(run: Run, prof: StepProfiler) -> None:
    """The profile window is complete: print its top kernels and the step's parts; write the parts next to the
    trace (profile/step_parts.json)."""
    timeline, run.step.timeline = run.step.timeline, None
    parts = timeline.summary(skip=prof.warmup) if timeline is not None else {}
    write_text(prof.out_dir / "step_parts.json", json.dumps(parts, indent=1) + "\n")
    _log0(run.info, f"profile of {prof.steps} steps: {prof.trace_path}\n{prof.table}\n{format_parts(parts)}")


def _measure_peak(device: torch.device) -> float:
    """Seconds spent on the device's matmul peak, MFU's denominator (measured once per machine, then cached): at
    set-up, before the loader's workers compete with it for the cores (measured at the first log line, a CPU's
    peak came out low and its MFU high, and the low peak was cached for later runs). Not set-up time:
    first_step_s leaves it out. Its random matrices come from forked RNG states: a machine without the cache
    would otherwise draw other dropout masks than one with it (after a --resume's restored states too)."""
    t0 = time.perf_counter()
    cuda = [device.index if device.index is not None else torch.cuda.current_device()] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda):
        dev.matmul_peak(device)
    return time.perf_counter() - t0


def _log_window(run: Run, window: _Window, lr: float) -> None:
    metrics = window.flush(run.info, run.cfg.train.global_batch_size, lr, run.state)
    metrics["mfu"] = _mfu(run.bert_cfg, metrics, run.device, run.precision, run.info, run.cfg.train.task)
    if run.device.type != "cpu":
        metrics["peak_mem_gb"] = dev.max_memory_allocated(run.device) / 2**30
    if run.power is not None:  # watts, joules, joules_per_seq, SM clock, temperature (NVIDIA GPUs)
        # the sampler reads rank 0's GPU only: the sequences are rank 0's share of the window's, not all ranks'
        mine = metrics["seq_per_s"] * metrics["window_s"] / run.info.world_size
        metrics.update(run.power.window(sequences=mine))
    _log(run, {**metrics, "step_in_phase": run.state.step})


def _log(run: Run, metrics: dict[str, Any]) -> None:
    """One record at the current step, written by rank 0; its failure (a full disk: one line naming the file)
    is raised on every rank (`on_main`'s broadcast, one small collective per log line), where the other ranks
    would otherwise go on into the next all-reduce and die with a traceback of a closed connection."""
    ddp.on_main(lambda: run.logger.log(run.state.phase_offset + run.state.step, metrics))


def _stop_nonfinite(run: Run, window: _Window, count: int) -> None:
    saved = save(run, window)
    scaler = run.step.scaler
    raise UserError(
        f"{count} non-finite gradient steps in a row at step {run.state.step} ({run.precision}"
        f"{f', loss scale {scaler.get_scale():g}' if scaler.is_enabled() else ''}); the last good state is "
        f"saved in {saved.path if saved else run.ckpt_root}. Lower optim.lr, use train.precision=bf16 "
        "or fp32, or check the data, then run again with --resume"
    )


def _stop_preempted(run: Run, preempt: Preemption, window: _Window, lr: float, last_saved: int) -> None:
    """Log the open window (the saved counters include its sequences), save unless this step just was, raise."""
    if window.updates:
        _log_window(run, window, lr)
    saved = save(run, window) if last_saved != run.state.step else ckpt.latest_checkpoint(run.ckpt_root)
    run.logger.close()
    if run.power is not None:
        run.power.close()
    name = saved.path.name if saved else f"step_{run.state.phase_offset + run.state.step:08d}"
    raise preempt.stopped(f"saved checkpoint {name} in {run.ckpt_root}; continue with --resume")


def _last_values(run: Run, window: _Window) -> dict[str, Any]:
    """The final training metrics: the last window's, or, when this call ran no step (a resumed finished run),
    the last logged row up to the checkpoint's step; keys still unknown keep an earlier summary's values for
    the same step."""
    global_step = run.state.phase_offset + run.state.step
    last = window.last
    if not last:
        rows = read_jsonl(Path(run.cfg.train.output_dir) / "metrics.jsonl")
        last = next((r for r in reversed(rows) if "loss" in r and r.get("step", 0) <= global_step), {})
    values = {"final_loss": last.get("loss"), "final_mlm_acc": last.get("mlm_acc"), "first_step_s": run.first_step_s}
    earlier = Path(run.cfg.train.output_dir) / "summary.json"
    if run.resumed and earlier.is_file():
        with contextlib.suppress(ValueError):
            old = json.loads(earlier.read_text(encoding="utf-8"))
            if old.get("global_step") == global_step:
                values = {k: old.get(k) if v is None else v for k, v in values.items()}
    return values


def _finish(run: Run, window: _Window, eval_metrics: dict[str, float]) -> dict[str, Any]:
    state = run.state
    window.settle(state)  # a run that stops between two log lines (train.stop_after_steps)
    final = ckpt.latest_checkpoint(run.ckpt_root)
    summary = {
        "phase": state.phase,
        "step": state.step,
        "global_step": state.phase_offset + state.step,
        "sequences": state.sequences,
        "tokens": state.tokens,
        "skipped_steps": state.skipped,
        "train_time_s": run.train_seconds,
        "precision": run.precision,
        "device": str(run.device),
        "world_size": run.info.world_size,
        "model_preset": None if run.cfg.model.init_from else run.cfg.model.preset,
        "model": model_name(run.cfg, run.bert_cfg),
        "parameters": sum(p.numel() for p in run.model.parameters()),  # tied weights once
        **_last_values(run, window),
        **{f"final_{k}": v for k, v in eval_metrics.items()},
        "checkpoint": str(final.path) if final else None,
        "model_dir": str(final.model_dir) if final else None,
    }
    run.logger.finish(summary, plot=run.cfg.train.plot)
    if run.power is not None:
        run.power.close()
    return summary


def run_pretrain(
    cfg: PretrainConfig,
    resume: bool = False,
    json_summary: str | None = None,
    _save_hook: Callable[[Path], None] | None = None,
    profile_steps: int = 0,
    overwrite: bool = False,
    allow_changed: bool = False,
) -> dict[str, Any]:
    """One pre-training phase; returns the summary (also written to train.output_dir/summary.json).
    `overwrite`: delete an earlier run in train.output_dir instead of refusing it (see `check_output_dir`);
    `allow_changed`: resume although RESUME_KEYS differ from the checkpoint's (see `check_resume`).
    Raises `runtime.preempt.Preempted` after saving when SIGTERM or SIGINT arrives."""
    check_output_dir(cfg.train.output_dir, resume, overwrite, start_inputs(cfg))
    with Preemption() as preempt:
        run = setup(cfg, resume, json_summary, _save_hook, allow_changed, overwrite, profile_steps)
        with dev.reproducible_compiled_step(run.device, bool(run.cfg.train.compile)):
            return train(run, profile_steps, preempt)


# ------------------------------------------------------------------------------------------- helpers
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
        self.counted = (0, 0)  # sequences and tokens of this window already in TrainState (`settle`)

    def timed(self, batches: Iterator[dict[str, torch.Tensor]], n: int) -> Iterator[dict[str, torch.Tensor]]:
        """The next n micro-batches, the time spent waiting for each added to data_wait."""
        for _ in range(n):
            t0 = time.perf_counter()
            batch = next(batches)
            self.data_wait += time.perf_counter() - t0
            yield batch

    @torch.no_grad()
    def add(self, out, batch: dict[str, torch.Tensor]) -> None:
        mask = batch["attention_mask"]
        self.sums += torch.stack(
            [
                out.loss.detach().double(),
                torch.ones((), dtype=torch.float64, device=self.device),
                *_scores(out, self.device),
                _sequences(batch).double(),
                (mask != 0).sum().double(),
                torch.tensor(float(mask.shape[0]), device=self.device, dtype=torch.float64),
            ]
        )

    def settle(self, state: TrainState) -> None:
        """Add the window's sequences and tokens (all ranks) not yet counted to `state`, between log lines: a
        checkpoint or the summary must hold exact totals. A collective: every rank calls it (the step counts
        that skip it when the window is empty are the same on every rank)."""
        if not (self.updates or self.skipped):  # just flushed: nothing to count, no sync
            return
        totals = self.sums[6:8].clone()
        ddp.all_reduce_sum(totals)
        sequences, tokens = (int(x) for x in totals.tolist())
        self._count(state, sequences, tokens)

    def _count(self, state: TrainState, sequences: int, tokens: int) -> None:
        state.sequences += sequences - self.counted[0]
        state.tokens += tokens - self.counted[1]
        self.counted = (sequences, tokens)

    def flush(self, info: ddp.DistInfo, global_batch: int, lr: float, state: TrainState) -> dict[str, float]:
        dev.synchronize(self.device)
        elapsed = time.perf_counter() - self.t0
        packed = torch.cat(
            [
                self.sums,
                self.grad_norm_sum.view(1),
                torch.tensor([self.data_wait], dtype=torch.float64, device=self.device),
            ]
        )
        ddp.all_reduce_sum(packed)
        s = packed.tolist()
        self._count(state, int(s[6]), int(s[7]))
        metrics = {
            "loss": s[0] / max(s[1], 1),
            "mlm_acc": s[2] / max(s[3], 1),
            **({"nsp_acc": s[4] / s[5]} if s[5] else {}),  # none without an NSP head (train.objective mlm)
            "lr": lr,
            "grad_norm": s[9] / info.world_size / max(self.updates, 1),
            "window_s": elapsed,
            "seq_per_s": s[6] / elapsed,
            "tokens_per_s": s[7] / elapsed,
            "rows_per_s": s[8] / elapsed,
            "masked_per_seq": s[3] / max(s[6], 1),
            "data_wait": s[10] / info.world_size / elapsed,
            "skipped": state.skipped,
            "sequences": state.sequences,
        }
        self.last = metrics
        self.reset()
        return metrics


def _sequences(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Sequences in a micro-batch (0-dim): packed rows' filled NSP slots, or where positions restart at a real
    token (MLM-only packed rows have no NSP slots), else one per row."""
    nsp = batch.get("nsp_labels")
    if nsp is not None and nsp.dim() == 2:
        return (nsp >= 0).sum()
    if nsp is None and "position_ids" in batch:
        return ((batch["position_ids"] == 0) & (batch["attention_mask"] != 0)).sum()
    return torch.tensor(batch["attention_mask"].shape[0], device=batch["attention_mask"].device)


def _mfu(
    bert_cfg, metrics: dict[str, float], device: torch.device, precision: str, info: ddp.DistInfo, task: str
) -> float:
    """Model FLOPs utilisation over real tokens: the training FLOPs of sequences of the window's mean real length
    and masked count (no credit for padding) x sequences/s, over the measured matmul peak of every rank."""
    from bertforge.model.flops import flops_per_sequence

    seqs = max(metrics["seq_per_s"], 1e-9)
    flops = flops_per_sequence(
        bert_cfg, metrics["tokens_per_s"] / seqs, metrics["masked_per_seq"], task=task, training=True
    )
    return flops * metrics["seq_per_s"] / (dev.peak_flops(device, precision) * info.world_size)


def _load_weights(model: BertForTask, model_dir: Path, fix: str) -> None:
    from bertforge.model.hf_interop import _weights_file, load_hf_state_dict, normalise_keys, read_state_dict

    _check_shape(model.config, Path(model_dir))
    sd = normalise_keys(read_state_dict(_weights_file(Path(model_dir)), fix), model.config.model_type)
    load_hf_state_dict(model, sd, source=str(model_dir))


def _check_shape(ours, model_dir: Path) -> None:
    """A checkpoint (--resume, train.init_checkpoint) of another model than this run builds: one line naming
    the settings, not a weight's shape with advice about heads."""
    theirs = _saved_config(model_dir)
    if theirs is None:
        return  # the weights' loader names what is wrong with the directory
    if differ := [f"{k} {getattr(theirs, k)} (this run: {getattr(ours, k)})" for k in _shape_diff(theirs, ours)]:
        raise UserError(
            f"{model_dir} holds another model: {', '.join(differ)}; set model.preset and "
            "model.max_position_embeddings as the run that wrote it had them"
        )


def _saved_config(model_dir: Path):
    """A checkpoint's model config (its config.json), or None where it cannot be read: the weights' loader then
    names what is wrong with the directory."""
    from bertforge.model.hf_interop import config_from_hf, read_config

    try:
        raw, cfile = read_config(model_dir)
        return config_from_hf(raw, str(cfile))
    except UserError:
        return None


def _recorded(saved: Any, key: str) -> str | None:
    """A string setting ("optim.name": whose optimizer state a checkpoint holds; "train.objective": its heads) of
    `saved`, the config a checkpoint's meta.json recorded; None where it recorded none."""
    section, name = key.split(".")
    value = ((saved.get(section) or {}) if isinstance(saved, dict) else {}).get(name)
    return value if isinstance(value, str) else None


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


def _one_line_errors(batches: Iterator[dict[str, torch.Tensor]]) -> Iterator[dict[str, torch.Tensor]]:
    """The batches; a UserError raised in a DataLoader worker (a damaged shard) arrives with the worker's
    traceback in its message, and is re-raised as its own one line."""
    try:
        yield from batches
    except UserError as e:
        lines = str(e).strip().splitlines()
        if len(lines) > 1:
            raise UserError(lines[-1].split("UserError: ", 1)[-1]) from None
        raise


def _log0(info: ddp.DistInfo, msg: str) -> None:
    if info.is_main:
        print(msg, flush=True)
