"""The served functions in-process: tokenisation, per-batch padding, postprocessing, request validation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bertforge.errors import UserError
from bertforge.serve.tasks import Limits, Predictor, RequestError, decode_strings


@pytest.fixture(scope="module")
def preds(head_models):
    lim = Limits(max_seq_len=64, doc_stride=24, max_request_bytes=4096, max_query_length=16)
    return {t: Predictor.from_dir(t, d, lim) for t, d in head_models.items()}


def test_classify_matches_transformers_and_padding_does_not_matter(preds, head_models):
    transformers = pytest.importorskip("transformers")
    texts = ["short", "a much longer sentence that needs many more word pieces than the first one does"]
    out = preds["classify"]({"text": texts})
    alone = [preds["classify"]({"text": [t]})["probabilities"][0] for t in texts]
    np.testing.assert_allclose(out["probabilities"], np.stack(alone), atol=1e-5)  # padded to its own longest
    tok = transformers.AutoTokenizer.from_pretrained(head_models["classify"])
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(head_models["classify"]).eval()
    with torch.inference_mode():
        want = torch.softmax(hf(**tok(texts, padding=True, return_tensors="pt")).logits, -1).numpy()
    np.testing.assert_allclose(out["probabilities"], want, atol=1e-4)
    assert out["label"][:, 0].tolist() == [f"LABEL_{i}".encode() for i in want.argmax(-1)]


def test_bf16_autocast_serves_close_to_fp32_with_fp32_outputs(preds, head_models):
    lim = preds["classify"].limits
    texts = ["short", "a much longer sentence that needs many more word pieces than the first one does"]
    bf = Predictor.from_dir("classify", head_models["classify"], lim, precision="bf16")
    assert (bf.precision, preds["classify"].precision) == ("bf16", "fp32")
    got, want = bf({"text": texts})["probabilities"], preds["classify"]({"text": texts})["probabilities"]
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, atol=3e-2)  # bf16 keeps ~3 significant digits
    fm = Predictor.from_dir("fill-mask", head_models["fill-mask"], lim, precision="bf16")
    assert fm({"text": ["the [MASK] is here"]})["scores"].dtype == np.float32
    with pytest.raises(UserError, match="precision"):
        Predictor.from_dir("classify", head_models["classify"], lim, precision="int3")


def test_classify_truncates_longest_first(preds):
    p = preds["classify"]
    ids, types = p.encode_pair("word " * 100, "other words here")
    assert len(ids) == 64 and types.count(1) == 4  # the long side was cut, the pair kept ([SEP] counts)
    ids, _ = p.encode_pair("word " * 100, None)
    assert len(ids) == 64 and ids[-1] == p.sep


def test_fill_mask_matches_transformers(preds, head_models):
    transformers = pytest.importorskip("transformers")
    text = "the capital of [MASK] is paris and it is [MASK]."
    out = preds["fill-mask"]({"text": [text]})
    tok = transformers.AutoTokenizer.from_pretrained(head_models["fill-mask"])
    hf = transformers.AutoModelForMaskedLM.from_pretrained(head_models["fill-mask"]).eval()
    enc = tok([text], return_tensors="pt")
    with torch.inference_mode():
        logits = hf(**enc).logits[0]  # (T, V)
    pos = (enc["input_ids"][0] == tok.mask_token_id).nonzero().flatten()
    want = torch.softmax(logits[pos], -1).topk(5)
    assert out["token_ids"][0].tolist() == want.indices.tolist()
    np.testing.assert_allclose(out["scores"][0], want.values.numpy(), atol=1e-5)


def test_qa_answer_is_the_best_span_over_windows(preds):
    p = preds["qa"]
    context = " ".join(f"Fact {i}: the river number {i} is {i * 3} kilometres long." for i in range(12))
    q = "How long is river number 5?"
    out = p({"question": [q], "context": [context]})
    answer, score = out["answer"][0, 0].decode(), float(out["score"][0, 0])
    assert answer and answer in context
    # brute force over every window's logits: no valid span scores higher than the served one
    from bertforge.finetune.squad import SquadExample, make_features

    f = make_features([SquadExample("0", q, context, [])], p.tok, 64, 24, 16)
    assert len(f) > 1  # the context really was windowed
    best = -np.inf
    for i in range(len(f)):
        o = p._forward([f.input_ids[i].tolist()], [f.token_type_ids[i].tolist()])
        s, e = o.start_logits[0].numpy(), o.end_logits[0].numpy()
        c0, n = int(f.ctx_offset[i]), len(f.offsets[i])
        for a in range(n):
            if not f.max_context[i][a]:
                continue
            for b in range(a, min(n, a + 30)):
                best = max(best, s[c0 + a] + e[c0 + b])
    assert score == pytest.approx(best, abs=1e-4)


def test_qa_windows_go_to_the_model_at_most_call_rows_at_a_time(preds, monkeypatch):
    """A long context's windows, from several requests' rows, are run in calls of at most `call_rows` rows (the
    server's max_batch): the same answers as in one call, with a bounded batch however long the context."""
    p = preds["qa"]
    contexts = [" ".join(f"Fact {i}: river {i} is {i * k} km long." for i in range(20)) for k in (3, 7)]
    req = {"question": ["How long is river 5?", "How long is river 9?"], "context": contexts}
    monkeypatch.setattr(p, "call_rows", 10**6)
    whole = p(req)
    calls: list[int] = []
    forward = p._forward
    monkeypatch.setattr(p, "_forward", lambda rows, types: calls.append(len(rows)) or forward(rows, types))
    monkeypatch.setattr(p, "call_rows", 3)
    split = p(req)
    assert sum(calls) > 6 and max(calls) == 3
    assert split["answer"].tolist() == whole["answer"].tolist()
    np.testing.assert_allclose(split["score"], whole["score"], atol=1e-4)


def test_request_validation(preds):
    with pytest.raises(RequestError, match="row 1 is empty"):
        decode_strings("text", np.array([[b"ok"], [b" "]], dtype=object))
    with pytest.raises(RequestError, match="not valid UTF-8"):
        decode_strings("text", np.array([[b"\xc3\x28"]], dtype=object))
    with pytest.raises(RequestError, match="shape"):
        decode_strings("text", np.array([[b"a", b"b"]], dtype=object))
    with pytest.raises(RequestError, match="4096"):
        preds["qa"]({"question": ["q"], "context": ["x" * 5000]})
    with pytest.raises(RequestError, match="one context per question"):
        preds["qa"]({"question": ["q", "r"], "context": ["c"]})
    with pytest.raises(RequestError, match="over the server's limit of 64"):
        preds["fill-mask"]({"text": ["[MASK] " + "word " * 80]})
    with pytest.raises(RequestError, match="no \\[MASK\\]"):
        preds["fill-mask"]({"text": ["nothing"]})


def test_limits_and_model_dir_errors(head_models, tmp_path):
    with pytest.raises(UserError, match="no room for context after a question of up to 64 tokens; raise --max-seq"):
        Predictor.from_dir("qa", head_models["qa"], Limits(max_seq_len=40, max_query_length=64))
    with pytest.raises(UserError, match="config.json"):
        Predictor.from_dir("qa", tmp_path)
    with pytest.raises(UserError, match="positions"):
        Predictor.from_dir("qa", head_models["qa"], Limits(max_seq_len=1024))
    with pytest.raises(UserError, match="missing"):  # a classify model served as qa has no QA head
        Predictor.from_dir("qa", head_models["classify"])


def _recording(forward, shapes):
    """`forward` that also appends (model rows, longest row) of each call to `shapes`."""

    def spy(rows, types, **kw):
        shapes.append((len(rows), max(map(len, rows))))
        return forward(rows, types, **kw)

    return spy


def test_warmup_runs_one_full_batch_through_the_request_path(preds):
    for task, p in preds.items():
        shapes = []
        p._forward = _recording(p._forward, shapes)
        try:
            p.warmup(rows=3)
        finally:
            del p._forward  # back to the class's method
        n = p.limits.max_seq_len
        if task == "fill-mask":  # under the limit (longer text is refused), one [MASK] per row
            assert len(shapes) == 1 and shapes[0][0] == 3 and shapes[0][1] <= n
        else:  # classify is cut to max_seq_len; QA fills one window per row
            assert shapes == [(3, n)], (task, shapes)


def test_device_is_chosen_when_loading(head_models):
    p = Predictor.from_dir("classify", head_models["classify"], device="cpu")
    assert p.device.type == "cpu" and next(p.model.parameters()).device.type == "cpu"
    with pytest.raises(UserError, match="unknown device"):
        Predictor.from_dir("classify", head_models["classify"], device="tpu")
    if not torch.cuda.is_available():
        with pytest.raises(UserError, match="no cuda device"):
            Predictor.from_dir("classify", head_models["classify"], device="cuda")


def test_serve_cli_argument_errors(head_models, capsys):
    from bertforge.cli import main

    assert main(["serve", "--model", str(head_models["qa"]), "--task", "qa", "--task", "classify"]) == 2
    assert "one --task per --model" in capsys.readouterr().err
    assert main(["serve", "--model", str(head_models["qa"]), "--task", "qa", "--max-batch", "0"]) == 2
    assert "--max-batch must be at least 1" in capsys.readouterr().err
    assert main(["predict", "--task", "qa", "--question", "q"]) == 2
    assert "--context" in capsys.readouterr().err


@pytest.mark.parametrize(
    "task, inputs, words",
    [
        ("classify", {"text": ["\u200b\x01"]}, "input 'text' row 0 has no tokens"),
        (
            "classify",
            {"text": ["fine", "ok"], "text_pair": ["fine", "\u200b"]},
            "input 'text_pair' row 1 has no tokens",
        ),
        ("qa", {"question": ["who?"], "context": ["\u200b" * 300]}, "input 'context' row 0 has no tokens"),
        ("qa", {"question": ["\x01\x02"], "context": ["Bob went home."]}, "input 'question' row 0 has no tokens"),
    ],
    ids=["classify", "pair", "qa context", "qa question"],
)
def test_text_without_tokens_is_refused(preds, task, inputs, words):
    """Zero-width and control characters pass the blank check (str.strip) but tokenize to nothing: the model then
    classified an empty [CLS] [SEP] or answered "" from an empty context."""
    with pytest.raises(RequestError, match=words):
        preds[task](inputs)


def test_a_blank_text_pair_row_is_no_pair(preds):
    """What `bertforge predict --jsonl` sends for a row without text_pair: that row is classified alone."""
    p = preds["classify"]
    mixed = p({"text": ["a fine film", "dull"], "text_pair": ["a good one", ""]})["probabilities"]
    alone = p({"text": ["dull"]})["probabilities"]
    np.testing.assert_allclose(mixed[1], alone[0], atol=1e-5)


@pytest.mark.parametrize("field", ["doc_stride", "top_k", "max_query_length", "max_answer_length", "n_best_size"])
@pytest.mark.parametrize("value", [0, -1])
def test_limits_refuse_values_below_one(field, value):
    """doc_stride 0 hung a QA request whose context needs a second window (the window start never advanced); top_k
    0 answered nothing and -1 crashed."""
    with pytest.raises(UserError, match=f"must be at least 1, not {value}"):
        Limits(**{field: value})


def test_a_regression_model_served_as_classify_answers_its_score(stsb, tmp_path):
    """Served as a classifier, softmax over its one output was 1.0 for every row. It answers the raw prediction,
    as Hugging Face's pipeline does for regression (function_to_apply "none"), equal to transformers' logits."""
    import json
    import shutil

    transformers = pytest.importorskip("transformers")
    assert json.loads((stsb / "config.json").read_text())["problem_type"] == "regression"
    texts, pairs = ["A man plays a guitar.", "A cat sleeps."], ["Someone plays music.", "A dog runs in a park."]
    p = Predictor.from_dir("classify", stsb, Limits(max_seq_len=64))
    assert [o.name for o in p.outputs] == ["score"]
    out = p({"text": texts, "text_pair": pairs})
    assert set(out) == {"score"} and out["score"].shape == (2, 1) and out["score"].dtype == np.float32
    tok = transformers.AutoTokenizer.from_pretrained(stsb)
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(stsb).eval()
    with torch.inference_mode():
        want = hf(**tok(texts, pairs, padding=True, return_tensors="pt")).logits.numpy()  # (2, 1)
    np.testing.assert_allclose(out["score"], want, atol=1e-4)
    assert out["score"][0, 0] != out["score"][1, 0]
    # one label without problem_type is a regression model too, as Hugging Face decides it
    one = tmp_path / "one-label"
    shutil.copytree(stsb, one)
    raw = json.loads((one / "config.json").read_text())
    del raw["problem_type"]
    (one / "config.json").write_text(json.dumps(raw))
    assert [o.name for o in Predictor.from_dir("classify", one, Limits(max_seq_len=64)).outputs] == ["score"]
    with pytest.raises(UserError, match="num_labels 0"):
        (one / "config.json").write_text(json.dumps({**raw, "id2label": {}, "num_labels": 0}))
        Predictor.from_dir("classify", one)


def test_a_multi_label_model_answers_a_sigmoid_per_label(head_models, stsb, tmp_path):
    """A multi-label classifier (problem_type multi_label_classification, a sigmoid per label in training and in
    Hugging Face's pipeline) was answered a softmax, making its independent labels compete; one label of it was
    taken for a regression model. Each label now gets its own sigmoid of transformers' logits."""
    import json
    import shutil

    transformers = pytest.importorskip("transformers")
    texts = ["a fine film", "dull"]
    for name, src in (("three", head_models["classify"]), ("one", stsb)):
        d = tmp_path / name
        shutil.copytree(src, d)
        raw = json.loads((d / "config.json").read_text())
        (d / "config.json").write_text(json.dumps({**raw, "problem_type": "multi_label_classification"}))
        p = Predictor.from_dir("classify", d, Limits(max_seq_len=64))
        assert p.multi_label and not p.regression
        assert [o.name for o in p.outputs] == ["label", "label_id", "probabilities"]
        out = p({"text": texts})
        tok = transformers.AutoTokenizer.from_pretrained(d)
        hf = transformers.AutoModelForSequenceClassification.from_pretrained(d).eval()
        with torch.inference_mode():
            want = torch.sigmoid(hf(**tok(texts, padding=True, return_tensors="pt")).logits).numpy()  # (2, labels)
        np.testing.assert_allclose(out["probabilities"], want, atol=1e-4)
        assert out["label_id"][:, 0].tolist() == want.argmax(-1).tolist()
    assert not np.allclose(out["probabilities"].sum(-1), 1.0)  # one label: no softmax's constant 1.0
    assert not Predictor.from_dir("classify", head_models["classify"], Limits(max_seq_len=64)).multi_label


def test_byte_level_fill_mask_text_is_tokenized_as_training_masked_it(tmp_path):
    """A byte-level BPE that marks each text's start as a word's gave `Ġcat Ġ [MASK] Ġ .` for "cat [MASK].": a
    lone space token on each side of the mask, where training masked a whole `Ġsat` before `.`."""
    from tokenizers import AddedToken

    from bertforge.data.vocab import train_bpe
    from bertforge.model import BertConfig, build_model

    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(["The cat sat on the mat. The dog ran to the park."] * 50))
    tok = train_bpe([corpus], tmp_path / "bpe", vocab_size=400, min_frequency=1)
    tok.add_special_tokens([AddedToken("[MASK]", special=True, lstrip=False)])  # as vocabs trained before
    config = BertConfig.from_preset("tiny", vocab_size=tok.get_vocab_size(), max_position_embeddings=64)
    p = Predictor("fill-mask", build_model(config, "mlm"), tok, Limits(max_seq_len=64))
    sat = tok.encode("The cat sat.", add_special_tokens=False).ids
    masked = [tok.token_to_id("[MASK]") if tok.id_to_token(i) == "Ġsat" else i for i in sat]
    assert p._mask_text_ids("The cat [MASK].") == masked
    assert [tok.id_to_token(i) for i in p._mask_text_ids("[MASK] cat [MASK] on")] == ["[MASK]", "Ġcat", "[MASK]", "Ġon"]
    rows = p._encode_fill_mask({"text": ["The cat [MASK]."]})
    assert rows[0][1] == [3]  # [CLS] ĠThe Ġcat [MASK] . [SEP]: the mask's position
    # the returned tokens are text, as the tokenizer's decoder reads them (HF's pipeline shows `sat`, not `Ġsat`)
    out = p({"text": ["The cat [MASK]."]})
    words = [t.decode() for t in out["tokens"][0, 0]]
    assert words == [tok.decode([int(i)]).strip() or tok.id_to_token(int(i)) for i in out["token_ids"][0, 0]]
    assert not any(w.startswith("Ġ") for w in words)
    assert p._token_text(tok.token_to_id("Ġsat")) == b"sat"


def test_a_regression_model_of_several_outputs_declares_and_answers_them_all(tmp_path):
    """transformers' problem_type regression with num_labels 3: `score` is (3,) per row, as declared to Triton."""
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(
        vocab_size=40, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64,
        num_labels=3, problem_type="regression",
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.BertForSequenceClassification(config).save_pretrained(tmp_path)
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b", "c"] + [f"w{i}" for i in range(32)]
    (tmp_path / "vocab.txt").write_text("\n".join(words) + "\n")
    p = Predictor.from_dir("classify", tmp_path, Limits(max_seq_len=16))
    assert [(o.name, o.shape) for o in p.outputs] == [("score", (3,))]
    out = p({"text": ["a b c", "w1 w2"]})
    assert out["score"].shape == (2, 3) and out["score"].dtype == np.float32
