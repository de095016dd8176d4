"""`bertforge export`: a model directory as a Hugging Face directory or as ONNX.

Both read a Hugging Face-format directory (what `bertforge finetune` writes; BERT or RoBERTa) through
`bertforge.model.hf_interop.load_pretrained`, and copy the tokenizer files beside the result, so the output
is self-contained for `bertforge serve` (HF) or any ONNX runtime.

ONNX: one graph per head with dynamic batch and sequence axes, exported with PyTorch's TorchScript-based
exporter (`dynamo=False`; the dynamo exporter needs onnxscript). Inputs `input_ids`, `attention_mask`,
`token_type_ids` (int64, (batch, sequence)); fill-mask adds `masked_positions` (int64, (batch, masks)).
Outputs: qa `start_logits`, `end_logits` (batch, sequence); classification/regression `logits`
(batch, labels); mlm `logits` (batch, masks, vocab). Every export is checked: onnxruntime must match PyTorch
within `tolerance` (1e-4) on a batch with padding, or the export fails and nothing is written.

A bare encoder (architectures BertModel/RobertaModel, or task "embed") is exported without a head: HF as a
BertModel/RobertaModel directory with sentence-transformers' files (modules.json, 1_Pooling/, ...) kept, ONNX
with one output `last_hidden_state` (batch, sequence, hidden).

Nothing of the user's is replaced by accident (`check_out`): `out` must not exist, be an empty directory, or be
an earlier export of ours (it holds `bertforge_export.json`, written into every export); anything else needs
`force`. The current directory, the model directory and any directory above it are never replaced.
"""

from __future__ import annotations

import json
import shutil
import stat
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bertforge.errors import UserError
from bertforge.runtime.io import atomic_dir

TOKENIZER_FILES = (
    "tokenizer.json",
    "vocab.txt",
    "merges.txt",
    "vocab.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",  # a slow tokenizer's added tokens: without it transformers splits them into word pieces
)

# Hugging Face architecture (config.json "architectures") -> our task head
ARCH_TASKS = {
    "ForQuestionAnswering": "qa",
    "ForSequenceClassification": "classification",
    "ForMaskedLM": "mlm",
    "ForPreTraining": "pretraining",
    "ForTokenClassification": "token_classification",
}

# written into every export: what makes a directory recognisably ours, so a re-export may replace it
MARKER = "bertforge_export.json"

# serving task names (bertforge serve --task) -> model heads; "encoder" is the bare encoder (no head)
SERVE_HEADS = {"qa": "qa", "classify": "classification", "fill-mask": "mlm", "embed": "encoder"}
ENCODER = "encoder"
# config.json architectures of a bare encoder (sentence-transformers models, encoder-only checkpoints)
BARE_ARCHS = {"bert": "BertModel", "roberta": "RobertaModel", "modernbert": "ModernBertModel"}
# a bare encoder's weights in a task model's Hugging Face state dict: the prefix its save_pretrained drops, and the
# modules it keeps
ENCODER_PARTS = {
    "bert": ("bert.", ("embeddings.", "encoder.", "pooler.")),
    "roberta": ("roberta.", ("embeddings.", "encoder.", "pooler.")),
    "modernbert": ("model.", ("embeddings.", "layers.", "final_norm.")),
}
# sentence-transformers' own files: a bare-encoder export keeps them, so the model's pooling travels with it
ST_FILES = ("modules.json", "sentence_bert_config.json", "config_sentence_transformers.json")

# opsets ONNX export takes: torch 2.13's TorchScript exporter writes up to 20 (above it warns it does not support
# them), and our attention needs 11 (measured: 7 fails on arange, 9 and 10 give graphs onnxruntime refuses)
ONNX_OPSETS = range(11, 21)

ONNX_OUTPUTS = {
    "qa": ["start_logits", "end_logits"],
    "classification": ["logits"],
    "regression": ["logits"],
    "token_classification": ["logits"],
    "mlm": ["logits"],
    ENCODER: ["last_hidden_state"],
}


def read_config(model_dir: Path) -> dict[str, Any]:
    """A model directory's config.json as a JSON object (`hf_interop.read_config`: one line when it is missing
    or invalid)."""
    from bertforge.model.hf_interop import read_config as read_hf_config

    return read_hf_config(model_dir)[0]


