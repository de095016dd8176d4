"""Hugging Face checkpoint interop (DESIGN §3.7): load BERT / RoBERTa / ModernBERT directories, save directories
that `transformers`' Auto classes load with identical outputs.

One declarative name map (`NAME_MAP`): per model type, (our prefix, Hugging Face prefix, tasks) rows. Inside
encoder layers the only renaming is the fused QKV projection (`attention.qkv` <-> `attention.self.{query,key,
value}`). Rules, all errors naming the key:
- a checkpoint key that no row maps is an error (never silently skipped);
- a mapped key that belongs to another task's head (e.g. NSP weights when loading for QA) is ignored, as
  `transformers` does, and listed in `model.hf_load_info["ignored"]`;
- a missing encoder key is an error; a missing head key is an error unless `allow_missing_head=True`
  (starting a fine-tuning head from a pre-trained encoder), then it keeps its fresh init and is listed in
  `model.hf_load_info["initialised"]`;
- every shape is checked; a head weight of another shape (a head fine-tuned for another label count) keeps its
  fresh init when `reinit_mismatched_head=True` (`transformers`' `ignore_mismatched_sizes`), listed in
  `model.hf_load_info["reinitialised"]`.

Checkpoint variants handled: `model.safetensors`, `pytorch_model.bin` (torch.load(weights_only=True)), either
sharded (`model.safetensors.index.json`, `pytorch_model.bin.index.json`), NVIDIA DeepLearningExamples / Habana
checkpoints (`{"model": state_dict}` in a `.pt`/`.bin`, keys prefixed `module.` or `model.`, TF-era
`gamma`/`beta` LayerNorm names, the vocab padded to a multiple of 8: 30522 -> 30528, in which case the model
keeps the padded rows), encoder-only checkpoints without the `bert.` prefix (`BertModel`, e.g.
sentence-transformers' all-MiniLM-L6-v2), and a config.json without `model_type` (the type its `architectures`
names, else BERT).

ModernBERT (`ModernBertModel`, `...ForMaskedLM`, `...ForSequenceClassification`, `...ForQuestionAnswering`,
`...ForTokenClassification`): our encoder modules carry its names, so its rows are prefix renames
(`model.` <-> `bert.`); its config.json spells some fields differently (`MODERN_RENAMES`) and gives the layer
pattern and rotary bases as `layer_types` / `rope_parameters` (older files: `global_attn_every_n_layers`,
`global_rope_theta`, `local_rope_theta`; both are read and both are written).

A sequence-classification head's `problem_type` (what its scores mean: `PROBLEM_TYPES`) is head metadata like its
label names, not architecture: it is no BertConfig field; `config_to_hf` takes it beside the label names (a
re-export keeps the source's) and defaults it from the label count as `transformers` does (`problem_type_of`).
"""

from __future__ import annotations

import json
import os
import pickle
import re
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from bertforge.errors import ConfigError, UserError, first_line
from bertforge.model.activations import ACTIVATIONS
from bertforge.model.bert import BertForTask, build_model
from bertforge.model.config import MODEL_TYPES, BertConfig
from bertforge.model.heads import TASK_HEADS
from bertforge.runtime import distributed as ddp
from bertforge.runtime.io import atomic_dir, read_json_object

_SEQ = ("classification", "regression")
_CLS = ("classification", "regression", "token_classification")

