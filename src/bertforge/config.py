"""Typed configuration: dataclasses with a docstring per field, YAML presets, `--set` overrides, validation.

A config is a tree of dataclasses. Each stage owns its top-level class (see `CONFIG_KINDS`); sections shared
between stages (the model) live here. A preset is a YAML file under `configs/<kind>/NAME.yaml` and is data
only: every key must name a field, unknown keys are rejected with a did-you-mean suggestion, values are
coerced to the field's type, and every dataclass's `validate()` runs after the tree is built.

    cfg = load_config("pretrain", "demo_tiny_128", ["train.max_steps=50"])
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
import importlib
import inspect
import math
import sys
import textwrap
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeGuard, TypeVar

import yaml

from bertforge.errors import ConfigError, first_line
from bertforge.runtime.io import refuse_empty_paths as refuse_empty_flags
from bertforge.runtime.io import write_text

# kind -> "module:Class"; the module is imported only when that kind is loaded.
CONFIG_KINDS: dict[str, str] = {
    "pretrain": "bertforge.train.config:PretrainConfig",
    "data": "bertforge.data.config:DataPrepConfig",
    "finetune": "bertforge.finetune.config:FinetuneConfig",
}

# Presets ship inside the package (so an installed wheel has them); the repository's top-level `configs/`
# is a link to this folder.
PRESET_DIR = Path(__file__).parent / "configs"


# ----------------------------------------------------------------------------------------------- sections
@dataclasses.dataclass
class ModelConfig:
    """The model's architecture and where its weights come from (runtime choices such as the attention kernel,
    compile and activation checkpointing are in the `train` section)."""

    preset: str = "tiny"
    """Size preset: BERT's tiny, mini, small, medium, base or large, or modernbert-tiny, -base or -large
    (see MODEL_PRESETS)."""
    init_from: str | None = None
    """Hugging Face-format model directory to initialise the weights from (None: random init)."""
    vocab_size: int | None = None
    """Vocabulary size; None takes the size of the data's vocab (or 30522)."""
    max_position_embeddings: int = 512
    """Number of learned position embeddings (the longest sequence the model accepts)."""
    hidden_dropout: float | None = 0.1
    """Dropout on embeddings and sub-layer outputs (None: the checkpoint's own rate, when loading one)."""
    attention_dropout: float | None = 0.1
    """Dropout on attention probabilities (None: the checkpoint's own rate, when loading one)."""
    pad_vocab_multiple: int = 8
    """Round the model's vocab rows up to a multiple of this (30522 -> 30528), as NVIDIA's and MLPerf's BERT
    pre-training does: the vocab projection and the embedding gradient run on tensor-core-aligned shapes. The
    extra rows are no token: the data never holds their ids and `bertforge serve` never predicts them. 1: the
    vocab's own size. A run that starts from a checkpoint (--resume, train.init_checkpoint, model.init_from)
    keeps the checkpoint's rows."""
    global_rope_theta: float | None = None
    """ModernBERT presets: rotary base of the global layers (None: the preset's 160,000; ModernBERT trained its
    1,024-token phase with 10,000 and raised it to 160,000 for the 8,192-token phase)."""

    def validate(self) -> None:
        from bertforge.model.config import MODEL_PRESETS

        if self.preset not in MODEL_PRESETS:
            raise ConfigError(
                f"model.preset: unknown preset {self.preset!r}{_did_you_mean(self.preset, MODEL_PRESETS)}; "
                f"choose one of {', '.join(MODEL_PRESETS)}"
            )
        for name in ("hidden_dropout", "attention_dropout"):
            rate = getattr(self, name)
            if rate is not None and not 0.0 <= rate < 1.0:
                raise ConfigError(f"model.{name} must be in [0, 1), got {rate}")
        modern = MODEL_PRESETS[self.preset].model_type == "modernbert"
        if self.global_rope_theta is not None and not modern and not self.init_from:  # init_from: checked at load
            raise ConfigError(f"model.global_rope_theta applies to the modernbert-* presets, not {self.preset!r}")
        if self.global_rope_theta is not None and not 0 < self.global_rope_theta < math.inf:
            raise ConfigError(
                f"model.global_rope_theta is a rotary base: a finite number > 0, got {self.global_rope_theta}"
            )
        if self.pad_vocab_multiple < 1:
            raise ConfigError(f"model.pad_vocab_multiple must be >= 1 (1: no padding), got {self.pad_vocab_multiple}")
        if self.vocab_size is not None and self.vocab_size < 8:
            raise ConfigError(f"model.vocab_size must be at least 8, got {self.vocab_size}")
        refuse_empty_paths(self, "model.", ["init_from"])
        if self.max_position_embeddings < 1:  # else BertConfig's message, without the key, after the data is opened
            raise ConfigError(
                f"model.max_position_embeddings must be >= 1 (the longest sequence), got {self.max_position_embeddings}"
            )

    def loaded_overrides(self) -> dict[str, float] | None:
        """What replaces a loaded checkpoint's own settings (`model.init_from`): the dropout rates and a ModernBERT's
        global rotary base, where set."""
        theta = {"global_rope_theta": self.global_rope_theta} if self.global_rope_theta is not None else {}
        return {**(self.dropout_overrides() or {}), **theta} or None

    def dropout_overrides(self) -> dict[str, float] | None:
        """The dropout rates to replace in a loaded checkpoint's config (BertConfig fields under their Hugging
        Face names), None where both are None (the checkpoint's own)."""
        return dropout_overrides(self.hidden_dropout, self.attention_dropout)


