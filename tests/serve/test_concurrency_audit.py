"""Every request of a dynamic batch gets its own answer: the one `Predictor` gives for that request alone.

In-process: the served function (`make_infer_fn`) on a call of several requests of each task — 1 row and
max-batch rows, short rows padded to a long one, text cut to max_seq_len, unicode, pairs beside single texts.
Over loopback: a real server with dynamic batching and every task, 8 client threads over HTTP and gRPC.
Also: RoBERTa pairs laid out as fine-tuning lays them out, and a bare string given to `Client.infer`.
"""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from bertforge.errors import UserError
from bertforge.serve.server import ERROR_OUTPUT, make_infer_fn
from bertforge.serve.tasks import Limits, Predictor

WORDS = [
    "the",
    "cat",
    "sat",
    "on",
    "a",
    "mat",
    "and",
    "dog",
    "ran",
    "to",
    "park",
    "while",
    "paris",
    "is",
    "capital",
    "of",
    "france",
    "é",
    "naïve",
    "日本語",
    "🙂",
]
# what `bertforge serve --max-seq-len 96 --doc-stride 24` uses (its questions are cut to the default 64 tokens)
LIMITS = Limits(max_seq_len=96, doc_stride=24)
MAX_BATCH = 4


def _text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def _requests(task: str, rng: random.Random, sizes=(1, MAX_BATCH, 2, 1)) -> list[dict[str, list[str]]]:
    """Requests of `sizes` rows: short and long rows (over max_seq_len: cut, or windowed for qa) mixed."""
    out = []
    for n in sizes:
        if task == "qa":
            req = {
                "question": [_text(rng, rng.choice([1, 4, 30])) + "?" for _ in range(n)],
                "context": [_text(rng, rng.choice([1, 10, 150])) for _ in range(n)],
            }
        elif task == "fill-mask":
            masks = [" ".join(["[MASK]"] * rng.randint(1, 3)) for _ in range(n)]
            req = {"text": [f"{_text(rng, rng.randint(0, 6))} {m} {_text(rng, rng.choice([1, 30]))}" for m in masks]}
        else:
            req = {"text": [_text(rng, rng.choice([1, 5, 200])) for _ in range(n)]}
            if task == "classify" and n > 1:  # a pair on some rows, none (blank) on the others
                req["text_pair"] = [_text(rng, rng.choice([2, 100])) if i % 2 else "" for i in range(n)]
        out.append(req)
    return out


def _assert_same(task: str, got: dict[str, np.ndarray], want: dict[str, np.ndarray], atol: float = 1e-5) -> None:
    assert ERROR_OUTPUT not in got, got
    for name, w in want.items():
        g = got[name]
        assert g.shape == w.shape, (task, name, g.shape, w.shape)
        if w.dtype == object:
            assert [bytes(x) for x in g.reshape(-1)] == [bytes(x) for x in w.reshape(-1)], (task, name)
        else:
            np.testing.assert_allclose(g, w, atol=atol, err_msg=f"{task} {name}")


@pytest.fixture(scope="module")
def predictors(head_models, encoder_dir) -> dict[str, Predictor]:
    models = {**head_models, "embed": encoder_dir}
    return {t: Predictor.from_dir(t, d, LIMITS, call_rows=MAX_BATCH) for t, d in models.items()}


@pytest.mark.parametrize("task", ["classify", "qa", "fill-mask", "embed"])
def test_each_request_of_a_batched_call_gets_its_own_answer(predictors, task):
    p = predictors[task]
    reqs = _requests(task, random.Random(task))
    got = make_infer_fn(p)([{k: np.array([[s.encode()] for s in v], dtype=object) for k, v in r.items()} for r in reqs])
    assert len(got) == len(reqs)
    for req, out in zip(reqs, got):
        _assert_same(task, out, p(req))  # the request alone
        rows = len(next(iter(req.values())))
        for i in range(rows):  # and each of its rows alone: padding to another row's length changes nothing
            alone = p({k: [v[i]] for k, v in req.items()})
            if task == "fill-mask":  # padded to the request's most masks
                cut = {k: out[k][i : i + 1, : alone[k].shape[1]] for k in alone}
                _assert_same(task, cut, alone)
            else:
                _assert_same(task, {k: out[k][i : i + 1] for k in alone}, alone)