# (our prefix, Hugging Face prefix, tasks this row applies to (None = all)); first match wins, so more
# specific Hugging Face prefixes come first.
NAME_MAP: dict[str, list[tuple[str, str, tuple[str, ...] | None]]] = {
    "bert": [
        ("bert.embeddings.", "bert.embeddings.", None),
        ("bert.encoder.", "bert.encoder.", None),
        ("bert.pooler.", "bert.pooler.", None),
        ("cls.predictions.transform.", "cls.predictions.transform.", None),
        ("cls.predictions.bias", "cls.predictions.bias", None),
        ("cls.seq_relationship.", "cls.seq_relationship.", None),
        ("qa_outputs.", "qa_outputs.", None),
        ("classifier.", "classifier.", None),
    ],
    "roberta": [
        ("bert.embeddings.", "roberta.embeddings.", None),
        ("bert.encoder.", "roberta.encoder.", None),
        # RobertaClassificationHead is dense -> tanh -> out_proj on <s>: BERT's pooler + classifier
        ("bert.pooler.dense.", "classifier.dense.", _SEQ),
        ("classifier.", "classifier.out_proj.", _SEQ),
        ("classifier.", "classifier.", ("token_classification",)),
        ("cls.predictions.transform.dense.", "lm_head.dense.", None),
        ("cls.predictions.transform.LayerNorm.", "lm_head.layer_norm.", None),
        ("cls.predictions.bias", "lm_head.bias", None),
        ("qa_outputs.", "qa_outputs.", None),
    ],
    # ModernBERT's modules carry Hugging Face's names inside the encoder; every task head of it starts with the
    # prediction head `head` (dense, norm), which is our MLM `transform` or the `head` inside the task's module
    "modernbert": [
        ("bert.embeddings.", "model.embeddings.", None),
        ("bert.encoder.layer.", "model.layers.", None),
        ("bert.final_norm.", "model.final_norm.", None),
        ("cls.predictions.transform.dense.", "head.dense.", ("mlm",)),
        ("cls.predictions.transform.LayerNorm.", "head.norm.", ("mlm",)),
        ("cls.predictions.bias", "decoder.bias", ("mlm",)),  # saving only: loading takes it as the tied decoder's
        ("qa_outputs.head.dense.", "head.dense.", ("qa",)),
        ("qa_outputs.head.LayerNorm.", "head.norm.", ("qa",)),
        ("qa_outputs.", "classifier.", ("qa",)),
        ("classifier.head.dense.", "head.dense.", _CLS),
        ("classifier.head.LayerNorm.", "head.norm.", _CLS),
        ("classifier.", "classifier.", _CLS),
    ],
}
# Keys that are known and carry nothing to load: tied copies (checked), buffers, RoBERTa's unused pooler.
TIED_DECODER = {"bert": "cls.predictions.decoder.", "roberta": "lm_head.decoder.", "modernbert": "decoder."}
# Hugging Face's word-embedding key per model type (after `normalise_keys`)
WORD_KEY = {
    "bert": "bert.embeddings.word_embeddings.weight",
    "roberta": "roberta.embeddings.word_embeddings.weight",
    "modernbert": "model.embeddings.tok_embeddings.weight",
}
BASE_PREFIX = {"bert": "bert.", "roberta": "roberta.", "modernbert": "model."}
# the encoder's own top-level modules, prefixed with BASE_PREFIX in checkpoints saved from the bare encoder
_BARE = ("embeddings.", "encoder.", "pooler.", "layers.", "final_norm.")
BUFFERS = re.compile(r"\.(position_ids|token_type_ids)$")  # non-persistent in new transformers, saved by old
# every weight of every task's head (and of the pooler), as `transformers` names it: one of another task's is
# ignored when the model being loaded has no such module; any other name is an error (an unknown key inside a head
# module, e.g. `cls.predictions.extra.weight`, is not another task's head)
OTHER_HEADS = {
    "bert": re.compile(
        r"^((bert\.pooler\.dense|cls\.predictions\.transform\.(dense|LayerNorm)|cls\.seq_relationship|qa_outputs"
        r"|classifier)\.(weight|bias)|cls\.predictions\.bias)$"
    ),
    "roberta": re.compile(
        r"^((roberta\.pooler\.dense|classifier(\.dense|\.out_proj)?|lm_head\.(dense|layer_norm)|qa_outputs)"
        r"\.(weight|bias)|lm_head\.bias)$"
    ),
    "modernbert": re.compile(r"^(head\.(dense|norm)|classifier)\.(weight|bias)$"),
}
_QKV = re.compile(r"^(.*\.layer\.\d+\.attention\.)self\.(query|key|value)\.(weight|bias)$")
_OUR_QKV = re.compile(r"^(.*\.layer\.\d+\.attention\.)qkv\.(weight|bias)$")
_ENCODER = ("bert.embeddings.", "bert.encoder.", "bert.final_norm.")
# ModernBERT config.json names of BertConfig fields (the rest are spelled alike, embedding_dropout and
# classifier_dropout among them: HF's four dropout rates are four fields here).
MODERN_RENAMES = {
    "hidden_act": "hidden_activation",
    "layer_norm_eps": "norm_eps",
    "hidden_dropout_prob": "mlp_dropout",
    "attention_probs_dropout_prob": "attention_dropout",
}