def detect_head(model_dir: Path) -> str:
    """The model head named by config.json's architectures (e.g. BertForQuestionAnswering -> qa)."""
    from bertforge.model.hf_interop import read_config as read_hf_config

    raw, cfile = read_hf_config(model_dir)  # cfile: config.json, or an NVIDIA checkpoint's bert_config.json
    archs = raw.get("architectures")
    for arch in archs if isinstance(archs, list) else []:
        if arch in BARE_ARCHS.values():
            return ENCODER
        for suffix, head in ARCH_TASKS.items():
            if isinstance(arch, str) and arch.endswith(suffix):
                regression = head == "classification" and is_regression(raw, str(cfile))
                return "regression" if regression else head
    raise UserError(
        f"{cfile} names no task head in 'architectures' ({archs}); pass --task "
        "(qa, classify, fill-mask, or embed for the bare encoder)"
    )


def resolve_head(model_dir: Path, task: str | None) -> str:
    if task is None:
        return detect_head(model_dir)
    return SERVE_HEADS.get(task, task)


def num_labels_of(model_dir: Path) -> int:
    """A classification model's labels: config.json's id2label, else its num_labels (default 2)."""
    return num_labels_from(read_config(model_dir), f"{model_dir}/config.json")


def num_labels_from(raw: dict[str, Any], source: str) -> int:
    id2label, n = raw.get("id2label"), raw.get("num_labels", 2)
    if isinstance(id2label, dict) and id2label:
        return len(id2label)
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise UserError(f"{source}: num_labels {n!r} is not a positive number; fix it or pass another model")
    return n


def problem_type_from(raw: dict[str, Any], source: str) -> str:
    """A sequence-classification config's problem_type (regression, single- or multi-label), as Hugging Face decides
    it (`hf_interop.problem_type_of`): config.json's, else regression for one label, single-label for more."""
    from bertforge.model.hf_interop import problem_type_of

    return problem_type_of(raw.get("problem_type"), num_labels_from(raw, source), source)


def is_regression(raw: dict[str, Any], source: str) -> bool:
    """A sequence-classification config that predicts one number (STS-B), as Hugging Face decides it."""
    return problem_type_from(raw, source) == "regression"


def source_head(model, model_dir: Path) -> tuple[list[str] | None, str | None]:
    """What an exported head keeps of the source's config.json: its label names, and its problem_type (a multi-label
    model stays one) when the head has the source's label count. A head of another count (`--num-labels`, a fresh
    head) or a source without a problem_type gets the default for its count (`hf_interop.problem_type_of`)."""
    from bertforge.model.hf_interop import label_names_of

    raw, source = read_config(model_dir), f"{model_dir}/config.json"
    same_head = raw.get("problem_type") is not None and num_labels_from(raw, source) == model.num_labels
    return label_names_of(raw), problem_type_from(raw, source) if same_head else None


# heads of one kind: a classifier the checkpoint holds for one of them is the head the other would load
_CLASSIFIERS = ({"classification", "regression"}, {"token_classification"})


def check_num_labels(model_dir: Path, head: str, num_labels: int) -> None:
    """`--num-labels` against the classifier the checkpoint already has for `head` (config.json's architectures):
    a head of another label count cannot load its weights, and the loader's shape error would send the user to
    config.json rather than to the flag."""
    kind = next((k for k in _CLASSIFIERS if head in k), None)
    if kind is None:
        return
    try:
        named = detect_head(model_dir)
    except UserError:  # no head named: the loader finds out what the weights hold
        return
    if named not in kind:
        return
    n = num_labels_of(model_dir)
    if n != num_labels:
        raise UserError(
            f"--num-labels {num_labels}: {model_dir} holds a trained head of {n} label(s), which a head of "
            f"{num_labels} cannot load; leave --num-labels out to export that head (for a fresh head of another "
            "count, export the bare encoder with --task embed first, then that with --init-head --num-labels)"
        )


def copy_tokenizer(src: Path, dst: Path) -> list[str]:
    copied = []
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copy2(src / name, dst / name)
            copied.append(name)
    return copied


