"""`bertforge export` against what `transformers` makes of the same directory: the bare encoder's pooler, the
tokenizer's added tokens, and sentence-transformers module paths that would write outside the export."""

from __future__ import annotations

import json

import pytest
import torch

from bertforge.errors import UserError
from bertforge.serve import export

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "##s", "on", "mat", "."]


def _tiny(tmp_path, arch: str, name: str = "src"):
    """A tiny transformers `arch` saved as its save_pretrained writes it, with a word-piece vocab.txt."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.BertConfig(
        vocab_size=len(VOCAB), hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
    )  # fmt: skip
    model = getattr(transformers, arch)(cfg).eval()
    d = tmp_path / name
    model.save_pretrained(d)
    (d / "vocab.txt").write_text("\n".join(VOCAB) + "\n", encoding="utf-8")
    return model, d


def _weight_names(path) -> set[str]:
    from safetensors import safe_open

    with safe_open(str(path / "model.safetensors"), "pt") as f:
        return set(f.keys())


@pytest.mark.parametrize("arch", ["BertForMaskedLM", "BertForQuestionAnswering"])
def test_the_encoder_of_a_model_without_a_pooler_is_written_without_one(tmp_path, arch):
    """An MLM or QA checkpoint has no pooler: `--task embed` wrote the fresh init `load` gave it, so a BertModel
    loaded the export without a word and answered pooler_output from random weights. It is left out now, and
    transformers says it is missing, as for the source; the token vectors are the source's."""
    transformers = pytest.importorskip("transformers")
    _, src = _tiny(tmp_path, arch)
    out = export.export_hf(src, tmp_path / "out", "embed")
    names = _weight_names(out)
    assert not any(k.startswith("pooler.") for k in names), sorted(names)
    assert "embeddings.word_embeddings.weight" in names
    x = torch.tensor([[2, 5, 6, 7, 3], [2, 6, 3, 0, 0]])
    am = (x > 0).long()
    with torch.inference_mode():
        want = transformers.AutoModel.from_pretrained(src).eval()(x, attention_mask=am).last_hidden_state
        got = transformers.AutoModel.from_pretrained(out).eval()(x, attention_mask=am).last_hidden_state
    torch.testing.assert_close(got[am.bool()], want[am.bool()], atol=1e-5, rtol=0)
    # bertforge reads it back (serve --task embed, a second export) as the encoder it is
    model, _ = export.load(out, export.ENCODER)
    assert {"bert.pooler.dense.weight", "bert.pooler.dense.bias"} <= set(model.hf_load_info["initialised"])


def test_a_pooler_of_the_checkpoint_is_kept(tmp_path):
    """A BertModel's own (trained) pooler travels with the encoder: pooler_output equals the source's."""
    transformers = pytest.importorskip("transformers")
    source, src = _tiny(tmp_path, "BertModel")
    out = export.export_hf(src, tmp_path / "out")
    assert {"pooler.dense.weight", "pooler.dense.bias"} <= _weight_names(out)
    x = torch.tensor([[2, 5, 6, 7, 3]])
    with torch.inference_mode():
        want = source(x).pooler_output
        got = transformers.AutoModel.from_pretrained(out).eval()(x).pooler_output
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)


def test_the_tokenizers_added_tokens_are_copied(tmp_path):
    """A slow tokenizer keeps its added tokens in added_tokens.json: an export without it tokenized "cats" (an
    added token of the source) as the word pieces `cat ##s` in transformers."""
    transformers = pytest.importorskip("transformers")
    _, src = _tiny(tmp_path, "BertForMaskedLM")
    (src / "added_tokens.json").write_text(json.dumps({"cats": len(VOCAB)}), encoding="utf-8")
    want = transformers.AutoTokenizer.from_pretrained(src).tokenize("the cats sat")
    assert want == ["the", "cats", "sat"]  # the source's tokenizer holds the added token
    out = export.export_hf(src, tmp_path / "out")
    assert (out / "added_tokens.json").is_file()
    assert transformers.AutoTokenizer.from_pretrained(out).tokenize("the cats sat") == want


@pytest.mark.parametrize("where", ["../outside", "ABSOLUTE"])
def test_a_module_path_outside_the_model_is_refused(tmp_path, where):
    """modules.json names each sentence-transformers module's directory; `../outside` (or an absolute path) was
    copied to the export's temporary directory joined with it: a directory written beside --out (or anywhere),
    left there. Now it is one line naming modules.json, and nothing is written."""
    _, src = _tiny(tmp_path, "BertModel", "models/src")
    outside = tmp_path / "models" / "outside"  # src/../outside
    outside.mkdir()
    (outside / "config.json").write_text("{}", encoding="utf-8")
    path = str(outside) if where == "ABSOLUTE" else where
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}]
    modules.append({"idx": 1, "name": "1", "path": path, "type": "sentence_transformers.models.Pooling"})
    (src / "modules.json").write_text(json.dumps(modules), encoding="utf-8")
    exports = tmp_path / "exports"
    exports.mkdir()
    with pytest.raises(UserError, match=r"modules\.json: module path .* is not inside the model directory"):
        export.export_hf(src, exports / "out")
    assert sorted(p.name for p in exports.iterdir()) == []  # neither the export nor a copy beside it


def test_num_labels_against_the_trained_head_names_the_flag(tmp_path, capsys):
    """`--num-labels 3` for a 2-label classifier failed on the classifier's shape with "check config.json (a
    head's size comes from num_labels)": config.json was right, the flag was not. It is one line naming the flag
    and the head's count now; the head's own count exports, and so does a fresh head of the bare encoder."""
    from tests.helpers import one_line

    from bertforge.cli import main

    _, src = _tiny(tmp_path, "BertForSequenceClassification")  # transformers' default: 2 labels
    capsys.readouterr()  # transformers' progress bar while saving it
    args = ["export", "--model", str(src), "--format", "hf", "--out", str(tmp_path / "out")]
    for extra in ([], ["--init-head"]):  # --init-head starts a missing head, it never replaces a trained one
        assert main([*args, "--num-labels", "3", *extra]) == 2
        one_line(capsys.readouterr().err, "--num-labels 3", "2 label(s)", "--task embed")
        assert not (tmp_path / "out").exists()
    assert main([*args, "--num-labels", "2"]) == 0
    enc = export.export_hf(src, tmp_path / "enc", "embed")
    out = export.export_hf(enc, tmp_path / "fresh", "classify", init_head=True, num_labels=3)
    assert len(json.loads((out / "config.json").read_text())["id2label"]) == 3