# transformers' ModernBertConfig defaults (ModernBERT-base's shape) of the BertConfig fields whose own defaults
# differ: what transformers builds from a config.json that leaves them out. Not a preset's values: a preset may
# differ from transformers' default (classifier_pooling), and a checkpoint that names none pools as transformers
# does. The BertConfig defaults of the other ModernBERT fields are already transformers'.
HF_MODERN_DEFAULTS: dict[str, Any] = {
    "vocab_size": 50368,
    "hidden_size": 768,
    "intermediate_size": 1152,
    "num_hidden_layers": 22,
    "num_attention_heads": 12,
    "max_position_embeddings": 8192,
    "layer_norm_eps": 1e-5,
    "hidden_dropout_prob": 0.0,
    "attention_probs_dropout_prob": 0.0,
    "pad_token_id": 50283,
    "classifier_pooling": "cls",
    # None in BertConfig (follow hidden_dropout_prob, as BERT does); transformers' ModernBERT has no such rule
    "embedding_dropout": 0.0,
    "classifier_dropout": 0.0,
}


# ------------------------------------------------------------------------------------------- config
def config_from_hf(raw: dict[str, Any], source: str = "config.json") -> BertConfig:
    """A Hugging Face config dict -> BertConfig (unknown keys are ignored; unsupported variants are errors)."""
    model_type = raw.get("model_type") or _type_of_architectures(raw.get("architectures"), source)
    if model_type not in MODEL_TYPES:
        raise UserError(
            f"{source}: model_type {model_type!r} is not supported; bertforge loads {', '.join(MODEL_TYPES)}"
        )
    if model_type == "modernbert":
        raw = _modern_from_hf(raw, source)
    if raw.get("position_embedding_type", "absolute") != "absolute":
        raise UserError(
            f"{source}: position_embedding_type {raw['position_embedding_type']!r} is not supported (only absolute)"
        )
    for key in ("hidden_act", "classifier_activation"):
        if raw.get(key, "gelu") not in ACTIVATIONS:
            raise UserError(f"{source}: {key} {raw[key]!r} is not supported; one of {', '.join(ACTIVATIONS)}")
    fields = BertConfig.__dataclass_fields__
    kw = {k: raw[k] for k in fields if k in raw and raw[k] is not None}
    kw["model_type"] = model_type
    if model_type == "roberta":  # HF RobertaConfig's defaults where config.json leaves a field out (its eps is
        # BERT's 1e-12, as ours: RoBERTa's published 1e-5 is always written; assuming it loaded another model)
        kw = {"pad_token_id": 1, "vocab_size": 50265, **kw}
    if model_type == "modernbert":  # HF ModernBertConfig's defaults where config.json leaves a field out
        kw = {**HF_MODERN_DEFAULTS, **kw}
    try:
        return BertConfig(**_typed(kw, source))
    except ConfigError as e:
        raise UserError(f"{source}: {e}") from None


# Hugging Face class-name prefixes of the model types we load (RobertaForMaskedLM, ModernBertModel, BertLMHeadModel)
_ARCH_TYPES = (("ModernBert", "modernbert"), ("Roberta", "roberta"), ("Bert", "bert"))


def _type_of_architectures(archs: Any, source: str) -> str:
    """The model type of a config.json without `model_type` (Google's bert_config.json, older converters): the one
    its `architectures` names (RobertaForMaskedLM: roberta), else BERT. An architecture of another family
    (DistilBertForMaskedLM, AlbertModel) is refused by name rather than read as BERT."""
    arch = next((a for a in archs if isinstance(a, str)), None) if isinstance(archs, list) else None
    if arch is None:
        return "bert"
    for prefix, model_type in _ARCH_TYPES:
        if arch.startswith(prefix):
            return model_type
    raise UserError(
        f"{source}: has no model_type and its architectures name {arch!r}, which is not a model bertforge loads "
        f"({', '.join(MODEL_TYPES)})"
    )


def _typed(kw: dict[str, Any], source: str) -> dict[str, Any]:
    """`kw` checked against the types of BertConfig's defaults (ints may stand for floats): a hand-edited
    config.json's `"vocab_size": "x"` is one line naming the field, not a TypeError from a comparison."""
    fields = BertConfig.__dataclass_fields__
    for key, value in kw.items():
        want = type(fields[key].default)
        if want not in (bool, int, float, str):
            continue  # no plain default to go by
        if want in (int, float):  # bool is an int to Python, never a size or a rate here
            ok = isinstance(value, int if want is int else (int, float)) and not isinstance(value, bool)
        else:
            ok = type(value) is want
        if not ok:
            raise UserError(f"{source}: {key} must be {'a number' if want is float else want.__name__}, not {value!r}")
    return kw