def copy_sentence_transformers(src: Path, dst: Path) -> None:
    """modules.json, sentence_bert_config.json and the module directories it names (1_Pooling, ...)."""
    for name in ST_FILES:
        if (src / name).is_file():
            shutil.copy2(src / name, dst / name)
    for sub in sorted({str(m.get("path") or "") for m in st_modules(src)} - {""}):
        rel = Path(sub)
        if rel.is_absolute() or ".." in rel.parts:  # dst / sub would be a directory outside the export
            raise UserError(
                f"{src / 'modules.json'}: module path {sub!r} is not inside the model directory; "
                "fix modules.json (sentence-transformers writes names such as 1_Pooling)"
            )
        if rel.parts and (src / rel).is_dir():  # no parts: "." is the model directory itself, exported above
            shutil.copytree(src / rel, dst / rel)


def st_modules(model_dir: Path) -> list[dict[str, Any]]:
    """sentence-transformers' modules.json of a model directory ([] when it has none)."""
    p = Path(model_dir) / "modules.json"
    if not p.is_file():
        return []
    try:
        mods = json.loads(p.read_text(encoding="utf-8"))
    except ValueError as e:
        raise UserError(f"{p}: invalid JSON ({e})") from None
    if not isinstance(mods, list) or not all(isinstance(m, dict) for m in mods):
        raise UserError(f"{p}: expected a list of modules, as sentence-transformers writes")
    return mods


def check_out(model_dir: Path, out: Path, force: bool) -> None:
    """Refuse an `out` whose replacement would destroy something that is not an earlier export of ours."""
    src, dst, cwd = model_dir.resolve(), out.resolve(), Path.cwd().resolve()
    if dst == src or dst in src.parents:
        raise UserError(f"--out {out} would replace the model directory {model_dir} itself; choose another --out")
    if dst == cwd or dst in cwd.parents:
        raise UserError(f"--out {out} is the current directory (or holds it); name a new directory, e.g. --out export")
    kind = _kind(out)
    if kind not in (None, "file", "directory"):  # replacing it would delete a device, FIFO or socket, or a link
        raise UserError(f"--out {out} is a {kind}, which export never replaces (even with --force); name another --out")
    if force or kind is None:
        return
    if kind != "directory":
        raise UserError(f"--out {out} exists and is not a directory; remove it, or pass --force to replace it")
    if any(out.iterdir()) and not (out / MARKER).is_file():
        raise UserError(
            f"--out {out} is a non-empty directory that is not an earlier bertforge export; "
            "choose a new --out, or pass --force to replace it"
        )
    if added := _added_since_export(out):
        more = f" and {len(added) - 1} more" if len(added) > 1 else ""
        raise UserError(
            f"--out {out} is an earlier export that now also holds {added[0]}{more}, which the export did not "
            "write: replacing it would delete them; move them away, choose a new --out, or pass --force"
        )