def refuse_empty_paths(section: Any, prefix: str, keys: Sequence[str]) -> None:
    """Optional path keys set to "" (`--set train.init_checkpoint=$DIR` with DIR unset) are refused: read as unset,
    phase 2 trained from random weights and evaluation was skipped without a word (the command-line flags' rule,
    `runtime.io.refuse_empty_paths`)."""
    refuse_empty_flags(
        ((prefix + k, getattr(section, k)) for k in keys),
        "give it a path, or null (or leave it out) for none",
        ConfigError,
    )


def dropout_overrides(hidden: float | None, attention: float | None) -> dict[str, float] | None:
    """`load_pretrained`'s config_overrides for the rates that are set (None: the checkpoint's own rate)."""
    pairs = {"hidden_dropout_prob": hidden, "attention_probs_dropout_prob": attention}
    return {k: v for k, v in pairs.items() if v is not None} or None


PRECISIONS = ("auto", "fp32", "bf16", "fp16")
ATTENTION_KERNELS = ("auto", "sdpa", "varlen", "eager")
COMPILE_SCOPES = ("model", "layers")


@dataclasses.dataclass
class TrainConfig:
    """The run, shared by pre-training and fine-tuning: batch arithmetic, precision, device, the runtime choices
    applied to the model from outside (kernel, compile, activation checkpointing), logging, checkpoints."""

    output_dir: str = "runs/pretrain"
    """Where checkpoints, metrics.jsonl, summary.json and plots go."""
    max_steps: int = 1000
    """Optimizer updates (the schedule's horizon)."""
    global_batch_size: int = 256
    """Sequences per optimizer update, over all ranks and accumulation steps."""
    micro_batch_size: int = 32
    """Sequences per forward/backward on one device; accumulation = global / (micro x world size)."""
    precision: str = "auto"
    """auto, fp32, bf16 or fp16 (fp16 uses dynamic loss scaling)."""
    device: str = "auto"
    """auto, cpu, cuda[:N], xpu, hpu or mps."""
    seed: int = 12345
    """Seed of initialisation, dropout and data order."""
    log_every: int = 10
    """Log metrics every N optimizer steps."""
    eval_every: int = 200
    """Evaluate every N optimizer steps (and at the end)."""
    attention: str = "auto"
    """Attention kernel: auto (the flash varlen kernel where available, else sdpa), sdpa, varlen or eager (the
    reference). On CUDA, auto runs packed or compiled steps in the segmented layout (fixed shapes, bounds from
    the loader) and other steps unpadded; varlen always unpads."""
    compile: bool | None = None
    """Compile the training step's forward and backward with torch.compile. auto (null, the default): on for
    pre-training on one CUDA device with Triton (`resolve_auto`; 1.16x for BERT-large phase 1 in the H100 loop,
    after 60-125 s of compiling at the first step), off elsewhere (0.86-0.97x in the CPU loop; fine-tuning pads
    each batch to its own length, so its shapes change)."""
    compile_scope: str = "model"
    """What train.compile compiles: model (the whole forward and loss as one graph, and its backward) or layers
    (each encoder layer on its own: one compilation serves every layer of a kind, so compiling takes 3x (BERT-base)
    to 6x (BERT-large) less time, while embeddings, heads and loss run eager; see docs/pretraining.md)."""
    cuda_graphs: bool | None = None
    """With train.compile on CUDA: capture the compiled forward and backward in CUDA graphs (torch.compile's
    "reduce-overhead" mode), so a step is replayed without launching its kernels one by one. Needs the same
    shapes every step: padded rows with train.attention=sdpa, or packed rows; under train.attention=auto the
    segmented layout's bounds take a few sizes, each captured once. With accumulation, the first micro-batch's
    gradients are copied out of the graphs' memory pool once per update (the next replay would overwrite them).
    auto (null, the default): on for pre-training on one CUDA device with the step compiled as one graph, on
    packed rows under train.attention=auto or padded rows under sdpa (the fixed shapes the H100 loop measured:
    1.04-1.12x), without FP8; off elsewhere."""
    compile_autotune: bool = False
    """With train.compile=true: let inductor time Triton matmul kernels, with the pointwise work after them (bias,
    GELU) fused in, against cuBLAS and keep the fastest for each shape (torch.compile's "max-autotune" modes; with
    train.cuda_graphs, "max-autotune", else "max-autotune-no-cudagraphs"). The first step then waits minutes
    longer. Not yet measured on a GPU (docs/pretraining.md); off by default."""
    activation_checkpointing: bool = False
    """Recompute each encoder layer in the backward pass to save activation memory."""
    low_precision_layernorm: bool | None = None
    """Under bf16 or fp16 autocast, run every LayerNorm in that dtype rather than autocast's fp32, so the residual
    stream and its gradients stay 16-bit: less memory traffic per step (MosaicBERT's recipe; runtime.norms). The
    statistics still accumulate in fp32 inside the kernel. No effect in fp32. auto (null, the default): on for
    pre-training in bf16 on one CUDA device with Triton (`resolve_auto`; 1.044x for BERT-large phase 1 in the
    H100 loop, and its 300-step loss curve within 3% of the seed-to-seed band of fp32 norms), off elsewhere."""
    fp8: bool = False
    """FP8 matmuls (torchao float8, tensorwise scaling) in the encoder's linears, on GPUs with FP8 tensor cores
    (H100, Ada); train.precision stays bf16 for the rest. Off by default (see docs/pretraining.md)."""
    fp8_fallback_after: int = 3
    """Leave FP8 for bf16 after this many non-finite steps in a row (each is skipped and counted)."""
    fp8_emulate: bool = False
    """Run FP8's casts in plain PyTorch (tests on machines without FP8 tensor cores; slow, no speed-up)."""
    tensorboard: bool = True
    """Write TensorBoard scalars to output_dir/tensorboard."""
    plot: bool = True
    """Draw PNG curves (loss, accuracy) in output_dir at the end."""
    max_nonfinite_steps: int = 20
    """Stop after this many non-finite steps in a row."""
    ddp_timeout: float = 1800.0
    """Seconds a rank waits for the others in a collective before the run fails (torchrun runs; Hugging Face's
    `ddp_timeout`): raise it when one rank works alone for longer, e.g. fine-tuning's evaluation of a large
    dev set on rank 0 while the others wait."""

    def validate(self) -> None:
        for name in (
            "global_batch_size",
            "micro_batch_size",
            "log_every",
            "eval_every",
            "max_nonfinite_steps",
            "fp8_fallback_after",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(f"train.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_steps < 0:
            raise ConfigError(f"train.max_steps must be >= 0, got {self.max_steps}")
        if not 1 <= self.ddp_timeout <= 7 * 86400:  # NaN fails too; more than a week is a hang, not a wait
            raise ConfigError(f"train.ddp_timeout is seconds between 1 and 604800 (a week), got {self.ddp_timeout}")
        if self.seed < 0:  # numpy's generators (the data order) take no negative seed
            raise ConfigError(f"train.seed must be >= 0, got {self.seed}")
        if not str(self.output_dir).strip():  # "" is the working directory: the run's files would land there
            raise ConfigError("train.output_dir is empty: name the run's directory, e.g. runs/my_run")
        if self.precision not in PRECISIONS:
            raise ConfigError(f"train.precision must be {', '.join(PRECISIONS)}, not {self.precision!r}")
        if self.attention not in ATTENTION_KERNELS:
            raise ConfigError(f"train.attention must be {', '.join(ATTENTION_KERNELS)}, not {self.attention!r}")
        if self.compile_scope not in COMPILE_SCOPES:
            raise ConfigError(f"train.compile_scope must be {' or '.join(COMPILE_SCOPES)}, not {self.compile_scope!r}")
        if self.compile_scope != "model" and self.compile is not True:
            raise ConfigError(
                f"train.compile_scope={self.compile_scope} says what train.compile compiles: set train.compile=true"
            )
        if self.cuda_graphs and self.compile is not True:
            raise ConfigError("train.cuda_graphs captures the compiled step: set train.compile=true as well")
        if self.compile_autotune and self.compile is not True:
            raise ConfigError(
                "train.compile_autotune tunes the compiled step's kernels: set train.compile=true as well"
            )
        if self.cuda_graphs and self.device not in ("auto", "cuda") and not self.device.startswith("cuda:"):
            raise ConfigError(f"train.cuda_graphs needs a CUDA device; train.device is {self.device!r}")
        if self.cuda_graphs and self.attention == "varlen":
            raise ConfigError(
                "train.cuda_graphs replays the same shapes every step, and train.attention=varlen unpads each batch "
                "to its own token count (a graph recorded per count): use train.attention=auto (fixed-shape "
                "segments on the same flash kernel) or sdpa"
            )
        if self.fp8 and self.attention == "varlen":
            raise ConfigError(
                "train.fp8's matmuls need token counts in multiples of 16, and unpadding (train.attention=varlen) "
                "gives any count: use train.attention=auto (FP8 steps then keep every token) or sdpa"
            )
        if self.low_precision_layernorm and self.precision == "fp32":
            raise ConfigError(
                "train.low_precision_layernorm runs LayerNorm in the autocast dtype, and train.precision=fp32 has "
                "none: use train.precision=bf16 (or auto on a GPU), or set train.low_precision_layernorm=false"
            )
        if self.fp8_emulate and not self.fp8:  # emulation alone converts no layer: the run was plain bf16 or fp32
            raise ConfigError(
                "train.fp8_emulate runs train.fp8's casts in plain PyTorch; train.fp8 is false, so it would be "
                "ignored: set train.fp8=true as well, or leave train.fp8_emulate out"
            )
        if self.fp8 and self.precision not in ("auto", "bf16"):
            raise ConfigError(f"train.fp8 runs the other ops in bf16; set train.precision=bf16, not {self.precision}")
        if self.global_batch_size % self.micro_batch_size:
            raise ConfigError(
                f"train.global_batch_size {self.global_batch_size} is not a multiple of train.micro_batch_size "
                f"{self.micro_batch_size}; change one of them"
            )


@dataclasses.dataclass
class OptimConfig:
    """Optimizer and learning-rate schedule (NVIDIA's pre-training recipe by default)."""

    name: str = "lamb"
    """lamb (NVLAMB semantics) or adamw."""
    lr: float = 6e-3
    """Peak learning rate."""
    warmup: float = 0.2843
    """Fraction of the steps spent warming up."""
    schedule: str = "poly"
    """poly (NVIDIA PolyWarmUp, degree 0.5), linear (Hugging Face's: linear warmup, linear decay) or wsd
    (warmup-stable-decay, trapezoidal: the peak held until the last optim.decay of the steps)."""
    decay: float = 0.1
    """schedule wsd: fraction of the steps in the final decay to 0 (warmup + decay <= 1)."""
    decay_shape: str = "linear"
    """schedule wsd: shape of the final decay, linear or 1-sqrt (Hägele et al. 2024; ModernBERT)."""
    weight_decay: float = 0.01
    """Decoupled weight decay (0 for bias and LayerNorm parameters)."""
    beta1: float = 0.9
    """First-moment decay."""
    beta2: float = 0.999
    """Second-moment decay."""
    eps: float = 1e-6
    """Denominator epsilon."""
    max_grad_norm: float = 1.0
    """Clip the global gradient norm to this (0: no clipping)."""
    compile: bool | None = None
    """lamb only: compile its update with torch.compile, which fuses its dozen passes over the parameters,
    moments and gradients into a few kernels (compiled once, at the first step). adamw runs torch's fused
    kernel already. auto (null, the default): on for LAMB in pre-training on one CUDA device, off elsewhere."""

    def validate(self) -> None:
        if self.name not in ("lamb", "adamw"):
            raise ConfigError(f"optim.name must be lamb or adamw, not {self.name!r}")
        if self.compile and self.name != "lamb":
            raise ConfigError(
                f"optim.compile compiles LAMB's update; optim.name is {self.name!r} (torch's own AdamW, already "
                "fused): set optim.compile=false"
            )
        from bertforge.optim.schedule import DECAY_SHAPES, SCHEDULES

        if self.schedule not in SCHEDULES:
            raise ConfigError(f"optim.schedule must be {' or '.join(SCHEDULES)}, not {self.schedule!r}")
        if not 0.0 <= self.warmup < 1.0:
            raise ConfigError(f"optim.warmup is a fraction of the steps in [0, 1), got {self.warmup}")
        if self.decay_shape not in DECAY_SHAPES:
            raise ConfigError(f"optim.decay_shape must be {' or '.join(DECAY_SHAPES)}, not {self.decay_shape!r}")
        if self.schedule != "wsd" and (self.decay, self.decay_shape) != (OptimConfig.decay, OptimConfig.decay_shape):
            raise ConfigError(
                f"optim.decay and optim.decay_shape shape the wsd schedule's final decay; optim.schedule is "
                f"{self.schedule!r}, which would ignore them: set optim.schedule=wsd or leave them out"
            )
        if self.schedule == "wsd" and not (0.0 <= self.decay <= 1.0 and self.warmup + self.decay <= 1.0):
            raise ConfigError(
                f"optim.decay {self.decay} with optim.warmup {self.warmup}: the decay is a fraction of the "
                "steps in [0, 1] and warmup + decay must be <= 1; lower one of them"
            )
        if not 0 < self.lr < math.inf:  # NaN fails too: it would train one step and save NaN weights
            raise ConfigError(f"optim.lr must be a finite number > 0, got {self.lr}")
        for key in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, key) < 1.0:
                raise ConfigError(f"optim.{key} is a moment's decay in [0, 1), got {getattr(self, key)}")
        if not 0 < self.eps < math.inf:
            raise ConfigError(f"optim.eps must be a finite number > 0, got {self.eps}")
        if not 0 <= self.weight_decay < math.inf:
            raise ConfigError(f"optim.weight_decay must be a finite number >= 0, got {self.weight_decay}")
        if not 0 <= self.max_grad_norm < math.inf:
            raise ConfigError(f"optim.max_grad_norm must be >= 0 (0: no clipping), got {self.max_grad_norm}")


_Train = TypeVar("_Train", bound=TrainConfig)  # pre-training's or fine-tuning's sections
_Optim = TypeVar("_Optim", bound=OptimConfig)


def resolve_auto(
    train: _Train, optim: _Optim, fast: bool, packed: bool, precision: str = "fp32"
) -> tuple[_Train, _Optim]:
    """`train.compile`, `train.cuda_graphs`, `train.low_precision_layernorm` and `optim.compile` left at auto
    (None) made true or false for a run, before anything reads them: on where the H100 loop measured a win
    (docs/pretraining.md), which `fast` says (pre-training on one CUDA device that can compile), off elsewhere and
    for the model under activation checkpointing; CUDA graphs only where every step has the same shapes (`packed`
    shards' rows, or padded rows under sdpa; not rows packed on the fly by data.pack_per_row, whose number varies
    from batch to batch); bf16 LayerNorms only in the run's resolved `precision` bf16 (fp16 was not measured).
    What a user set stays as set."""
    model_fast = fast and not train.activation_checkpointing  # recompute under compile: not measured on a GPU
    compile = model_fast if train.compile is None else train.compile
    graphs = train.cuda_graphs
    if graphs is None:
        fixed = train.attention == "sdpa" or (train.attention == "auto" and packed)
        graphs = model_fast and compile and fixed and train.compile_scope == "model" and not train.fp8
    opt = fast and optim.name == "lamb" if optim.compile is None else optim.compile
    norms = train.low_precision_layernorm
    norms = fast and precision == "bf16" if norms is None else norms
    train = dataclasses.replace(train, compile=compile, cuda_graphs=graphs, low_precision_layernorm=norms)
    return train, dataclasses.replace(optim, compile=opt)


def compile_mode(train: TrainConfig) -> bool | str:
    """`TrainStep.build`'s compile argument: off, inductor's default mode, with CUDA graphs, or autotuned (with
    or without CUDA graphs: `train.compile_autotune`)."""
    if train.compile and train.compile_autotune:
        return "max-autotune" if train.cuda_graphs else "max-autotune-no-cudagraphs"
    return "reduce-overhead" if train.cuda_graphs else bool(train.compile)


def step_kind(train: TrainConfig, optim: OptimConfig) -> str:
    """How the run's step executes, for its start-up line: "eager", or what is compiled and captured."""
    parts = [
        f"compiled ({train.compile_scope} scope{', autotuned' if train.compile_autotune else ''})"
        if train.compile
        else "eager",
        "CUDA graphs" if train.cuda_graphs else "",
        "LAMB compiled" if optim.compile else "",
        "bf16 LayerNorms" if train.low_precision_layernorm else "",  # the autocast dtype's (fp16 where set so)
    ]
    return ", ".join(p for p in parts if p)


def compile_notice(train: TrainConfig) -> str | None:
    """The line a compiled run prints before its first step, which waits a minute or more for the compile."""
    if not train.compile:
        return None
    hint = " (train.compile_scope=layers compiles 3-6x sooner)" if train.compile_scope == "model" else ""
    return f"compiling the step ({train.compile_scope} scope): the first step waits for it{hint}"


def compile_keys(train: TrainConfig, optim: OptimConfig) -> list[str]:
    """The settings of a run that ask for torch.compile (checked for its toolchain before the run starts)."""
    asked = (
        ("train.compile", train.compile),
        ("train.cuda_graphs", train.cuda_graphs),
        ("train.compile_autotune", train.compile_autotune),
        ("optim.compile", optim.compile),
    )
    return [k for k, on in asked if on]


# ------------------------------------------------------------------------------------------- machinery
def _did_you_mean(name: str, choices: Sequence[str] | Mapping[str, Any]) -> str:
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """The docstring written under each field of a dataclass (read from its source, base classes first)."""
    docs: dict[str, str] = {}
    for base in reversed(cls.__mro__[:-1]):
        docs.update(_own_field_docs(base))
    return docs


def _own_field_docs(cls: type) -> dict[str, str]:
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return {}
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for node, nxt in zip(body, body[1:]):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            docs[node.target.id] = inspect.cleandoc(nxt.value.value)
    return docs


def config_class(kind: str) -> type:
    if kind not in CONFIG_KINDS:
        raise ConfigError(f"unknown config kind {kind!r}{_did_you_mean(kind, CONFIG_KINDS)}")
    module, _, name = CONFIG_KINDS[kind].partition(":")
    return getattr(importlib.import_module(module), name)


def list_presets(kind: str) -> list[str]:
    return sorted(p.stem for p in (PRESET_DIR / kind).glob("*.yaml"))


def find_preset(kind: str, name_or_path: str | Path) -> Path:
    """`NAME` finds configs/<kind>/NAME.yaml; anything that exists as a file is read as a path."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    preset = PRESET_DIR / kind / f"{name_or_path}.yaml"
    if preset.is_file():  # before the directory check: `--config demo` beside a folder named demo is the preset
        return preset
    if path.is_dir():
        raise ConfigError(f"config {name_or_path} is a directory; pass a YAML file or a preset name")
    if path.suffix in (".yaml", ".yml") or "/" in str(name_or_path):
        raise ConfigError(f"config file {name_or_path} does not exist")
    names = list_presets(kind)
    raise ConfigError(
        f"no {kind} preset named {str(name_or_path)!r}{_did_you_mean(str(name_or_path), names)}; "
        f"presets: {', '.join(names) or '(none)'}; or pass a path to a YAML file"
    )


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key given twice in one mapping (PyYAML keeps the last silently: a second
    `train:` block dropped the first one's settings)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *anchor`: merged keys may be overridden, as YAML means them to be
            key = self.construct_object(key_node, deep=True)
            try:
                again = key in seen
            except TypeError:
                continue  # an unhashable key: PyYAML's own error names it below
            if again:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} is given twice (line {key_node.start_mark.line + 1})", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep)


def read_yaml(path: Path, what: str, fix: str) -> Any:
    """A YAML file's data (None for an empty one), or a ConfigError naming `what` (e.g. "config file x.yaml"):
    not YAML, a key given twice, not text, unreadable; `fix` says what to do about a file that is not YAML."""
    try:
        return yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)  # noqa: S506 (a safe loader)
    except yaml.YAMLError as e:
        raise ConfigError(f"{what} is not valid YAML: {first_line(e)}; {fix}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{what} is not text (byte {e.start} is not UTF-8); {fix}") from None
    except IsADirectoryError:
        raise ConfigError(f"{what} is a directory; pass a YAML file") from None
    except OSError as e:
        raise ConfigError(f"{what} cannot be read ({e.strerror}); check its permissions") from None


def _strip_optional(tp: Any) -> tuple[Any, bool]:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0], len(args) != len(typing.get_args(tp))
    return tp, False


def _is_section(tp: Any) -> TypeGuard[type]:
    """A field type that is a nested config class (a dataclass class, never an instance)."""
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


_KINDS = {bool: "a yes/no", int: "an int", float: "a float"}


def _coerce(value: Any, tp: Any, key: str) -> Any:
    tp, optional = _strip_optional(tp)
    if optional and tp is bool and isinstance(value, str) and value.lower() == "auto":
        return None  # a switch whose default is decided at the run's start (`resolve_auto`)
    if value is None or (optional and isinstance(value, str) and value.lower() in ("none", "null", "~")):
        if optional:
            return None
        raise ConfigError(f"{key}: a value is required (got null)")
    if _is_section(tp):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}: expected a mapping of {tp.__name__} fields, got {value!r}")
        return _build(tp, value, key + ".")
    origin = typing.get_origin(tp)
    try:
        if tp is bool:
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in ("true", "yes", "on", "1", "false", "no", "off", "0"):
                return value.lower() in ("true", "yes", "on", "1")
            if isinstance(value, int) and value in (0, 1):
                return bool(value)
            raise ValueError
        if tp is int:
            if isinstance(value, bool):
                raise ValueError
            if isinstance(value, float) and not value.is_integer():
                raise ValueError
            return int(value)
        if tp is float:
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        if tp is str:
            if isinstance(value, (dict, list)):
                raise ValueError
            if not isinstance(value, str):  # YAML's reading of unquoted text: 0755 -> 493, 1.10 -> 1.1, on -> True
                raise ConfigError(
                    f"{key}: YAML reads {value!r} as {_KINDS.get(type(value), 'a value')}, not as text; quote it "
                    "to keep it as written"
                )
            return value
        if origin in (list, tuple):
            (item_tp, *rest) = typing.get_args(tp) or (Any,)
            if isinstance(value, str):
                value = [v.strip() for v in value.split(",") if v.strip()]
            if not isinstance(value, (list, tuple)):
                raise ValueError
            if origin is tuple and rest and rest[0] is not Ellipsis:
                items = [_coerce(v, t, key) for v, t in zip(value, typing.get_args(tp), strict=True)]
            else:
                items = [_coerce(v, item_tp, key) for v in value]
            return origin(items)
        if origin is dict or tp is dict:
            if not isinstance(value, Mapping):
                raise ValueError
            return dict(value)
        if tp is Any:
            return value
    except ConfigError:
        raise
    except (ValueError, TypeError):
        name = getattr(tp, "__name__", str(tp))
        raise ConfigError(f"{key}: expected {name}, got {value!r}") from None
    return value


def _build(cls: type, data: Mapping[str, Any], prefix: str = "") -> Any:
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    hints = typing.get_type_hints(cls)
    for key in data:
        if key not in fields:
            raise ConfigError(
                f"unknown config key '{prefix}{key}'{_did_you_mean(str(key), fields)}; "
                f"valid keys here: {', '.join(fields)}"
            )
    kwargs = {name: _coerce(data[name], hints[name], prefix + name) for name in fields if name in data}
    return cls(**kwargs)


def _set_path(data: dict[str, Any], cls: type, dotted: str, raw: str) -> None:
    """Put one `a.b.c=value` override into the raw dict, checking every key against the dataclasses."""
    parts = dotted.split(".")
    node, node_cls, prefix = data, cls, ""
    for i, part in enumerate(parts):
        fields = {f.name: f for f in dataclasses.fields(node_cls)}
        if part not in fields:
            raise ConfigError(
                f"--set {dotted}: unknown key '{prefix + part}'{_did_you_mean(part, fields)}; "
                f"valid keys here: {', '.join(fields)}"
            )
        tp, _ = _strip_optional(typing.get_type_hints(node_cls)[part])
        if i == len(parts) - 1:
            if _is_section(tp):
                raise ConfigError(f"--set {dotted}: {prefix + part!r} is a section; set one of its keys")
            node[part] = _override_value(dotted, raw, tp)
            return
        if not _is_section(tp):
            raise ConfigError(f"--set {dotted}: {prefix + part!r} is a value, not a section")
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"--set {dotted}: {prefix + part!r} is not a mapping in the config file")
        node_cls, prefix = tp, prefix + part + "."


def _override_value(dotted: str, raw: str, tp: Any) -> Any:
    """An override's value: a text field takes the text as written (YAML would turn 0123 into 83 and cut at a
    #), unless quoted; any other field reads it as YAML (numbers, bools, lists, null)."""
    text = raw.strip()
    quoted = len(text) > 1 and text[0] == text[-1] and text[0] in "'\""
    if tp is str and not quoted:
        return None if text in ("null", "Null", "NULL", "~") else text  # null: the field's own check (required?)
    if not text:
        return ""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as e:
        if tp is str:
            return text  # 'a' and 'b': quotes inside the text, not around it
        raise ConfigError(f"--set {dotted}: {text!r} is not a YAML value ({first_line(e)}); quote it") from None
    return value if tp is not str or isinstance(value, str) else text


def validate_tree(obj: Any) -> None:
    """Run `validate()` on every nested dataclass, innermost first, then on `obj` itself."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            validate_tree(value)
    if hasattr(obj, "validate"):
        obj.validate()


def renamed_keys(cls: type) -> dict[str, tuple[str, ...]]:
    """A config class's table of old dotted keys -> new ones (`RENAMED`), for configs written before a move. A
    value is one new key or a tuple of them (one old key that now sets several, e.g. fine-tuning's `dropout`)."""
    return {old: (new,) if isinstance(new, str) else tuple(new) for old, new in getattr(cls, "RENAMED", {}).items()}


def _move_renamed(data: dict[str, Any], cls: type, where: str) -> None:
    """Move every old key of `data` to its new place, saying so once per key (old files keep working)."""
    for old, news in renamed_keys(cls).items():
        *path, leaf = old.split(".")
        node: Any = data
        for part in path:
            node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict) or leaf not in node:
            continue
        value = node.pop(leaf)
        for new in news:
            *new_path, new_leaf = new.split(".")
            target = data
            for i, part in enumerate(new_path):
                target = target.setdefault(part, {})
                if not isinstance(target, dict):  # `optim:` left empty (null) or a scalar: no key can go into it
                    raise ConfigError(
                        f"{old} (old name) is now {new}, and {'.'.join(new_path[: i + 1])} in the config file is "
                        f"{target!r}, not a mapping of keys: give it keys or leave it out"
                    )
            if new_leaf in target:  # load_config's message adds the file's name
                raise ConfigError(f"both {old} (old name) and {new} are set; keep {new}")
            target[new_leaf] = value
        print(
            f"bertforge: config key {old} is now {' and '.join(news)}{f' ({where})' if where else ''}; "
            "please rename it",
            file=sys.stderr,
        )


def build_config(
    cls: type, data: Mapping[str, Any] | None = None, overrides: Sequence[str] = (), where: str = ""
) -> Any:
    """Build and validate a config of class `cls` from a raw mapping plus `key=value` overrides."""
    data = _deep_copy(data or {})
    _move_renamed(data, cls, where)
    moved = renamed_keys(cls)
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set expects section.key=value, got {item!r}")
        key = key.strip()
        if key in moved:
            print(
                f"bertforge: --set {key} is now {' and '.join(f'--set {k}' for k in moved[key])}; please use "
                "the new name",
                file=sys.stderr,
            )
        for new in moved.get(key, (key,)):
            _set_path(data, cls, new, raw)
    cfg = _build(cls, data)
    validate_tree(cfg)
    return cfg


def load_config(kind: str, name_or_path: str | Path | None = None, overrides: Sequence[str] = ()) -> Any:
    """Load preset NAME (or a YAML file) of the given kind, apply overrides, validate."""
    cls = config_class(kind)
    data: dict[str, Any] = {}
    if name_or_path is not None:
        path = find_preset(kind, name_or_path)
        data = read_yaml(path, f"config file {path}", "pass a YAML file or a preset name")
        if data is None:  # a truncated or unsaved file, most likely: every default would run in its place
            raise ConfigError(
                f"config file {path} is empty (no settings, or only comments): give its settings, or leave --config "
                "out to run the defaults"
            )
        if not isinstance(data, dict):
            raise ConfigError(f"config file {path} must hold a mapping of sections, not {type(data).__name__}")
    try:
        return build_config(cls, data, overrides, where=str(name_or_path or ""))
    except ConfigError as e:
        where = f" (in {name_or_path})" if name_or_path is not None else ""
        raise ConfigError(f"{e}{where}") from None


def to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def save_config(cfg: Any, path: str | Path) -> None:
    write_text(path, yaml.safe_dump(to_dict(cfg), sort_keys=False))  # atomic (DESIGN §6)


def _deep_copy(data: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _deep_copy(v) if isinstance(v, Mapping) else v for k, v in data.items()}


def describe(cls: type, prefix: str = "") -> list[tuple[str, str, str]]:
    """(key, default, docstring) for every leaf field of a config class: the text of `--help`'s key list."""
    rows = []
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    for f in dataclasses.fields(cls):
        tp, _ = _strip_optional(hints[f.name])
        if _is_section(tp):
            rows += describe(tp, prefix + f.name + ".")
        else:
            default: Any = ""
            if f.default is not dataclasses.MISSING:
                default = f.default
            elif f.default_factory is not dataclasses.MISSING:
                default = f.default_factory()
            shown = "auto" if default is None and tp is bool else repr(default)  # decided at start (resolve_auto)
            rows.append((prefix + f.name, shown, docs.get(f.name, "")))
    return rows