def _modern_from_hf(raw: dict[str, Any], source: str) -> dict[str, Any]:
    """ModernBertConfig keys -> BertConfig's: renamed fields, the layer pattern and the two rotary bases,
    from either the current format (layer_types, rope_parameters) or the original one (global_attn_every_n_layers,
    global_rope_theta, local_rope_theta)."""
    # transformers reads these fields under its own names only: BERT's spellings in the file (older converters
    # wrote layer_norm_eps beside norm_eps) are ignored as it ignores them, else they could win over its names or
    # defaults. load_pretrained's config_overrides, given under our names, are applied after this.
    out = {k: v for k, v in raw.items() if k not in MODERN_RENAMES}
    out.update({ours: raw[hf] for ours, hf in MODERN_RENAMES.items() if hf in raw})
    if "initializer_cutoff_factor" in raw and raw["initializer_cutoff_factor"] is None:
        out["initializer_cutoff_factor"] = 3.0  # what ModernBertPreTrainedModel._init_weights cuts at for None
    types = raw.get("layer_types")
    if types:
        n = next((i for i, t in enumerate(types) if i and t == "full_attention"), len(types))
        expected = ["sliding_attention" if i % n else "full_attention" for i in range(len(types))]
        if list(types) != expected:
            raise UserError(f"{source}: layer_types {types} is not a global layer every N layers; not supported")
        out["global_attn_every_n_layers"] = n
    rope = raw.get("rope_parameters") or {}
    for kind, field in (("full_attention", "global_rope_theta"), ("sliding_attention", "local_rope_theta")):
        params = rope.get(kind) or {}
        if params.get("rope_type", "default") != "default":
            raise UserError(f"{source}: rope_type {params['rope_type']!r} is not supported (only default rope)")
        if "rope_theta" in params:
            out[field] = params["rope_theta"]
    return out


# what a weight's first dimension is set by, for a shape mismatch's advice (first match)
_SHAPE_HINTS = (
    ("position_embeddings", "the checkpoint has {n} positions: set model.max_position_embeddings to {n} (a phase 2 "
     "at a longer sequence needs a phase 1 built with that many positions)"),
    ("word_embeddings", "the checkpoint has {n} tokens: set model.vocab_size (or data.vocab) to the vocab it was "
     "trained with"),
    ("tok_embeddings", "the checkpoint has {n} tokens: set model.vocab_size (or data.vocab) to the vocab it was "
     "trained with"),
    ("token_type_embeddings", "the checkpoint has {n} token types: check type_vocab_size in its config.json"),
)  # fmt: skip


def _shape_hint(name: str, n: int) -> str:
    for key, hint in _SHAPE_HINTS:
        if key in name:
            return hint.format(n=n)
    return "check config.json (a head's size comes from num_labels)"


def label_names_of(raw: dict[str, Any]) -> list[str] | None:
    """A Hugging Face config's label names in id order (its id2label), or None when it has none."""
    id2label = raw.get("id2label") or {}
    try:
        return [str(id2label[k]) for k in sorted(id2label, key=int)] or None
    except (TypeError, ValueError):  # keys that are not ids: nothing we can order
        return None


PROBLEM_TYPES = ("regression", "single_label_classification", "multi_label_classification")
"""config.json's problem_type of a sequence classifier, as `transformers` reads it for the loss (MSE, cross-entropy,
binary cross-entropy per label) and its text-classification pipeline's scores (none, softmax, sigmoid per label)."""


def problem_type_of(given: Any, num_labels: int, source: str = "config.json") -> str:
    """A sequence classifier's problem_type: `given` (config.json's), or when it is absent what `transformers`
    infers for it with class-id labels (BertForSequenceClassification.forward): regression for one label,
    single-label classification for more."""
    if given is None:
        return "regression" if num_labels == 1 else "single_label_classification"
    if given not in PROBLEM_TYPES:
        raise UserError(f"{source}: problem_type {given!r} is not one of {', '.join(PROBLEM_TYPES)}")
    return given