def _kind(path: Path) -> str | None:
    """What `path` is, without following a symbolic link; None when nothing is there."""
    try:
        mode = path.lstat().st_mode
    except (FileNotFoundError, NotADirectoryError):  # under a file: nothing there (the writer says why not)
        return None
    kinds = [
        (stat.S_ISREG, "file"),
        (stat.S_ISDIR, "directory"),
        (stat.S_ISLNK, "symbolic link"),
        (stat.S_ISFIFO, "named pipe (FIFO)"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
    ]
    return next((name for test, name in kinds if test(mode)), "special file")


def write_marker(tmp: Path, fmt: str, head: str, model_dir: Path) -> None:
    """Last in an export: what it is, and the files it wrote (a re-export replaces those, and nothing added)."""
    files = sorted([*(p.name for p in tmp.iterdir()), MARKER])
    info = {"format": fmt, "task": head, "source": str(model_dir.resolve()), "files": files}
    (tmp / MARKER).write_text(json.dumps(info, indent=1) + "\n", encoding="utf-8")


def _added_since_export(out: Path) -> list[str]:
    """Names in an earlier export that it did not write (files of your own, put there since); [] for an export
    from before the list was recorded."""
    try:
        listed = json.loads((out / MARKER).read_text(encoding="utf-8")).get("files")
    except (OSError, ValueError, AttributeError):
        return []
    if not isinstance(listed, list):
        return []
    return sorted(p.name for p in out.iterdir() if p.name not in listed)


def load(
    model_dir: Path,
    head: str,
    init_head: bool = False,
    seed: int = 0,
    num_labels: int | None = None,
    attention: str = "auto",
):
    """The model of `head` from `model_dir`; head "encoder": the encoder of any checkpoint, its pooler kept.
    A regression model of several outputs (transformers' problem_type regression with num_labels > 1) is built as
    a classifier of that width: the same weights and logits, where our regression head has one output; its
    `model.task` says which head was built (what the export's config.json is written for)."""
    from bertforge.model.hf_interop import load_pretrained

    if head == "regression":
        raw, source = read_config(model_dir), f"{model_dir}/config.json"
        n = num_labels_from(raw, source) if problem_type_from(raw, source) == "regression" else 1
        if n > 1 and num_labels in (None, n):  # the source's head; a fresh regression head has one output
            head, num_labels = "classification", n
    encoder = head == ENCODER
    if encoder:
        # built as a sequence classifier, the one head that keeps the pooler; a classification head in the
        # checkpoint loads (num_labels from config.json), every other head's weights are ignored, and one of
        # another width (a multiple-choice model's one output) starts fresh: no head is exported
        head, num_labels, init_head = "classification", num_labels_of(model_dir), True
    if num_labels is None:
        num_labels = num_labels_of(model_dir) if head in ("classification", "token_classification") else 2
    torch.manual_seed(seed)  # the fresh head of --init-head is reproducible
    model, config = load_pretrained(
        model_dir,
        head,
        num_labels=num_labels,
        attention=attention,
        allow_missing_head=init_head,
        reinit_mismatched_head=encoder,
    )
    return model.eval(), config


def save_encoder(model, config, out: Path, model_dir: Path) -> None:
    """The encoder (and pooler) as a Hugging Face BertModel/RobertaModel/ModernBertModel directory: keys without
    the model prefix, as their `save_pretrained` writes them. RoBERTa's pooler (`roberta.pooler`) is none of our
    model's weights (ours is its classification head's dense layer, NAME_MAP), so it is copied from the source."""
    from safetensors.torch import save_file

    from bertforge.model.hf_interop import _weights_file, hf_state_dict, normalise_keys, ours_to_hf, read_state_dict

    prefix, parts = ENCODER_PARTS[config.model_type]
    keep = tuple(prefix + p for p in parts)
    # a pooler the checkpoint lacks (a BertForMaskedLM's, a QA model's) was `load`'s fresh init: written out, a
    # BertModel would load it without a word and answer pooler_output from random weights; left out, transformers
    # says it is missing, as it does for the source
    info = getattr(model, "hf_load_info", {})
    fresh = {
        ours_to_hf(n, config.model_type, model.task)
        for n in (*info.get("initialised", []), *info.get("reinitialised", []))
    }
    sd = {k[len(prefix) :]: v for k, v in hf_state_dict(model).items() if k.startswith(keep) and k not in fresh}
    if not sd:  # transformers would fill an empty file with random weights, without a word
        raise RuntimeError(f"no {config.model_type} encoder weights under {keep}: the key table is out of date")
    if config.model_type == "roberta":  # else a RobertaModel's pooler_output came back from random weights
        source = normalise_keys(read_state_dict(_weights_file(model_dir)), config.model_type)
        dtype = next(iter(sd.values())).dtype  # ours (fp32), whatever the file holds
        sd.update(
            {k[len(prefix) :]: v.to(dtype).contiguous() for k, v in source.items() if k.startswith(prefix + "pooler.")}
        )
    save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})


def write_config(model, config, head: str, model_dir: Path, out: Path) -> None:
    """The export's config.json, the same for both formats: `head`'s (with the source's label names and
    problem_type, `source_head`), or a bare encoder's (architectures BertModel/RobertaModel)."""
    from bertforge.model.hf_interop import config_to_hf

    if head == ENCODER:
        raw = config_to_hf(config, "qa", 2)  # qa: a head without labels; architectures replaced below
        raw["architectures"] = [BARE_ARCHS[config.model_type]]
    else:  # model.task: the head built (a multi-output regression's is a classifier, `load`)
        raw = config_to_hf(config, model.task, model.num_labels, *source_head(model, model_dir))
    (out / "config.json").write_text(json.dumps(raw, indent=2) + "\n", encoding="utf-8")


