"""What each served task does with strings: validate, tokenise, run the model, postprocess.

`Predictor` is plain Python + torch, independent of Triton: the Triton functions in `server.py` call it, and
the tests call it in-process to check the server's answers. Every batch is padded to its own longest row, not
to `max_seq_len`. Invalid input raises `RequestError` whose message names the input, the row and the fix.

The table `TASKS` names, for each task, the Triton model name, the model head and the documented inputs and
outputs (docs/serving.md describes the same table).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bertforge import device as dev
from bertforge.data.vocab import load_tokenizer, vocab_rows  # noqa: F401 (load_tokenizer: callers import it here)
from bertforge.errors import UserError
from bertforge.runtime.io import read_json_object


class RequestError(ValueError):
    """A request the server refuses; the message is sent back to the client as it is."""


@dataclasses.dataclass(frozen=True)
class IOSpec:
    name: str
    dtype: str
    """Triton datatype: BYTES (UTF-8 strings), FP32, INT64."""
    shape: tuple[int, ...]
    """Per-row shape (the batch dimension is implied); -1 is variable."""
    doc: str
    optional: bool = False


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    model_name: str
    """Triton model name."""
    head: str
    """Task name for `bertforge.model.hf_interop.load_pretrained`."""
    inputs: tuple[IOSpec, ...]
    outputs: tuple[IOSpec, ...]


TASKS: dict[str, TaskSpec] = {
    "qa": TaskSpec(
        "qa",
        "qa",
        inputs=(
            IOSpec("question", "BYTES", (1,), "the question (UTF-8); longer than max_query_length tokens is cut"),
            IOSpec("context", "BYTES", (1,), "the passage to answer from (UTF-8); long passages are windowed"),
        ),
        outputs=(
            IOSpec("answer", "BYTES", (1,), "the answer text, a span of the context"),
            IOSpec("score", "FP32", (1,), "start + end logit of the best span"),
        ),
    ),
    "classify": TaskSpec(
        "classify",
        "classification",
        inputs=(
            IOSpec("text", "BYTES", (1,), "the sentence (UTF-8)"),
            IOSpec("text_pair", "BYTES", (1,), "optional second sentence of a pair task", optional=True),
        ),
        outputs=(
            IOSpec("label", "BYTES", (1,), "the predicted (highest-scoring) label's name (config.json id2label)"),
            IOSpec("label_id", "INT64", (1,), "the predicted label's index"),
            IOSpec(
                "probabilities",
                "FP32",
                (-1,),
                "softmax over the labels (a multi-label model: each label's own sigmoid), in label-id order",
            ),
        ),
    ),
    "fill-mask": TaskSpec(
        "fill_mask",
        "mlm",
        inputs=(IOSpec("text", "BYTES", (1,), "text with one or more [MASK] tokens (UTF-8)"),),
        outputs=(
            IOSpec(
                "tokens",
                "BYTES",
                (-1, -1),
                "per [MASK] (in order) the top-k tokens; rows of a request "
                "with fewer masks than its longest row are padded with empty strings",
            ),
            IOSpec("token_ids", "INT64", (-1, -1), "the top-k token ids (padding: -1)"),
            IOSpec("scores", "FP32", (-1, -1), "their softmax probabilities (padding: 0)"),
        ),
    ),
    "embed": TaskSpec(
        "embed",
        "encoder",
        inputs=(IOSpec("text", "BYTES", (1,), "the sentence (UTF-8); cut to max_seq_len tokens"),),
        outputs=(IOSpec("embedding", "FP32", (-1,), "the sentence vector: pooled tokens, L2-normalised"),),
    ),
}

REGRESSION_OUTPUTS = (
    IOSpec("score", "FP32", (1,), "the model's prediction as it is (a regression model, e.g. STS-B similarity)"),
)
"""`classify`'s outputs for a regression model (config.json problem_type regression, or one label): a softmax over
its one output would be 1.0 for every row, so it answers the raw value, as Hugging Face's pipeline does
(function_to_apply "none")."""

POOLINGS = ("mean", "cls")
"""How `embed` pools the encoder's tokens into one vector: mean over the real tokens, or the [CLS] token."""