def config_to_hf(
    config: BertConfig,
    task: str,
    num_labels: int,
    label_names: Sequence[str] | None = None,
    problem_type: str | None = None,
) -> dict[str, Any]:
    """config.json for `task`; `label_names` (one per label) name the labels, else LABEL_0, LABEL_1, ...;
    `problem_type` (classification): the head's, e.g. a multi-label source's, else `problem_type_of`'s default."""
    spec = TASK_HEADS[task]
    out: dict[str, Any] = {
        "architectures": [spec.hf_class(config.model_type)],
        **config.to_dict(),
        "tie_word_embeddings": True,
    }
    if config.model_type == "modernbert":
        for key in (*MODERN_RENAMES, "type_vocab_size"):  # written under ModernBertConfig's names, or unused
            out.pop(key)
        out.update(_modern_to_hf(config))
    else:
        out["position_embedding_type"] = "absolute"
    if config.model_type == "roberta":
        out.update(bos_token_id=0, eos_token_id=2)
    if task in ("classification", "regression", "token_classification"):
        n = spec.fixed_labels or num_labels
        names = list(label_names) if label_names and len(label_names) == n else [f"LABEL_{i}" for i in range(n)]
        out["id2label"] = {str(i): name for i, name in enumerate(names)}
        out["label2id"] = {name: i for i, name in enumerate(names)}
        if task in _SEQ:  # a regression head predicts one number whatever the source said
            out["problem_type"] = "regression" if task == "regression" else problem_type_of(problem_type, n)
    return out


def _modern_to_hf(config: BertConfig) -> dict[str, Any]:
    """ModernBertConfig spellings (both the current layer_types/rope_parameters and the original keys, so
    transformers versions from 4.48 on read it); the special-token ids belong to the tokenizer, not to us."""
    out = {hf: getattr(config, ours) for ours, hf in MODERN_RENAMES.items()}
    rope = {"full_attention": config.global_rope_theta, "sliding_attention": config.local_rope_theta}
    out.update(
        # transformers' ModernBERT reads no null rate: the rates in use are written
        embedding_dropout=config.embedding_dropout_rate,
        classifier_dropout=config.classifier_dropout_rate,
        layer_types=config.layer_types,
        rope_parameters={k: {"rope_type": "default", "rope_theta": v} for k, v in rope.items()},
        bos_token_id=None,
        eos_token_id=None,
        cls_token_id=None,
        sep_token_id=None,
    )
    return out


# ------------------------------------------------------------------------------------------- reading
UNTRUSTED_FIX = "use a model.safetensors file, or a checkpoint written by bertforge"
"""What to do with a torch pickle that weights_only refuses (the generic advice of `read_state_dict`)."""


def load_weights_only(path: Path, fix: str, map_location: str | torch.device = "cpu") -> Any:
    """`torch.load(path, weights_only=True)`: tensors and plain data, never code (DESIGN §6). A file it refuses or
    cannot read is one line naming it, with `fix` (what to do in the caller's context) — never torch's advice
    to retry with weights_only=False, which would run whatever an untrusted file holds."""
    try:
        with warnings.catch_warnings():  # a foreign pickle's protocol: noise before the one line below
            warnings.filterwarnings("ignore", "Detected pickle protocol", UserWarning)
            return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError:  # the weights-only unpickler's refusal (a global it may not call), or garbage
        raise UserError(
            f"{path} could not be loaded safely: it is not a plain tensor checkpoint (it is damaged, or holds "
            f"Python objects that loading would have to execute); {fix}"
        ) from None
    except Exception as e:  # noqa: BLE001 - a truncated zip, a read error: the file's problem, said in one line
        raise UserError(f"{path} cannot be read ({type(e).__name__}: {first_line(e)}); {fix}") from None


def read_state_dict(path: Path, fix: str = UNTRUSTED_FIX) -> dict[str, torch.Tensor]:
    """Tensors of a checkpoint file: safetensors, or a torch pickle read with weights_only (never runs code), or
    the shards a `*.index.json` names (`transformers`' sharded checkpoints); `fix`: the advice of the one-line
    error when a pickle is refused."""
    if path.name.endswith(".index.json"):
        return _read_shards(path, fix)
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        try:
            return load_file(str(path))
        except Exception as e:  # noqa: BLE001 - truncated or garbage: the file's problem, said in one line
            # a caller's own advice (a resumed checkpoint's: delete it to resume from the one before) wins
            advice = "restore or re-create it (an earlier checkpoint, or `bertforge export` again)"
            raise UserError(
                f"{path}: not a readable safetensors file ({first_line(e)}); it is truncated or damaged: "
                f"{advice if fix == UNTRUSTED_FIX else fix}"
            ) from None
    obj = load_weights_only(path, fix)
    if isinstance(obj, dict) and isinstance(obj.get("model"), dict):  # NVIDIA DeepLearningExamples .pt
        obj = obj["model"]
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise UserError(f"{path}: not a state dict of tensors")
    return dict(obj)