def export_hf(
    model_dir: str | Path,
    out: str | Path,
    task: str | None = None,
    init_head: bool = False,
    num_labels: int | None = None,
    seed: int = 0,
    force: bool = False,
) -> Path:
    """Re-write `model_dir` as config.json + model.safetensors + tokenizer files in `out`.

    `init_head`: the task head may be missing from the checkpoint (a pre-trained encoder such as a
    sentence-embedding model) and gets a fresh, seeded init; for smoke tests and serving benchmarks.
    `force`: replace whatever `out` holds (see `check_out`).
    """
    from bertforge.model.hf_interop import save_pretrained

    if num_labels is not None and num_labels < 1:
        raise UserError(f"--num-labels must be at least 1, not {num_labels}")
    model_dir, out = Path(model_dir), Path(out)
    check_out(model_dir, out, force)
    head = resolve_head(model_dir, task)
    if num_labels is not None:
        check_num_labels(model_dir, head, num_labels)
    model, config = load(model_dir, head, init_head, seed, num_labels)
    with atomic_dir(out) as tmp:
        if head == ENCODER:
            save_encoder(model, config, tmp, model_dir)
            copy_sentence_transformers(model_dir, tmp)
            write_config(model, config, head, model_dir, tmp)
        else:  # the source's label names and problem_type kept; model.task: the head `load` built
            save_pretrained(model, config, tmp, model.task, *source_head(model, model_dir))
        copy_tokenizer(model_dir, tmp)
        write_marker(tmp, "hf", head, model_dir)
    return out


class _OnnxWrapper(torch.nn.Module):
    """Positional tensors in, a tuple of tensors out: what torch.onnx.export traces."""

    def __init__(self, model: torch.nn.Module, head: str):
        super().__init__()
        self.model, self.head = model, head

    def forward(self, input_ids, attention_mask, token_type_ids, masked_positions=None):
        if self.head == "mlm":
            out = self.model(input_ids, attention_mask, token_type_ids, masked_positions=masked_positions)
            B, P = masked_positions.shape
            return (out.mlm_logits.view(B, P, -1),)  # (B*P, V) -> (B, P, V)
        if self.head == ENCODER:
            return (self.model.bert(input_ids, attention_mask, token_type_ids),)  # (B, T, H)
        out = self.model(input_ids, attention_mask, token_type_ids)
        return tuple(getattr(out, n) for n in ONNX_OUTPUTS[self.head])