@dataclasses.dataclass
class Limits:
    """Bounds on what one request may ask for (all configurable on `bertforge serve`)."""

    max_seq_len: int = 384
    """Tokens per model row: QA windows and classification inputs are cut to it; fill-mask text over it is refused."""
    max_request_bytes: int = 65536
    """UTF-8 bytes of all strings of one request together; a larger request is refused."""
    max_query_length: int = 64
    """QA: question tokens kept (SQuAD: 64)."""
    doc_stride: int = 128
    """QA: tokens between the starts of consecutive context windows."""
    max_answer_length: int = 30
    """QA: longest answer in tokens (SQuAD: 30)."""
    n_best_size: int = 20
    """QA: start/end candidates considered per window (SQuAD: 20)."""
    top_k: int = 5
    """fill-mask: candidates returned per [MASK]."""

    def __post_init__(self) -> None:
        check_bounds(self, LIMIT_BOUNDS)


# (name in errors, lowest, highest) of each Limits field; a doc_stride of 0 never leaves the first QA window
LIMIT_BOUNDS: dict[str, tuple[str, int, int | None]] = {
    "max_seq_len": ("--max-seq-len", 8, None),
    "max_request_bytes": ("--max-request-bytes", 1, None),
    "max_query_length": ("Limits.max_query_length", 1, None),
    "doc_stride": ("--doc-stride", 1, None),
    "max_answer_length": ("Limits.max_answer_length", 1, None),
    "n_best_size": ("Limits.n_best_size", 1, None),
    "top_k": ("--top-k", 1, None),
}


def check_bounds(config: Any, bounds: dict[str, tuple[str, int, int | None]]) -> None:
    """Each field of `bounds` of the dataclass `config` within its (lowest, highest), or a UserError naming it (by
    its command-line flag where it has one)."""
    for field, (name, low, high) in bounds.items():
        value = getattr(config, field)
        if value < low:
            raise UserError(f"{name} must be at least {low}, not {value}")
        if high is not None and value > high:
            raise UserError(f"{name} must be between {low} and {high}, not {value}")


def decode_strings(name: str, arr: Any, *, allow_empty: bool = False) -> list[str]:
    """Rows of a BYTES input (shape (B,) or (B, 1)) as strings; refuses non-UTF-8 and empty rows."""
    a = np.asarray(arr, dtype=object)
    if a.ndim == 2 and a.shape[1] == 1:
        a = a[:, 0]
    if a.ndim != 1:
        raise RequestError(f"input {name!r} must have shape [batch, 1], got {list(np.shape(arr))}")
    out = []
    for i, v in enumerate(a):
        if isinstance(v, str):
            s = v
        else:
            try:
                s = bytes(v).decode("utf-8")
            except UnicodeDecodeError as e:
                raise RequestError(
                    f"input {name!r} row {i} is not valid UTF-8 ({e.reason} at byte {e.start}); send UTF-8 text"
                ) from None
            except TypeError:
                raise RequestError(f"input {name!r} row {i} is not a string") from None
        if not allow_empty and not s.strip():
            raise RequestError(f"input {name!r} row {i} is empty; send non-empty text")
        out.append(s)
    return out


def check_request_bytes(texts: dict[str, list[str]], limit: int) -> None:
    total = sum(len(s.encode("utf-8")) for rows in texts.values() for s in rows)
    if total > limit:
        raise RequestError(
            f"request holds {total} bytes of text, over the server's limit of {limit} "
            "(bertforge serve --max-request-bytes); send shorter text or fewer rows"
        )


def _special(tok, *names: str) -> int:
    for n in names:
        i = tok.token_to_id(n)
        if i is not None:
            return int(i)
    raise UserError(f"the tokenizer has none of the special tokens {names}")