def _read_shards(index: Path, fix: str) -> dict[str, torch.Tensor]:
    """The tensors of a sharded checkpoint: its index's weight_map (key -> shard file beside the index); every key
    it names must be in its shard, and a shard must hold no key the index gives to another."""
    weight_map = read_json_object(index, "restore it from the model's source").get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map or not all(isinstance(f, str) for f in weight_map.values()):
        raise UserError(f"{index}: no weight_map of key -> shard file; restore it from the model's source")
    out: dict[str, torch.Tensor] = {}
    for shard in sorted(set(weight_map.values())):
        file = index.parent / shard
        # a name outside the directory, or another index (a loop), is never read
        if Path(shard).name != shard or shard.endswith(".index.json") or not file.is_file():
            raise UserError(f"{index}: shard {shard!r} is missing from {index.parent}; download the complete model")
        for key, value in read_state_dict(file, fix).items():
            if weight_map.get(key) != shard:
                raise UserError(f"{file}: key {key!r} is not listed for this shard in {index.name}")
            out[key] = value
    if missing := sorted(set(weight_map) - set(out)):
        raise UserError(f"{index}: key {missing[0]!r} is not in its shard {weight_map[missing[0]]}")
    return out


def _weights_file(path: Path) -> Path:
    names = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
    for name in names:
        if (path / name).is_file():
            return path / name
    pts = sorted(path.glob("*.pt"))
    if len(pts) == 1:
        return pts[0]
    raise UserError(
        f"{path}: no model.safetensors or pytorch_model.bin (or their sharded *.index.json, or a single .pt NVIDIA "
        "checkpoint) found"
    )


def normalise_keys(sd: dict[str, torch.Tensor], model_type: str) -> dict[str, torch.Tensor]:
    """Strip DDP/wrapper prefixes, rename TF-era gamma/beta, prefix bare encoder keys with bert./roberta."""
    out = {}
    base = BASE_PREFIX[model_type]
    for key, value in sd.items():
        k = key
        while k.startswith(("module.", "model.", "_orig_mod.")):  # ModernBERT's own model. comes back below
            k = k.split(".", 1)[1]
        k = re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", k)
        k = re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", k)
        if k.startswith(_BARE):
            k = base + k
        if k in out:
            raise UserError(f"checkpoint key {key!r} collides with another key after normalisation ({k!r})")
        out[k] = value
    return out


def hf_to_ours(key: str, model_type: str, task: str) -> str | None:
    """Our name for a (normalised) Hugging Face key, or None when no row of NAME_MAP covers it."""
    m = _QKV.match(key)
    if m:  # one third of the fused projection; the caller joins q, k, v
        key = f"{m[1]}qkv.{m[3]}"
    for ours, hf, tasks in NAME_MAP[model_type]:
        if (tasks is None or task in tasks) and key.startswith(hf):
            return ours + key[len(hf) :]
    return None


def ours_to_hf(key: str, model_type: str, task: str) -> str:
    for ours, hf, tasks in NAME_MAP[model_type]:
        if (tasks is None or task in tasks) and key.startswith(ours):
            return hf + key[len(ours) :]
    raise UserError(f"parameter {key!r} has no Hugging Face name for a {model_type} {task} model")


# ------------------------------------------------------------------------------------------- loading
def read_config(model_dir: str | os.PathLike) -> tuple[dict[str, Any], Path]:
    """A model directory's config.json (NVIDIA DeepLearningExamples names it bert_config.json, Google's name;
    same fields) as a JSON object, and its path. Every reader of it goes through here: a missing, invalid or
    non-object file is one line naming it."""
    model_dir = Path(model_dir)
    cfile = next((model_dir / n for n in ("config.json", "bert_config.json") if (model_dir / n).is_file()), None)
    if cfile is None:
        raise UserError(f"{model_dir}: not a Hugging Face model directory (no config.json or bert_config.json)")
    return read_json_object(cfile, "restore the model's config.json or pass another model directory"), cfile


