"""A classifier fine-tuned elsewhere is scored (and re-saved, and exported) in its own id2label's label order;
SQuAD v2.0's reported EM/F1 score the predictions written; GLUE pairs are truncated by HF's longest_first."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from tokenizers import BertWordPieceTokenizer

from bertforge.config import load_config
from bertforge.finetune import glue, runner
from bertforge.finetune.config import TaskConfig
from bertforge.finetune.runner import FinetuneRun, run_finetune

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", "?", "a", "man", "person", "sleeps", "what", "is"]
VOCAB += ["the", "capital", "of", "france", "paris"]
HF_MNLI = ["entailment", "neutral", "contradiction"]  # transformers' run_glue: the `datasets` ClassLabel order


def _classifier(path, names: list[str], predicts: int):
    """A tiny BERT classifier saved by `transformers` whose config.json has id2label `names` and whose head
    always predicts class id `predicts` (weights 0, that row's bias 5)."""
    import transformers

    path.mkdir()
    (path / "vocab.txt").write_text("\n".join(VOCAB) + "\n", encoding="utf-8")
    cfg = transformers.BertConfig(
        vocab_size=len(VOCAB),
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        id2label=dict(enumerate(names)),
        label2id={n: i for i, n in enumerate(names)},
    )
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(cfg)
    with torch.no_grad():
        model.classifier.weight.zero_()
        model.classifier.bias.zero_()
        model.classifier.bias[predicts] = 5.0
    model.save_pretrained(path)
    return path


def _mnli_dev(path, gold: str = "entailment", n: int = 8):
    head = ["index", "promptID", "pairID", "genre", "b1", "b2", "p1", "p2", "sentence1", "sentence2"]
    row = ["1", "1", "fiction", *"xxxx", "a man sleeps .", "a person sleeps .", gold, gold]
    rows = ["\t".join([*head, "label1", "gold_label"])] + ["\t".join([str(i), *row]) for i in range(n)]
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


def _cfg(out, *extra):
    sets = ["task.max_seq_len=32", "train.device=cpu", "train.precision=fp32", "train.plot=false"]
    return load_config("finetune", None, [f"train.output_dir={out}", *sets, *extra])


def _eval(model, dev, out, task="mnli") -> tuple[float, list[str]]:
    said: list[str] = []
    summary = run_finetune(FinetuneRun(task, str(model), None, [str(dev)], eval_only=True), _cfg(out), said.append)
    return summary["best"]["accuracy"], said


@pytest.mark.parametrize(
    "names, predicts",
    [(HF_MNLI, 0), (["CONTRADICTION", "NEUTRAL", "ENTAILMENT"], 2)],  # run_glue's; roberta-large-mnli's
    ids=["run_glue", "roberta_large_mnli"],
)
def test_eval_scores_in_the_checkpoints_label_order(tmp_path, monkeypatch, names, predicts):
    """The head predicts 'entailment' by its own id2label, on a dev set all 'entailment': accuracy 1 (0 when
    its class ids are read in bertforge's order: the bug)."""
    model, dev = _classifier(tmp_path / "m", names, predicts), _mnli_dev(tmp_path / "dev_matched.tsv")
    accuracy, said = _eval(model, dev, tmp_path / "out")
    assert accuracy == 1.0
    assert [s for s in said if "reordered" in s] == [
        f"--model {model}: its classifier's rows ({', '.join(names)}) reordered to mnli's label order "
        "(contradiction, entailment, neutral), as its config.json's id2label says"
    ]
    monkeypatch.setattr(runner, "_align_head_labels", lambda *a: None)  # the rows as they come: what it did
    assert _eval(model, dev, tmp_path / "before")[0] == 0.0


def test_generic_or_foreign_label_names_keep_the_rows(tmp_path):
    """LABEL_i names are taken in the task's order without a word; names that are not the task's labels keep the
    rows in order too, and are said (not scored silently)."""
    dev = _mnli_dev(tmp_path / "dev_matched.tsv")
    generic = _classifier(tmp_path / "generic", ["LABEL_0", "LABEL_1", "LABEL_2"], 1)  # 1 = entailment here
    accuracy, said = _eval(generic, dev, tmp_path / "o1")
    assert accuracy == 1.0 and not [s for s in said if "id2label" in s]
    foreign = _classifier(tmp_path / "foreign", ["yes", "no", "maybe"], 1)
    accuracy, said = _eval(foreign, dev, tmp_path / "o2")
    assert accuracy == 1.0
    assert f"--model {foreign}: its id2label (yes, no, maybe) does not name mnli's labels" in "\n".join(said)


def test_class_ids_of_knows_the_other_names():
    assert glue.class_ids_of("mnli", HF_MNLI) == [1, 2, 0]
    assert glue.class_ids_of("mrpc", ["equivalent", "not_equivalent"]) == [1, 0]
    assert glue.class_ids_of("qqp", ["not_duplicate", "duplicate"]) == [0, 1]
    assert glue.class_ids_of("sst2", ["POSITIVE", "NEGATIVE"]) == [1, 0]
    assert glue.class_ids_of("cola", ["unacceptable", "acceptable"]) == [0, 1]
    assert glue.class_ids_of("wnli", ["entailment", "not_entailment"]) == [1, 0]  # WNLI's TSV: 1 = entailment
    assert glue.class_ids_of("rte", ["not_entailment", "entailment"]) == [1, 0]
    assert glue.class_ids_of("mnli", ["LABEL_0", "LABEL_1", "LABEL_2"]) is None
    assert glue.class_ids_of("mnli", ["entailment", "entailment", "neutral"]) is None
    assert glue.class_ids_of("stsb", ["LABEL_0"]) is None


def test_mrpc_head_with_run_glue_names(tmp_path):
    """MRPC in transformers' run_glue: id 0 = not_equivalent (TSV 0), so a model saying the reverse is swapped."""
    model = _classifier(tmp_path / "m", ["equivalent", "not_equivalent"], 0)  # always 'equivalent' = TSV 1
    rows = ["Quality\t#1 ID\t#2 ID\t#1 String\t#2 String"] + ["1\t1\t2\ta man sleeps .\ta person sleeps ."] * 4
    (dev := tmp_path / "dev.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    accuracy, said = _eval(model, dev, tmp_path / "out", "mrpc")
    assert accuracy == 1.0 and any("reordered" in s for s in said)


def test_fine_tuned_reordered_head_saves_and_exports_matching_labels(tmp_path):
    """Training from a run_glue MNLI head: best/ holds the rows in mnli's order and says so in id2label, so
    `transformers` and bertforge's export name the prediction 'entailment', as the source model did."""
    import transformers

    from bertforge.serve.export import export_hf

    model = _classifier(tmp_path / "m", HF_MNLI, 0)
    data = _mnli_dev(tmp_path / "dev_matched.tsv")
    sets = ["optim.lr=1e-9", "train.epochs=1", "train.global_batch_size=8", "train.micro_batch_size=8"]
    said: list[str] = []
    run_finetune(FinetuneRun("mnli", str(model), str(data), [str(data)]), _cfg(tmp_path / "out", *sets), said.append)
    assert any("reordered" in s for s in said)
    best = tmp_path / "out" / "best"
    assert json.loads((best / "config.json").read_text())["id2label"] == {
        "0": "contradiction",
        "1": "entailment",
        "2": "neutral",
    }
    exported = export_hf(best, tmp_path / "export")
    tok = transformers.BertTokenizerFast(str(model / "vocab.txt"))
    batch = tok(["a man sleeps ."], ["a person sleeps ."], return_tensors="pt")
    for path in (model, best, exported):
        hf = transformers.AutoModelForSequenceClassification.from_pretrained(path).eval()
        with torch.no_grad():
            assert hf.config.id2label[int(hf(**batch).logits.argmax(-1))] == "entailment", path
    # bertforge's own best/ reads back in order, without a word
    accuracy, said = _eval(best, data, tmp_path / "again")
    assert accuracy == 1.0 and not [s for s in said if "id2label" in s]


def test_squad_v2_reported_scores_follow_the_prediction_threshold(tmp_path):
    """null_score_diff_threshold 2.0, null - best span = 1.5: the prediction is the span 'paris' (= gold), and the
    reported EM is 100 (the official script's 1.0 threshold on the odds made it no-answer: EM 0)."""
    (tmp_path / "vocab.txt").write_text("\n".join(VOCAB) + "\n", encoding="utf-8")
    tok = BertWordPieceTokenizer(str(tmp_path / "vocab.txt"), lowercase=True)
    ctx = "the capital of france is paris ."
    qa = {"id": "q1", "question": "what is the capital of france ?", "is_impossible": False}
    qa["answers"] = [{"text": "paris", "answer_start": ctx.index("paris")}]
    data = {"version": "v2.0", "data": [{"title": "t", "paragraphs": [{"context": ctx, "qas": [qa]}]}]}
    (dev := tmp_path / "dev.json").write_text(json.dumps(data), encoding="utf-8")
    cfg = TaskConfig(max_seq_len=64, doc_stride=32, null_score_diff_threshold=2.0)
    run = FinetuneRun("squad_v2", str(tmp_path), None, [str(dev)], eval_only=True)
    task = runner._squad_task(run, cfg, tok, tmp_path, log=lambda s: None)
    _, rows, score = task.evals[0]
    ids = rows.input_ids[0]
    start, end = np.full(len(ids), -5.0), np.full(len(ids), -5.0)
    k = int(np.flatnonzero(ids == tok.token_to_id("paris"))[0])
    start[k] = end[k] = 3.0  # span score 6.0
    start[0] = end[0] = 3.75  # null score 7.5
    metrics = score({"start_logits": [start], "end_logits": [end]})
    assert json.loads((tmp_path / "predictions.json").read_text()) == {"q1": "paris"}
    assert json.loads((tmp_path / "null_odds.json").read_text()) == {"q1": 1.5}
    assert metrics["exact"] == metrics["f1"] == 100.0


def test_glue_pairs_truncate_as_hf_longest_first():
    """encode_glue cuts an equal-length pair's odd extra token from the first text (HF tokenizers, run_glue);
    Google's _truncate_seq_pair would cut it from the second."""
    vocab = {w: i for i, w in enumerate(VOCAB)}
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.BertProcessing(("[SEP]", vocab["[SEP]"]), ("[CLS]", vocab["[CLS]"]))
    ex = glue.GlueExamples([("a man sleeps .", "a person sleeps .")], [0], "mem")
    enc = runner.encode_glue(tok, ex, 3 + 7, False)  # 4 + 4 tokens, room for 7
    types = enc.token_type_ids[0].tolist()
    assert (types.count(0) - 2, types.count(1) - 1) == (3, 4)


@pytest.mark.parametrize(
    "task, names, want",
    [
        ("mnli", HF_MNLI, [1, 2, 0]),
        ("wnli", ["not_entailment", "entailment"], [0, 1]),
        ("qqp", ["not_duplicate", "duplicate"], [0, 1]),
        ("rte", ["entailment", "not_entailment"], [0, 1]),
    ],
)
def test_load_hf_maps_classlabel_names_through_the_same_aliases(monkeypatch, task, names, want):
    import sys
    import types

    class Rows(list):
        features = {"label": types.SimpleNamespace(names=names)}

    keys = glue.GLUE_TASKS[task].hf_keys
    rows = Rows({**{k: "x" for k in keys}, "label": i} for i in range(len(names)))
    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=lambda *a, **k: rows))
    assert glue.load_hf(task, "validation").labels == want