def read_pooling(model_dir: str | Path, chosen: str | None = None) -> tuple[str | None, int | None]:
    """A sentence-transformers directory's pooling ("mean" or "cls", from modules.json's Pooling module config)
    and its max_seq_length (sentence_bert_config.json); None for what it lacks. `chosen` (--pooling) wins over
    the config, and an unsupported config is an error only without it."""
    from bertforge.serve.export import st_modules

    model_dir = Path(model_dir)
    pooling, max_len = None, None
    for m in st_modules(model_dir):
        if not str(m.get("type", "")).endswith("Pooling"):
            continue
        p = model_dir / m.get("path", "") / "config.json"
        cfg = read_json_object(p, "restore the model's pooling config or pass --pooling") if p.is_file() else {}
        modes = [k[len("pooling_mode_") :] for k, v in cfg.items() if k.startswith("pooling_mode_") and v is True]
        named = {"mean_tokens": "mean", "cls_token": "cls"}
        if chosen is None and (len(modes) != 1 or modes[0] not in named):
            raise UserError(
                f"{p}: pooling {modes or 'none'} is not supported (mean_tokens or cls_token); "
                "pass --pooling mean or --pooling cls to choose one"
            )
        pooling = chosen or named[modes[0]]
    sb = model_dir / "sentence_bert_config.json"
    if sb.is_file():
        max_len = read_json_object(sb, "restore the file or pass --max-seq-len").get("max_seq_length")
    return pooling, max_len


