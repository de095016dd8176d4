"""Fine-tuning from RoBERTa- and ModernBERT-style checkpoints against transformers (run_glue.py / run_qa.py) on the
same tiny checkpoint: the encoded rows, the SQuAD windows, the first batch's loss, and a one-type RoBERTa whose
tokenizer is BERT's WordPiece (klue/roberta-base)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from bertforge.config import load_config
from bertforge.data.vocab import load_tokenizer
from bertforge.finetune import glue, runner, squad

transformers = pytest.importorskip("transformers")

WORDS = ["good", "bad", "film", "plot", "scene", "Paris", "France", "capital", "the", "of", "is", "What", "Where"]
WORDS += ["café", "naïve", "and"]
CTX = "Paris is the capital of France. The café is naïve and the film is good. " * 3
QUESTIONS = [("What is the capital of France?", "Paris"), ("   Where is the café?", "café"), (" What is good?", "film")]


def _bpe(specials: list[str]):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)  # roberta-base's and ModernBERT's
    tok.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(
        vocab_size=300, min_frequency=1, special_tokens=specials, initial_alphabet=alphabet, show_progress=False
    )
    tok.train_from_iterator([" ".join(WORDS)] * 20, trainer=trainer)
    return tok


def _roberta(d: Path) -> tuple[Path, object]:
    from tokenizers import processors

    tok = _bpe(["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0), trim_offsets=True)
    tok.save(str(d / "tokenizer.json"))
    specials = dict(bos_token="<s>", eos_token="</s>", sep_token="</s>", cls_token="<s>", pad_token="<pad>")
    (d / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "RobertaTokenizer", **specials}))
    cfg = transformers.RobertaConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=66, type_vocab_size=1, pad_token_id=1,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    return d, cfg


def _modernbert(d: Path) -> tuple[Path, object]:
    from tokenizers import AddedToken, processors

    tok = _bpe(["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"])
    tok.add_special_tokens([AddedToken("[MASK]", special=True, lstrip=True)])
    v = tok.get_vocab()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0",
        pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", v["[CLS]"]), ("[SEP]", v["[SEP]"])],
    )
    tok.save(str(d / "tokenizer.json"))
    specials = dict(cls_token="[CLS]", sep_token="[SEP]", pad_token="[PAD]", unk_token="[UNK]", mask_token="[MASK]")
    (d / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", **specials}))
    # a 8-token sliding window (every 3rd layer global) on rows of up to 40 tokens: local attention is exercised
    cfg = transformers.ModernBertConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=32, num_hidden_layers=3, num_attention_heads=2,
        intermediate_size=48, max_position_embeddings=128, local_attention=8, global_attn_every_n_layers=3,
        pad_token_id=v["[PAD]"], cls_token_id=v["[CLS]"], sep_token_id=v["[SEP]"], bos_token_id=v["[CLS]"],
        eos_token_id=v["[SEP]"], classifier_pooling="mean", attention_dropout=0.0, mlp_dropout=0.0,
        embedding_dropout=0.0, classifier_dropout=0.0,
    )  # fmt: skip
    return d, cfg


FAMILIES = {"roberta": (_roberta, "Roberta", 2), "modernbert": (_modernbert, "ModernBert", 1)}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, tmp_path_factory):
    """(name, tokenizer directory, transformers config, transformers class prefix, separators in a pair)."""
    make, prefix, mid = FAMILIES[request.param]
    d, cfg = make(tmp_path_factory.mktemp(request.param))
    return request.param, d, cfg, prefix, mid


def _examples() -> list[squad.SquadExample]:
    return [squad.SquadExample(f"q{i}", q, CTX, [(a, CTX.index(a))]) for i, (q, a) in enumerate(QUESTIONS)]


def test_squad_windows_are_run_qa_s_for_questions_with_leading_spaces(family):
    """run_qa.py strips the question's left whitespace (SQuAD v1.1 dev has 10 such questions); a byte-level BPE
    otherwise encodes the spaces as tokens and the first word as "ĠWhere", unlike the transformers reference."""
    _, d, _, _, mid = family
    hf = transformers.AutoTokenizer.from_pretrained(d)
    max_len, step = 48, 16
    examples = _examples()
    f = squad.make_features(examples, load_tokenizer(d), max_len, step, 64, training=True, log=None)
    for i, ex in enumerate(examples):
        q = ex.question.lstrip()
        n_q = len(hf(q, add_special_tokens=False)["input_ids"])
        overlap = max_len - n_q - 2 - mid - step  # HF's stride is the windows' overlap, ours the step between them
        ref = hf(q, CTX, truncation="only_second", max_length=max_len, stride=overlap, return_overflowing_tokens=True)
        ours = [f.input_ids[k].tolist() for k in np.nonzero(f.example_index == i)[0]]
        assert ours == ref["input_ids"], ex.question


def test_glue_rows_and_first_loss_are_transformers(family, tmp_path):
    """<s> A </s></s> B </s> (RoBERTa, padding id 1) and [CLS] A [SEP] B [SEP] (ModernBERT: sliding-window
    layers, mean pooling) as run_glue encodes them, and the first batch's loss of the classifier and of the QA
    head equal to transformers' on the same batch with dropout 0."""
    name, src, cfg, prefix, _ = family
    pairs = [("good film is good", "bad plot of the scene"), ("What is the capital of France", "Paris")]
    pairs += [("the film is bad " * 8, "good")]  # cut by longest_first, longer than the 8-token window
    tok, hf_tok = load_tokenizer(src), transformers.AutoTokenizer.from_pretrained(src)
    enc = runner.encode_glue(tok, glue.GlueExamples(pairs, [0, 1, 2], "x"), 40, False)
    assert [x.tolist() for x in enc.input_ids] == [
        hf_tok(a, b, truncation=True, max_length=40)["input_ids"] for a, b in pairs
    ]
    qa = runner.encode_squad(squad.make_features(_examples(), tok, 40, 16, 64, training=True, log=None))
    for head, cls, data, n in [
        ("classification", "ForSequenceClassification", enc, 3),
        ("qa", "ForQuestionAnswering", qa, 2),
    ]:
        d = tmp_path / head
        torch.manual_seed(0)
        theirs = getattr(transformers, prefix + cls)(dataclass_copy(cfg, num_labels=n)).eval()
        theirs.save_pretrained(d)
        ours, mconfig = runner.load_model(str(d), head, n, "sdpa", training=True, say=lambda m: None, task=None)
        ours.eval()
        batch = runner.collate(data, np.arange(min(len(data), 6)), mconfig.pad_token_id, torch.device("cpu"))
        assert mconfig.pad_token_id == cfg.pad_token_id  # RoBERTa's positions start after it
        assert head == "qa" or (batch["input_ids"] == cfg.pad_token_id).any()
        with torch.no_grad():
            loss = ours(**batch).loss
            ref = theirs(**{k: v for k, v in batch.items() if k != "token_type_ids"}).loss
        assert loss.item() == pytest.approx(ref.item(), abs=1e-5), (name, head)