def sample_inputs(config, head: str, batch: int = 3, seq: int = 17, seed: int = 0) -> dict[str, torch.Tensor]:
    """A batch with padding (row i has seq - 3i real tokens) for tracing and for the parity check; `seq` is cut to
    the model's positions (a model of 16 positions failed its export on the 17-token batch with an IndexError)."""
    seq = min(seq, config.usable_positions)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, config.vocab_size, (batch, seq), generator=g)  # (B, T)
    am = torch.ones(batch, seq, dtype=torch.long)
    for i in range(batch):
        am[i, max(2, seq - 3 * i) :] = 0
    ids = ids * am
    tt = torch.zeros(batch, seq, dtype=torch.long)
    tt[:, seq // 2 :] = 1 if config.type_vocab_size > 1 else 0
    tt = tt * am
    x = {"input_ids": ids, "attention_mask": am, "token_type_ids": tt}
    if head == "mlm":
        pos = torch.tensor([[1, 3], [2, 0], [4, 5]][:batch] + [[1, 2]] * max(0, batch - 3))
        x["masked_positions"] = pos % seq  # inside the sequence however short the model's positions are
    return x


def onnx_parity(path: Path, model: torch.nn.Module, head: str, inputs: dict[str, torch.Tensor]) -> float:
    """Largest |onnxruntime - PyTorch| over the outputs on `inputs`."""
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    got = sess.run(None, {k: v.numpy() for k, v in inputs.items() if k in names})
    with torch.inference_mode():
        want = _OnnxWrapper(model, head).eval()(**inputs)
    return max(float(np.abs(g - w.float().numpy()).max()) for g, w in zip(got, want))


def _require_onnx() -> None:
    """onnx (the exporter writes with it) and onnxruntime (the parity check): without them the export failed with
    a traceback, onnxruntime's only after the whole model had been traced."""
    for name in ("onnx", "onnxruntime"):
        try:
            __import__(name)
        except ImportError:
            raise UserError(
                f"--format onnx needs {name}, which is not installed here: pip install -e '.[export]' "
                "(or pip install onnx onnxruntime)"
            ) from None


def export_onnx(
    model_dir: str | Path,
    out: str | Path,
    task: str | None = None,
    opset: int = 17,
    tolerance: float = 1e-4,
    init_head: bool = False,
    seed: int = 0,
    force: bool = False,
) -> dict[str, Any]:
    """Write `out/model.onnx` (+ config.json, tokenizer files); returns {"path", "max_abs_diff"}."""
    if opset not in ONNX_OPSETS:
        raise UserError(f"--opset {opset} is not supported; ONNX export takes {ONNX_OPSETS[0]} to {ONNX_OPSETS[-1]}")
    _require_onnx()
    model_dir, out = Path(model_dir), Path(out)
    check_out(model_dir, out, force)
    head = resolve_head(model_dir, task)
    if head == "pretraining":  # MLM + NSP heads, two outputs no serving task asks for: say which part to take
        raise UserError(
            f"{model_dir} is a pre-training model (MLM + NSP heads), which ONNX export does not take whole; pass "
            "--task fill-mask for its masked-LM head or --task embed for the bare encoder"
        )
    if head not in ONNX_OUTPUTS:
        raise UserError(f"ONNX export supports heads {', '.join(ONNX_OUTPUTS)}, not {head!r}")
    # eager attention: plain matmul/softmax ops that every ONNX runtime has
    model, config = load(model_dir, head, init_head, seed, attention="eager")
    # traced at 17 tokens, checked at 29 too; a model of fewer positions at two lengths it takes
    long = min(29, config.usable_positions)
    x = sample_inputs(config, head, seq=min(17, max(1, long - 1)))
    in_names = list(x)
    out_names = ONNX_OUTPUTS[head]
    axes: dict[str, dict[int, str]] = {
        n: {0: "batch", 1: "sequence"} for n in ("input_ids", "attention_mask", "token_type_ids")
    }
    if head == "mlm":
        axes["masked_positions"] = {0: "batch", 1: "masks"}
        axes["logits"] = {0: "batch", 1: "masks"}
    elif head in ("qa", "token_classification", ENCODER):
        axes.update({n: {0: "batch", 1: "sequence"} for n in out_names})
    else:
        axes["logits"] = {0: "batch"}
    with atomic_dir(out) as tmp:
        path = tmp / "model.onnx"
        with torch.inference_mode(False), torch.no_grad(), warnings.catch_warnings():
            # the tracer warns about math.sqrt(head_dim) becoming a constant: it is one
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            # an eval-mode wrapper: the exporter restores the wrapper's mode recursively afterwards, and a
            # fresh (training-mode) wrapper would switch the model's dropout back on
            torch.onnx.export(
                _OnnxWrapper(model, head).eval(),
                tuple(x.values()),
                str(path),
                input_names=in_names,
                output_names=out_names,
                dynamic_axes=axes,
                opset_version=opset,
                dynamo=False,
            )
        # check on a different shape than the traced one: the axes really are dynamic
        diff = max(
            onnx_parity(path, model, head, x),
            onnx_parity(path, model, head, sample_inputs(config, head, batch=2, seq=long, seed=1)),
        )
        if not diff <= tolerance:
            raise UserError(
                f"ONNX export of {model_dir} differs from PyTorch by {diff:.3g} (> {tolerance}); nothing was written"
            )
        write_config(model, config, head, model_dir, tmp)  # the exported head's, as --format hf writes it
        copy_tokenizer(model_dir, tmp)
        if head == ENCODER:
            copy_sentence_transformers(model_dir, tmp)
        write_marker(tmp, "onnx", head, model_dir)
    return {"path": str(out / "model.onnx"), "max_abs_diff": diff, "head": head}