# ------------------------------------------------------------------------------------------------ RoBERTa pairs
@pytest.fixture(scope="module")
def roberta_tokenizer(tmp_path_factory):
    """A byte-level BPE with RoBERTa's specials and post-processor (`<s> a </s></s> b </s>`), as roberta-base's."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    from bertforge.data.vocab import load_tokenizer

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(["The cat sat on the mat. The dog ran to the park."] * 20, trainer)
    tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    path = tmp_path_factory.mktemp("roberta-tok") / "tokenizer.json"
    tok.save(str(path))
    return load_tokenizer(path)


def test_roberta_pairs_are_served_as_fine_tuning_encodes_them(roberta_tokenizer):
    """RoBERTa separates a pair with `</s></s>` (its tokenizer, `bertforge finetune`, HF run_glue); the server sent
    one `</s>`, and cut pairs to one token more than fine-tuning, so a fine-tuned pair model saw another input."""
    from bertforge.finetune import glue
    from bertforge.finetune.runner import encode_glue
    from bertforge.model import BertConfig, build_model

    tok = roberta_tokenizer
    config = BertConfig.from_preset(
        "tiny", vocab_size=tok.get_vocab_size(), model_type="roberta", type_vocab_size=1, pad_token_id=1
    )
    p = Predictor(
        "classify",
        build_model(config, "classification", num_labels=2),
        tok,
        Limits(max_seq_len=16),
        max_positions=config.usable_positions,
        type_vocab_size=1,
    )
    pairs = [("the cat", "the dog"), ("the cat sat " * 5, "the dog ran"), ("the cat " * 9, "the dog " * 9)]
    want = encode_glue(tok, glue.GlueExamples(list(pairs), [0] * len(pairs), "pairs"), 16, False)
    for (a, b), ids in zip(pairs, want.input_ids):
        assert p.encode_pair(a, b)[0] == ids.tolist()
    assert (
        p.encode_pair("the cat", None)[0]
        == encode_glue(tok, glue.GlueExamples([("the cat",)], [0], "x"), 16, False).input_ids[0].tolist()
    )


def test_bert_pairs_keep_one_separator(predictors):
    p = predictors["classify"]
    ids, types = p.encode_pair("a fine film", "a good one")
    assert ids.count(p.sep) == 2 and types == [0] * (ids.index(p.sep) + 1) + [1] * (len(ids) - ids.index(p.sep) - 1)


# ------------------------------------------------------------------------------------------------ client
def test_a_bare_string_for_an_input_is_refused_not_sent_as_one_row_per_character():
    pytest.importorskip("tritonclient.http")
    from bertforge.serve.client import Client

    with (
        Client("127.0.0.1:9", "http") as c,
        pytest.raises(UserError, match=r"input 'text' must be a list.*\['hello'\]"),
    ):
        c.infer("classify", text="hello")  # refused before anything is sent: no server is needed


# ------------------------------------------------------------------------------------------------ over loopback
def test_concurrent_clients_of_every_task_each_get_their_own_answer(
    predictors, head_models, encoder_dir, serving, tmp_path
):
    """8 threads, HTTP and gRPC, every task, requests of 1 to max-batch rows: Triton batches them (checked by its
    metrics), and every answer equals the in-process Predictor's for that request alone."""
    pytest.importorskip("pytriton")
    from bertforge.serve.client import Client

    models = {**head_models, "embed": encoder_dir}
    args = ["--max-seq-len", str(LIMITS.max_seq_len), "--doc-stride", str(LIMITS.doc_stride), "--no-warmup"]
    args += ["--max-queue-delay-us", "20000"]  # long enough that concurrent requests meet in one call
    rng = random.Random(0)
    jobs = [
        (task, req, proto)
        for task in models
        for req in _requests(task, rng, sizes=(1, MAX_BATCH, 2))
        for proto in ("http", "grpc")
    ]
    rng.shuffle(jobs)
    with serving.serve_process(models, [*args, "--max-batch", str(MAX_BATCH)], tmp_path / "serve.log") as srv:

        def send(job):
            task, req, proto = job
            with Client(srv[proto], proto) as c:
                return c.infer(task, **req)

        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(send, jobs))
        _, metrics = serving.get(f"http://{srv['metrics']}/metrics")
    for (task, req, _), got in zip(jobs, answers):
        _assert_same(task, got, predictors[task](req), atol=1e-4)
    # requests answered against model calls made: fewer calls than requests, so some were batched together
    counts: dict[str, int] = {}
    for line in metrics.decode().splitlines():
        if line.startswith(("nv_inference_request_success{", "nv_inference_exec_count{")):
            name = line.split("{")[0]
            counts[name] = counts.get(name, 0) + int(float(line.split()[-1]))
    assert counts["nv_inference_exec_count"] < counts["nv_inference_request_success"] == len(jobs)