def dataclass_copy(cfg, **kw):
    """A copy of a transformers config with `kw` set."""
    c = cfg.__class__.from_dict(cfg.to_dict())
    for k, v in kw.items():
        setattr(c, k, v)
    return c


def test_one_token_type_roberta_with_a_wordpiece_tokenizer_fine_tunes(tmp_path):
    """klue/roberta-base: model_type roberta with type_vocab_size 1, and BERT's WordPiece tokenizer ([CLS] A [SEP]
    B [SEP], B of type 1). Its one-row token-type table cannot embed type 1: the first step stopped with an
    IndexError. Every type is 0, as transformers' RoBERTa reads rows given without token types."""
    words = ["[CLS]", "[PAD]", "[SEP]", "[UNK]", "[MASK]", "good", "bad", "film", "plot", "."]
    (tmp_path / "vocab.txt").write_text("\n".join(words) + "\n")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "BertTokenizer"}))
    cfg = transformers.RobertaConfig(
        vocab_size=len(words), hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=66, type_vocab_size=1, pad_token_id=1,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.RobertaModel(cfg).save_pretrained(tmp_path / "m")
    shutil.copy(tmp_path / "vocab.txt", tmp_path / "m")
    shutil.copy(tmp_path / "tokenizer_config.json", tmp_path / "m")
    rows = ["Quality\t#1 ID\t#2 ID\t#1 String\t#2 String"] + [
        f"{i % 2}\t1\t2\tgood film .\tbad plot ." for i in range(8)
    ]
    (tmp_path / "train.tsv").write_text("\n".join(rows) + "\n")
    sets = [f"train.output_dir={tmp_path / 'out'}", "task.max_seq_len=32", "train.global_batch_size=4"]
    sets += ["train.micro_batch_size=4", "train.epochs=1", "train.device=cpu", "train.plot=false"]
    sets += ["train.precision=fp32"]
    run = runner.FinetuneRun("mrpc", str(tmp_path / "m"), str(tmp_path / "train.tsv"), [str(tmp_path / "train.tsv")])
    summary = runner.run_finetune(run, load_config("finetune", None, sets), log=lambda m: None)
    assert summary["best"]["step"] == 2
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "out" / "best")
    assert hf.config.model_type == "roberta"