def load_pretrained(
    path: str | os.PathLike,
    task: str,
    num_labels: int = 2,
    attention: str = "auto",
    *,
    allow_missing_head: bool = False,
    reinit_mismatched_head: bool = False,
    config_overrides: dict[str, Any] | None = None,
) -> tuple[BertForTask, BertConfig]:
    """Build `task`'s model from a Hugging Face-format directory (config.json + weights).

    `allow_missing_head`: heads (and the pooler) absent from the checkpoint keep their fresh init (fine-tuning
    from a pre-trained encoder); encoder weights must always be present. `reinit_mismatched_head`: so do head
    weights of another shape (fine-tuning a model fine-tuned for another label count). `config_overrides`:
    BertConfig fields to replace (dropout rates for fine-tuning, a ModernBERT's global rotary base), through
    `BertConfig.replace`: a hidden_dropout_prob also sets a ModernBERT's embedding rate (unless embedding_dropout is
    given too); classifier_dropout stays the file's (a null follows the hidden rate, as in transformers).
    """
    path = Path(path)
    raw, cfile = read_config(path)
    config = config_from_hf({**raw, **(config_overrides or {})}, str(cfile))
    if config_overrides:  # ours win over any spelling in the file (a ModernBERT's rope_parameters included);
        # `replace` owns the rule of which rates a hidden_dropout_prob sets
        config = config.replace(**config_overrides)
    wfile = _weights_file(path)
    sd = normalise_keys(read_state_dict(wfile), config.model_type)
    rows = _word_rows(sd, config.model_type, wfile)
    if rows is not None and rows != config.vocab_size:
        # NVIDIA/Habana pad the vocab to a multiple of 8 (30522 -> 30528); keep the padded rows
        if rows > config.vocab_size and rows % 8 == 0 and rows - config.vocab_size < 8:
            config = config.replace(vocab_size=rows)
        else:
            raise UserError(
                f"{wfile}: word embeddings have {rows} rows but config.json says vocab_size {config.vocab_size}"
            )
    model = build_model(config, task, num_labels, attention)
    load_hf_state_dict(model, sd, allow_missing_head, str(wfile), reinit_mismatched_head)
    return model, config


def _word_rows(sd, model_type, source) -> int | None:
    key = WORD_KEY[model_type]
    return sd[key].shape[0] if key in sd else None


def load_hf_state_dict(
    model: BertForTask,
    sd: dict[str, torch.Tensor],
    allow_missing_head: bool = False,
    source: str = "checkpoint",
    reinit_mismatched_head: bool = False,
) -> None:
    """Copy a normalised Hugging Face state dict into `model` following NAME_MAP (rules in the module doc)."""
    mt, task = model.config.model_type, model.task
    ours = model.state_dict()
    modules = dict(model.named_modules())
    loaded: dict[str, torch.Tensor] = {}
    qkv_parts: dict[str, dict[str, torch.Tensor]] = {}
    ignored, tied = [], {}
    has_mlm = any(k.startswith("cls.predictions.") for k in ours)
    for key, value in sd.items():
        if key.startswith(TIED_DECODER[mt]):
            if not has_mlm:  # another task's head, as transformers ignores it: whether it is tied is not ours to
                # check (an untied masked-LM checkpoint still starts a classifier or gives its encoder)
                ignored.append(key)
                continue
            tied[key[len(TIED_DECODER[mt]) :]] = value
            continue
        if BUFFERS.search(key):
            ignored.append(key)
            continue
        name = hf_to_ours(key, mt, task)
        if name is None or name not in ours:
            if OTHER_HEADS[mt].match(key) and (name is None or name.rsplit(".", 1)[0] not in modules):
                ignored.append(key)  # another task's head, or RoBERTa's unused pooler
                continue
            what = "has no counterpart in bertforge's model" if name else "is not in the name map"
            raise UserError(f"{source}: key {key!r} {what} (model_type {mt}, task {task})")
        m = _QKV.match(key)
        if m:
            qkv_parts.setdefault(name, {})[m[2]] = value
            continue
        loaded[name] = value
    for name, parts in qkv_parts.items():
        if set(parts) != {"query", "key", "value"}:
            missing = sorted({"query", "key", "value"} - set(parts))
            raise UserError(f"{source}: {name} is missing its {', '.join(missing)} part(s)")
        loaded[name] = torch.cat([parts["query"], parts["key"], parts["value"]], dim=0)  # (3H, H) / (3H,)
    _take_tied_decoder(loaded, tied, "cls.predictions.bias" in ours, hf_to_ours(WORD_KEY[mt], mt, task) or "", source)
    reinitialised = []
    for name, value in list(loaded.items()):
        if tuple(value.shape) == tuple(ours[name].shape):
            continue
        if not reinit_mismatched_head or name.startswith(_ENCODER):
            hint = _shape_hint(name, value.shape[0])
            if task == "regression" and name.startswith("classifier."):  # transformers' num_labels > 1 regression
                hint = (
                    f"the checkpoint's regression head has {value.shape[0]} outputs and task regression has one: "
                    f"load it as task classification with num_labels={value.shape[0]} (the same weights)"
                )
            raise UserError(
                f"{source}: {name} has shape {tuple(value.shape)}, the model expects {tuple(ours[name].shape)}; {hint}"
            )
        reinitialised.append(name)
        del loaded[name]
    reinitialised = [k for k in ours if k in reinitialised]  # the model's order, as `missing`
    missing = [k for k in ours if k not in loaded and k not in reinitialised]
    enc_missing = [k for k in missing if k.startswith(_ENCODER)]
    if enc_missing:
        raise UserError(
            f"{source}: encoder weight(s) missing from the checkpoint: {', '.join(enc_missing[:5])}"
            + (" ..." if len(enc_missing) > 5 else "")
        )
    if missing and not allow_missing_head:
        raise UserError(
            f"{source}: head weight(s) missing for task {task}: {', '.join(missing)}; the checkpoint has no such "
            "head: fine-tune one (bertforge finetune), or start it untrained (bertforge export --init-head; "
            "in Python: allow_missing_head=True)"
        )
    with torch.no_grad():
        for name, value in loaded.items():
            ours[name].copy_(value.to(ours[name].dtype))
    model.hf_load_info = {"ignored": ignored, "initialised": missing, "reinitialised": reinitialised}