class Predictor:
    """One model + tokenizer for one task; `__call__(inputs)` maps decoded string inputs to output arrays."""

    def __init__(
        self,
        task: str,
        model: torch.nn.Module,
        tokenizer,
        limits: Limits,
        labels: Sequence[str] | None = None,
        max_positions: int = 512,
        type_vocab_size: int = 2,
        precision: str = "fp32",
        pooling: str = "mean",
        regression: bool = False,
        call_rows: int = 16,
        multi_label: bool = False,
    ):
        if task not in TASKS:
            raise UserError(f"unknown task {task!r}; choose one of {', '.join(TASKS)}")
        self.task, self.spec, self.model, self.tok, self.limits = task, TASKS[task], model.eval(), tokenizer, limits
        if limits.max_seq_len > max_positions:
            raise UserError(
                f"--max-seq-len {limits.max_seq_len} is over the model's {max_positions} positions; "
                f"pass --max-seq-len {max_positions} or less, or leave it out"
            )
        if task == "qa" and limits.max_query_length + 3 >= limits.max_seq_len:
            raise UserError(
                f"QA: --max-seq-len {limits.max_seq_len} leaves no room for context after a question of up to "
                f"{limits.max_query_length} tokens; raise --max-seq-len"
            )
        self.labels = list(labels) if labels else None
        if regression and task != "classify":
            raise UserError(f"a regression model is served with --task classify, not {task}")
        self.regression = regression
        # labels that hold independently (problem_type multi_label_classification, trained with a sigmoid per
        # label) get a sigmoid each, as in Hugging Face's pipeline: a softmax would make them compete
        self.multi_label = multi_label
        # what the served model answers: a regression model's `score` holds its outputs (transformers' problem_type
        # regression may have several, one per label)
        width = (len(self.labels) if self.labels else 1,)
        self.outputs = (dataclasses.replace(REGRESSION_OUTPUTS[0], shape=width),) if regression else self.spec.outputs
        if pooling not in POOLINGS:
            raise UserError(f"pooling {pooling!r} is not one of {', '.join(POOLINGS)}")
        self.pooling = pooling
        if call_rows < 1:
            raise UserError(f"rows per model call must be at least 1, not {call_rows}")
        # QA's windows go to the model this many at a time: a 64 KB context is ~250 windows, in one call a
        # dynamic batch of such requests would hold thousands of rows' activations at once
        self.call_rows = call_rows
        # bf16 autocast halves the matmul time on CPUs with native bf16 (and on GPUs); outputs stay fp32
        self.device = next(model.parameters()).device
        self.precision = dev.resolve_precision(precision, self.device)
        self.use_token_types = type_vocab_size > 1
        self.cls = _special(tokenizer, "[CLS]", "<s>")
        self.sep = _special(tokenizer, "[SEP]", "</s>")
        # separators between a pair's texts, as fine-tuning lays pairs out (the tokenizer's post-processor in
        # `encode_glue`, `squad.specials_for`): BERT's one [SEP], RoBERTa's `</s></s>`
        from bertforge.finetune.squad import specials_for

        self.pair_seps = specials_for(tokenizer).mid
        self.pad = _special(tokenizer, "[PAD]", "<pad>")
        self.mask = _special(tokenizer, "[MASK]", "<mask>") if task == "fill-mask" else None
        self.tokens = vocab_rows(tokenizer)  # the ids fill-mask may predict (once: get_vocab() takes ~10 ms)
        self.mask_token = tokenizer.id_to_token(self.mask) if self.mask is not None else None
        self._glued = None  # byte-level BPE that marks every text's start as a word's: the same, without that
        if self.mask_token is not None and type(tokenizer.model).__name__ == "BPE":  # a vocab trained before the fix
            from bertforge.data.vocab import mask_takes_its_space

            mask_takes_its_space(tokenizer, self.mask_token)
            self._glued = _without_prefix_space(tokenizer)

    @classmethod
    def from_dir(
        cls,
        task: str,
        model_dir: str | Path,
        limits: Limits | None = None,
        precision: str = "fp32",
        device: str = "cpu",
        fit_seq_len: bool = False,
        pooling: str | None = None,
        call_rows: int = 16,
    ) -> Predictor:
        """The model of a Hugging Face directory on `device` (a `bertforge.device.resolve_device` spec: auto, cpu,
        cuda[:N], ...). `fit_seq_len`: lower `limits.max_seq_len` to the model's positions when it has fewer
        (`bertforge serve` without `--max-seq-len`), and for `embed` to a sentence-transformers model's own
        max_seq_length. `pooling` (embed): None takes the model's own pooling config, else mean. `call_rows`: most
        rows per model call (the server's max_batch), which bounds QA's windows per call."""
        from bertforge.model.hf_interop import label_names_of
        from bertforge.serve.export import load, num_labels_from, problem_type_from, read_config

        if task not in TASKS:
            raise UserError(f"unknown task {task!r}; choose one of {', '.join(TASKS)}")
        model_dir = Path(model_dir)
        raw = read_config(model_dir)  # missing, invalid, not an object: one line, before the weights load
        labels, problem_type = None, None
        if task == "classify":
            num_labels = num_labels_from(raw, f"{model_dir}/config.json")  # the config in hand, not read again
            labels = label_names_of(raw) or [f"LABEL_{i}" for i in range(num_labels)]
            problem_type = problem_type_from(raw, f"{model_dir}/config.json")
        regression = problem_type == "regression"
        head = "regression" if regression else TASKS[task].head
        model, config = load(model_dir, head, num_labels=len(labels) if labels else None)
        if task == "embed":
            model = model.bert  # the encoder alone: (B, T) ids -> (B, T, H) token vectors
        model.to(dev.resolve_device(device))
        positions = config.usable_positions  # RoBERTa's start after its padding index
        own_pooling, own_len = read_pooling(model_dir, pooling) if task == "embed" else (None, None)
        limits = limits or Limits()
        fitted = min(positions, own_len or positions)
        if fit_seq_len and limits.max_seq_len > fitted:
            limits = dataclasses.replace(limits, max_seq_len=fitted)
        return cls(
            task,
            model,
            load_tokenizer(model_dir),
            limits,
            labels,
            max_positions=positions,
            type_vocab_size=config.type_vocab_size,
            precision=precision,
            pooling=pooling or own_pooling or "mean",
            regression=regression,
            call_rows=call_rows,
            multi_label=problem_type == "multi_label_classification",
        )

    # ---------------------------------------------------------------- shared
    def _forward(self, rows: list[list[int]], types: list[list[int]], **extra) -> Any:
        """Run the model on rows padded to the batch's own longest row."""
        T = max(len(r) for r in rows)
        ids = torch.full((len(rows), T), self.pad, dtype=torch.long)  # (B, T)
        tt = torch.zeros((len(rows), T), dtype=torch.long)
        am = torch.zeros((len(rows), T), dtype=torch.long)
        for i, (r, t) in enumerate(zip(rows, types)):
            ids[i, : len(r)] = torch.as_tensor(r)
            tt[i, : len(t)] = torch.as_tensor(t)
            am[i, : len(r)] = 1
        kw = {"input_ids": ids, "attention_mask": am, **extra}
        if self.use_token_types:
            kw["token_type_ids"] = tt
        kw = {k: v.to(self.device, non_blocking=True) for k, v in kw.items()}
        with torch.inference_mode(), dev.autocast(self.device, self.precision):
            return self.model(**kw)

    def encode(self, inputs: dict[str, list[str]]) -> list[Any]:
        """Validate one request's decoded inputs and turn each row into what `predict` takes."""
        check_request_bytes(inputs, self.limits.max_request_bytes)
        return {
            "qa": self._encode_qa,
            "classify": self._encode_classify,
            "fill-mask": self._encode_fill_mask,
            "embed": self._encode_classify,  # [CLS] text [SEP], cut to max_seq_len
        }[self.task](inputs)

    def predict(self, rows: list[Any]) -> list[dict[str, np.ndarray]]:
        """One model call for rows of any number of requests; one output dict (no batch dim) per row."""
        return {
            "qa": self._predict_qa,
            "classify": self._predict_classify,
            "fill-mask": self._predict_fill_mask,
            "embed": self._predict_embed,
        }[self.task](rows)

    def warmup(self, rows: int = 1) -> None:
        """One model call of `rows` rows of max_seq_len tokens, through the whole request path, before serving.

        The first call on a device pays for its lazy start (CUDA context, kernel loading, the allocator growing to
        the batch): 5.4 s for the first request on an H100 against 10-20 ms for the next ones, measured. Without a
        warm-up the first client waits for it, and a load generator's first window records no request at all.
        """
        n = self.limits.max_seq_len
        # a small vocab splits "word" into several pieces: count them, so the text fills exactly what is asked
        pieces = max(1, len(self.tok.encode("word", add_special_tokens=False).ids))

        def words(tokens: int) -> str:
            return " ".join(["word"] * max(1, tokens // pieces))

        if self.task == "fill-mask":  # longer text is refused: [CLS] words [MASK] [SEP]
            req = {"text": [f"{words(n - 3)} {self.mask_token}"] * rows}
        elif self.task == "qa":  # one full window per row: [CLS] question [SEP] context [SEP]
            q = "which word?"
            req = {
                "question": [q] * rows,
                "context": [words(n - 3 - len(self.tok.encode(q, add_special_tokens=False).ids))] * rows,
            }
        else:
            req = {"text": [words(n)] * rows}  # cut to max_seq_len
        self.predict(self.encode(req))

    def __call__(self, inputs: dict[str, list[str]]) -> dict[str, np.ndarray]:
        """In-process use: one request in, batched outputs out (what the server returns for it)."""
        return self.stack(self.predict(self.encode(inputs)))

    def stack(self, rows: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
        """Per-row outputs of one request as the batched arrays the server answers."""
        return stack_outputs(self.task, rows, self.outputs)

    # ---------------------------------------------------------------- classify
    def _token_ids(self, name: str, row: int, text: str) -> list[int]:
        """`text`'s token ids, or a RequestError when it has none (decode_strings refuses blank text; this, text of
        only what the tokenizer drops: control and zero-width characters)."""
        ids = self.tok.encode(text, add_special_tokens=False).ids
        if not ids:
            raise RequestError(
                f"input {name!r} row {row} has no tokens (only characters the tokenizer drops, such as control or "
                "zero-width ones); send text"
            )
        return ids

    def encode_pair(self, a: str, b: str | None, row: int = 0) -> tuple[list[int], list[int]]:
        """[CLS] a [SEP] (b [SEP]) (RoBERTa: <s> a </s></s> b </s>), the longer side cut first to fit max_seq_len
        (`longest_first`, as the fine-tuning code encodes pairs). An empty or blank `b` is no pair, as a blank
        text_pair column is (`bertforge predict --jsonl` sends "" for a row without one)."""
        b = b if b and b.strip() else None
        ta = self._token_ids("text", row, a)
        tb = self._token_ids("text_pair", row, b) if b else []
        budget = self.limits.max_seq_len - (2 + self.pair_seps if b else 2)
        keep_a, keep_b = longest_first(len(ta), len(tb), budget)
        ta, tb = ta[:keep_a], tb[:keep_b]
        mid = [self.sep] * (self.pair_seps - 1)  # the separators after a's own [SEP]
        ids = [self.cls, *ta, self.sep] + ([*mid, *tb, self.sep] if b else [])
        types = [0] * (len(ta) + 2) + ([1] * (len(mid) + len(tb) + 1) if b else [])
        return ids, types

    def _encode_classify(self, inputs: dict[str, list[str]]) -> list[Any]:
        texts, pairs = inputs["text"], inputs.get("text_pair")
        if pairs is not None and len(pairs) != len(texts):
            raise RequestError(
                f"inputs 'text' and 'text_pair' have {len(texts)} and {len(pairs)} rows; send one text_pair per text"
            )
        return [self.encode_pair(t, pairs[i] if pairs else None, i) for i, t in enumerate(texts)]

    def _predict_classify(self, rows: list[Any]) -> list[dict[str, np.ndarray]]:
        out = self._forward([r[0] for r in rows], [r[1] for r in rows])
        if self.regression:  # (B, 1): the prediction itself
            return [{"score": v.astype(np.float32)} for v in out.logits.float().cpu().numpy()]
        logits = out.logits.float()  # (B, num_labels)
        probs = (torch.sigmoid(logits) if self.multi_label else torch.softmax(logits, dim=-1)).cpu().numpy()
        res = []
        for p in probs:
            i = int(p.argmax())
            name = self.labels[i] if self.labels and i < len(self.labels) else str(i)
            res.append(
                {
                    "label": np.array([name.encode()], dtype=object),
                    "label_id": np.array([i], np.int64),
                    "probabilities": p.astype(np.float32),
                }
            )
        return res

    # ---------------------------------------------------------------- embed
    def _predict_embed(self, rows: list[Any]) -> list[dict[str, np.ndarray]]:
        seq = self._forward([r[0] for r in rows], [r[1] for r in rows]).float()  # (B, T, H)
        if self.pooling == "cls":
            vec = seq[:, 0]  # (B, H)
        else:  # mean over the real tokens ([CLS] and [SEP] included, as sentence-transformers does)
            real = torch.zeros(seq.shape[:2], device=seq.device)  # (B, T)
            for i, (ids, _) in enumerate(rows):
                real[i, : len(ids)] = 1
            vec = (seq * real[..., None]).sum(1) / real.sum(1, keepdim=True).clamp(min=1e-9)  # (B, H)
        vec = torch.nn.functional.normalize(vec, p=2, dim=-1).cpu().numpy()
        return [{"embedding": v.astype(np.float32)} for v in vec]

    # ---------------------------------------------------------------- fill-mask
    def _mask_text_ids(self, text: str) -> list[int]:
        """`text`'s ids, [MASK]s included. A byte-level BPE that adds a space before every text would also add
        one after each [MASK] ("[MASK]." -> [MASK] Ġ .): the text after a mask is tokenized as it continues
        there, as training saw it (a masked `Ġsat` before `.`)."""
        if self._glued is None or self.mask is None:  # _glued is set only with a mask token
            return self.tok.encode(text, add_special_tokens=False).ids
        pieces = text.split(self.mask_token)
        ids: list[int] = []
        for k, piece in enumerate(pieces):
            if k:
                ids.append(self.mask)
            piece = piece.rstrip() if k < len(pieces) - 1 else piece  # the mask takes the space before it
            if piece:
                tok = self.tok if k == 0 or piece[0].isspace() else self._glued
                ids += tok.encode(piece, add_special_tokens=False).ids
        return ids

    def _encode_fill_mask(self, inputs: dict[str, list[str]]) -> list[Any]:
        rows = []
        for i, t in enumerate(inputs["text"]):
            ids = [self.cls, *self._mask_text_ids(t), self.sep]
            if len(ids) > self.limits.max_seq_len:
                raise RequestError(
                    f"input 'text' row {i} is {len(ids)} tokens, over the server's limit of "
                    f"{self.limits.max_seq_len} (bertforge serve --max-seq-len)"
                )
            pos = [j for j, x in enumerate(ids) if x == self.mask]
            if not pos:
                raise RequestError(
                    f"input 'text' row {i} has no {self.mask_token} token; put {self.mask_token} "
                    "where a word should be predicted"
                )
            rows.append((ids, pos))
        return rows

    def _predict_fill_mask(self, rows: list[Any]) -> list[dict[str, np.ndarray]]:
        P = max(len(pos) for _, pos in rows)
        mp = torch.zeros((len(rows), P), dtype=torch.long)  # (B, P); 0 = empty slot ([CLS] is never predicted)
        for i, (_, pos) in enumerate(rows):
            mp[i, : len(pos)] = torch.as_tensor(pos)
        out = self._forward([r[0] for r in rows], [[0] * len(r[0]) for r in rows], masked_positions=mp)
        # a vocab padded to a multiple of 8 (model.pad_vocab_multiple, NVIDIA's 30528) has rows that are no token
        logits = out.mlm_logits.float()[:, : self.tokens]  # (B*P, V) -> (B*P, tokens)
        probs = torch.softmax(logits, dim=-1).view(len(rows), P, -1)  # (B, P, tokens)
        k = min(self.limits.top_k, probs.shape[-1])
        top_p, top_i = (t.cpu() for t in probs.topk(k, dim=-1))  # (B, P, k), on the device, then to the host
        res = []
        for i, (_, pos) in enumerate(rows):
            n = len(pos)
            ids = top_i[i, :n].numpy().astype(np.int64)  # (n_masks, k)
            toks = np.array([[self._token_text(int(t)) for t in r] for r in ids], dtype=object)
            res.append({"tokens": toks, "token_ids": ids, "scores": top_p[i, :n].numpy().astype(np.float32)})
        return res

    def _token_text(self, i: int) -> bytes:
        """A predicted token as its tokenizer's decoder reads it: byte-level BPE's `Ġsat` is `sat` (and `Ã©` is
        `é`), as Hugging Face's fill-mask pipeline shows it; a WordPiece entry stays as it is (`##ing`)."""
        return (self.tok.decode([i], skip_special_tokens=False).strip() or self.tok.id_to_token(i) or "").encode()

    # ---------------------------------------------------------------- qa
    def _encode_qa(self, inputs: dict[str, list[str]]) -> list[Any]:
        questions, contexts = inputs["question"], inputs["context"]
        if len(questions) != len(contexts):
            raise RequestError(
                f"inputs 'question' and 'context' have {len(questions)} and {len(contexts)} rows; "
                "send one context per question"
            )
        for i, (q, c) in enumerate(zip(questions, contexts)):
            for name, text in (("question", q), ("context", c)):
                # a prefix with tokens shows the text has some: a long context is tokenized once more, for its windows
                if not self.tok.encode(text[:256], add_special_tokens=False).ids:
                    self._token_ids(name, i, text)
        return list(zip(questions, contexts))

    def _predict_qa(self, rows: list[Any]) -> list[dict[str, np.ndarray]]:
        # the fine-tuning code's windowing and n-best postprocessing, unchanged (DESIGN §3.6)
        from bertforge.finetune.squad import SquadExample, make_features, postprocess

        lim = self.limits
        examples = [SquadExample(str(i), q, c, []) for i, (q, c) in enumerate(rows)]
        feats = make_features(
            examples,
            self.tok,
            max_seq_len=lim.max_seq_len,
            doc_stride=lim.doc_stride,
            max_query_len=lim.max_query_length,
        )
        ids, types, n = [f.tolist() for f in feats.input_ids], [t.tolist() for t in feats.token_type_ids], feats.lengths
        starts: list[np.ndarray] = []
        ends: list[np.ndarray] = []
        for i in range(0, len(ids), self.call_rows):  # bounded memory however many windows the rows make
            out = self._forward(ids[i : i + self.call_rows], types[i : i + self.call_rows])
            start, end = out.start_logits.float().cpu().numpy(), out.end_logits.float().cpu().numpy()  # (f, T)
            starts += [s[:k] for s, k in zip(start, n[i : i + self.call_rows])]
            ends += [e[:k] for e, k in zip(end, n[i : i + self.call_rows])]
        _, nbest, _ = postprocess(
            examples,
            feats,
            starts,
            ends,
            n_best=lim.n_best_size,
            max_answer_len=lim.max_answer_length,
        )
        best = [nbest[ex.qid][0] for ex in examples]
        return [
            {"answer": np.array([b["text"].encode()], dtype=object), "score": np.array([b["score"]], np.float32)}
            for b in best
        ]


def longest_first(n_a: int, n_b: int, budget: int) -> tuple[int, int]:
    """Tokens kept of a pair's two texts within `budget`: Hugging Face tokenizers' `longest_first` truncation, which
    `bertforge finetune` encodes pairs with (`finetune.runner.encode_glue`). Cutting one token at a time from the
    longer side, the first at a tie, kept a different token split when the budget was odd (a 14- and a 13-token
    text in 13 tokens: 6 + 7 here, 7 + 6 in fine-tuning), so the served model saw other inputs than it was trained
    and evaluated on."""
    if n_a + n_b <= budget:
        return n_a, n_b
    short, long = sorted((n_a, n_b))
    long = short if short > budget else max(short, budget - short)  # only the longer one cut, where that fits
    if short + long > budget:  # both cut: half each, the odd token to the longer one (to b at a tie)
        short, long = budget // 2, budget // 2 + budget % 2
    return (long, short) if n_a > n_b else (short, long)


def _without_prefix_space(tokenizer) -> Any:
    """A copy of a byte-level tokenizer that adds no space before a text, or None when it adds none anyway."""
    from tokenizers import Tokenizer, pre_tokenizers

    pre = tokenizer.pre_tokenizer
    if not isinstance(pre, pre_tokenizers.ByteLevel) or not pre.add_prefix_space:
        return None
    glued = Tokenizer.from_str(tokenizer.to_str())
    glued.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=pre.use_regex)
    return glued


def stack_outputs(task: str, rows: list[dict[str, np.ndarray]], outputs: Sequence[IOSpec]) -> dict[str, np.ndarray]:
    """Per-row outputs of one request as batched arrays; fill-mask pads rows to the request's most masks."""
    out = {}
    for spec in outputs:
        arrs = [r[spec.name] for r in rows]
        if task == "fill-mask":
            P, k = max(a.shape[0] for a in arrs), arrs[0].shape[1]
            fill = {"tokens": b"", "token_ids": -1, "scores": 0.0}[spec.name]
            padded = np.full((len(arrs), P, k), fill, dtype=arrs[0].dtype)
            for i, a in enumerate(arrs):
                padded[i, : a.shape[0]] = a
            out[spec.name] = padded
        else:
            out[spec.name] = np.stack(arrs)
    return out