def _take_tied_decoder(
    loaded: dict[str, torch.Tensor], tied: dict[str, torch.Tensor], has_bias: bool, word_name: str, source: str
) -> None:
    """The checkpoint's MLM decoder (`tied`): its weight must be the word embeddings (bertforge ties them, as BERT
    does); its own bias is the one transformers' forward adds. A file holding both it and another
    `cls.predictions.bias` / `lm_head.bias` (tie_word_embeddings false, or two values) is not tied there, so the
    other is unused: taking it gave other logits than transformers' without a word."""
    word = loaded.get(word_name)
    if "weight" in tied and word is not None and not torch.equal(tied["weight"], word):
        raise UserError(
            f"{source}: the MLM decoder weight differs from the word embeddings; bertforge ties "
            "them (as BERT does) and cannot load an untied decoder"
        )
    if "bias" in tied and has_bias:
        loaded["cls.predictions.bias"] = tied["bias"]


# ------------------------------------------------------------------------------------------- saving
def hf_state_dict(model: BertForTask) -> dict[str, torch.Tensor]:
    """Our weights under Hugging Face names, QKV split; the tied decoder is left to `transformers` to tie."""
    mt, task = model.config.model_type, model.task
    out = {}
    for name, value in model.state_dict().items():
        value = value.detach().cpu().contiguous()
        m = _OUR_QKV.match(name)
        if m:
            hf_prefix = ours_to_hf(m[1], mt, task)
            for part, chunk in zip(("query", "key", "value"), value.chunk(3, dim=0)):
                out[f"{hf_prefix}self.{part}.{m[2]}"] = chunk.clone()
            continue
        out[ours_to_hf(name, mt, task)] = value
    return out


def save_pretrained(
    model: torch.nn.Module,
    config: BertConfig,
    path: str | os.PathLike,
    task: str | None = None,
    label_names: Sequence[str] | None = None,
    problem_type: str | None = None,
) -> Path:
    """Write config.json + model.safetensors that `transformers` Auto classes load; atomic (temp dir + rename).
    `label_names`: the labels' names (classification heads), written as id2label/label2id. `problem_type`: a
    sequence classifier's (`config_to_hf`); None: as transformers infers it from the label count."""
    from safetensors.torch import save_file

    model = ddp.unwrap(model)  # the plain model under torch.compile / DDP wrappers
    if not isinstance(model, BertForTask):
        raise UserError(f"save_pretrained: {type(model).__name__} is not a bertforge model (BertForTask)")
    task = task or model.task
    if task != model.task:
        raise UserError(f"save_pretrained: the model was built for task {model.task!r}, not {task!r}")
    spec = TASK_HEADS[task]
    if spec.hf_class(config.model_type) is None:
        raise UserError(
            f"transformers has no {config.model_type} class for task {task!r} (no NSP head); save task mlm instead"
        )
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_dir(path) as tmp:  # an older save is swapped out only once this one is complete
        save_file(hf_state_dict(model), str(tmp / "model.safetensors"), metadata={"format": "pt"})
        raw = config_to_hf(config, task, model.num_labels, label_names, problem_type)
        (tmp / "config.json").write_text(json.dumps(raw, indent=2) + "\n", encoding="utf-8")
    return path
