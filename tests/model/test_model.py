"""Fast paths vs their reference paths: masked-only vs dense MLM head, packed vs padded rows, SDPA vs eager
attention, torch.compile without graph breaks, bf16 autocast (activation checkpointing:
tests/runtime/test_activation.py)."""

from __future__ import annotations

import pytest
import torch

from bertforge.model import TASK_HEADS, BertConfig, build_model
from bertforge.model.attention import block_mask, varlen_meta

V = 101


def tiny(**kw) -> BertConfig:
    base = dict(
        vocab_size=V,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return BertConfig(**{**base, **kw})


def model_pair(task="pretraining", **kw):
    torch.manual_seed(0)
    a = build_model(tiny(**kw), task, attention="sdpa")
    b = build_model(tiny(**kw), task, attention="eager")
    b.load_state_dict(a.state_dict())
    return a, b


def test_masked_only_head_equals_dense_head_at_masked_positions():
    torch.manual_seed(0)
    model = build_model(tiny(), "pretraining").eval()
    ids = torch.randint(5, V, (3, 16))
    positions = torch.tensor([[1, 4, 9, 0], [2, 3, 15, 7], [6, 0, 0, 0]])
    labels = torch.randint(5, V, positions.shape)
    with torch.no_grad():
        sparse = model(ids, masked_positions=positions, masked_labels=labels)
        dense = model(ids)
    gathered = dense.mlm_logits.gather(1, positions[:, :, None].expand(-1, -1, V)).reshape(-1, V)
    torch.testing.assert_close(sparse.mlm_logits, gathered, atol=1e-5, rtol=0)
    # the loss is the mean over the 8 real slots only (position 0 = empty slot)
    valid = positions.reshape(-1) != 0
    ref = torch.nn.functional.cross_entropy(gathered[valid], labels.reshape(-1)[valid])
    torch.testing.assert_close(sparse.mlm_loss, ref, atol=1e-5, rtol=0)
    assert int(sparse.mlm_count) == 8
    assert int(sparse.mlm_correct) == int((gathered[valid].argmax(-1) == labels.reshape(-1)[valid]).sum())


def test_no_masked_slot_gives_zero_loss_not_nan():
    model = build_model(tiny(), "mlm")
    out = model(
        torch.randint(5, V, (2, 8)),
        masked_positions=torch.zeros(2, 3, dtype=torch.long),
        masked_labels=torch.zeros(2, 3, dtype=torch.long),
    )
    assert out.loss.item() == 0.0 and int(out.mlm_count) == 0


@pytest.mark.parametrize("task", list(TASK_HEADS))
def test_heads_own_only_their_parameters_and_run_on_what_they_are_given(task):
    torch.manual_seed(0)
    model = build_model(tiny(), task, num_labels=3).eval()
    spec = TASK_HEADS[task]
    head = getattr(model, spec.name)
    assert model.head is head and isinstance(head, torch.nn.Module)
    # the pooler and the tied decoder stay the encoder's: no parameter is reachable under two names
    ids = {id(p) for p in model.bert.parameters()}
    assert not any(id(p) in ids for p in head.parameters())
    assert len(list(model.parameters())) == len(list(model.named_parameters(remove_duplicate=False)))
    seq = torch.randn(2, 8, 32)
    shared = {"decoder_weight": model.bert.embeddings.word_embeddings.weight, "pooler": model.bert.pooler}
    batch = dict.fromkeys(
        (
            "masked_positions",
            "masked_labels",
            "nsp_positions",
            "nsp_labels",
            "labels",
            "start_positions",
            "end_positions",
        )
    )
    with torch.no_grad():
        out = head(seq, batch, **{k: shared[k] for k in spec.inputs})
    logits = {"pretraining": out.nsp_logits, "mlm": out.mlm_logits, "qa": out.start_logits}.get(task, out.logits)
    assert logits is not None and torch.isfinite(logits).all() and out.loss is None


SEQS = [5, 4, 7]  # three sequences: packed as [5 + 4] and [7 + padding]; padded one per row


def packed_and_padded(T=12):
    g = torch.Generator().manual_seed(3)
    seqs = [torch.randint(5, V, (n,), generator=g) for n in SEQS]
    types = [(torch.arange(n) >= n // 2).long() for n in SEQS]
    masked = [[1, 3], [2], [1, 4, 6]]  # within-sequence positions
    mlab = [torch.randint(5, V, (len(m),), generator=g) for m in masked]
    nsp = torch.tensor([1, 0, 1])
    P = 4
    # padded: one sequence per row
    pad = {k: torch.zeros(3, T, dtype=torch.long) for k in ("input_ids", "attention_mask", "token_type_ids")}
    pad_pos, pad_lab = torch.zeros(3, P, dtype=torch.long), torch.zeros(3, P, dtype=torch.long)
    for i, s in enumerate(seqs):
        n = len(s)
        pad["input_ids"][i, :n], pad["attention_mask"][i, :n], pad["token_type_ids"][i, :n] = s, 1, types[i]
        pad_pos[i, : len(masked[i])], pad_lab[i, : len(masked[i])] = torch.tensor(masked[i]), mlab[i]
    padded = dict(**pad, masked_positions=pad_pos, masked_labels=pad_lab, nsp_labels=nsp)
    # packed: rows [seq0 seq1] and [seq2]; sequence index in the mask, positions restart, shifted slots
    rows = [[0, 1], [2]]
    pk = {
        k: torch.zeros(2, T, dtype=torch.long)
        for k in ("input_ids", "attention_mask", "token_type_ids", "position_ids")
    }
    pk_pos, pk_lab = torch.zeros(2, P + 2, dtype=torch.long), torch.zeros(2, P + 2, dtype=torch.long)
    nsp_pos, nsp_lab = torch.zeros(2, 2, dtype=torch.long), torch.full((2, 2), -1)
    where = {}
    for r, members in enumerate(rows):
        off, slot = 0, 0
        for k, i in enumerate(members):
            n = len(seqs[i])
            pk["input_ids"][r, off : off + n] = seqs[i]
            pk["attention_mask"][r, off : off + n] = k + 1
            pk["token_type_ids"][r, off : off + n] = types[i]
            pk["position_ids"][r, off : off + n] = torch.arange(n)
            for p, lab in zip(masked[i], mlab[i]):
                pk_pos[r, slot], pk_lab[r, slot] = off + p, lab
                slot += 1
            nsp_pos[r, k], nsp_lab[r, k] = off, nsp[i]
            where[i] = (r, off, n)
            off += n
    packed = dict(**pk, masked_positions=pk_pos, masked_labels=pk_lab, nsp_positions=nsp_pos, nsp_labels=nsp_lab)
    return padded, packed, where


@pytest.mark.parametrize("attention", ["sdpa", "eager", "auto", "varlen"])
def test_packed_rows_equal_padded_rows(attention):
    torch.manual_seed(0)
    model = build_model(tiny(), "pretraining", attention=attention).eval()
    padded, packed, where = packed_and_padded()
    a = model(**padded)
    b = model(**packed)
    for i, (r, off, n) in where.items():
        torch.testing.assert_close(b.last_hidden_state[r, off : off + n], a.last_hidden_state[i, :n], atol=1e-5, rtol=0)
    torch.testing.assert_close(b.loss, a.loss, atol=1e-5, rtol=0)
    assert int(b.mlm_count) == int(a.mlm_count) == 6 and int(b.nsp_count) == int(a.nsp_count) == 3
    # NSP logits of each packed [CLS] equal the padded row's
    nsp_b = b.nsp_logits.view(2, 2, 2)
    torch.testing.assert_close(nsp_b[0, 0], a.nsp_logits[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(nsp_b[0, 1], a.nsp_logits[1], atol=1e-5, rtol=0)
    torch.testing.assert_close(nsp_b[1, 0], a.nsp_logits[2], atol=1e-5, rtol=0)
    # and so are the gradients (the correctness test of packing, DESIGN §3.3)
    ga = torch.autograd.grad(a.loss, list(model.parameters()), allow_unused=True)
    gb = torch.autograd.grad(b.loss, list(model.parameters()), allow_unused=True)
    for (name, _), x, y in zip(model.named_parameters(), ga, gb):
        if x is not None:
            torch.testing.assert_close(y, x, atol=1e-5, rtol=1e-4, msg=name)


def test_block_mask_rules():
    m = block_mask(torch.tensor([[1, 1, 2, 0], [0, 0, 0, 0]]))[:, 0]
    assert m[0].tolist() == [
        [True, True, False, False],
        [True, True, False, False],
        [False, False, True, False],
        [True, True, True, False],
    ]  # padding sees real keys
    assert m[1].all()  # an all-padding row attends everywhere: no empty softmax, no NaN


def test_sdpa_equals_eager_reference_and_no_nan_on_empty_rows():
    a, b = model_pair("pretraining")
    ids = torch.randint(5, V, (3, 10))
    mask = torch.tensor([[1] * 10, [1] * 6 + [0] * 4, [0] * 10])
    with torch.no_grad():
        x, y = a.eval()(ids, mask), b.eval()(ids, mask)
    torch.testing.assert_close(x.last_hidden_state, y.last_hidden_state, atol=1e-5, rtol=0)
    assert torch.isfinite(x.last_hidden_state).all()


@pytest.mark.parametrize("attention", ["sdpa", "auto", "eager"])
def test_encoder_traces_without_graph_breaks(attention):
    torch._dynamo.reset()
    model = build_model(tiny(), "pretraining", attention=attention)
    ids = torch.randint(5, V, (2, 8))
    mask = torch.tensor([[1] * 8, [1] * 5 + [0] * 3])
    explain = torch._dynamo.explain(model.bert)(ids, mask)
    assert explain.graph_break_count == 0, explain.break_reasons
    explain = torch._dynamo.explain(model)(
        ids, mask, masked_positions=torch.tensor([[1, 2], [3, 0]]), masked_labels=torch.tensor([[7, 8], [9, 0]])
    )
    assert explain.graph_break_count == 0, explain.break_reasons


@pytest.mark.slow
def test_compiled_training_step_matches_eager():
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = build_model(tiny(), "pretraining")
    compiled = torch.compile(model, fullgraph=True)
    ids = torch.randint(5, V, (2, 8))
    kw = dict(
        masked_positions=torch.tensor([[1, 2], [3, 0]]),
        masked_labels=torch.tensor([[7, 8], [9, 0]]),
        nsp_labels=torch.tensor([0, 1]),
    )
    ref = model(ids, **kw).loss
    out = compiled(ids, **kw).loss
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    out.backward()


def test_bf16_autocast_runs_and_stays_close():
    torch.manual_seed(0)
    model = build_model(tiny(), "pretraining").eval()
    ids = torch.randint(5, V, (2, 8))
    kw = dict(
        masked_positions=torch.tensor([[1, 2], [3, 0]]),
        masked_labels=torch.tensor([[7, 8], [9, 0]]),
        nsp_labels=torch.tensor([0, 1]),
    )
    ref = model(ids, **kw)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(ids, **kw)
    assert out.mlm_logits.dtype == torch.bfloat16 and out.loss.dtype == torch.float32
    assert abs(out.loss.item() - ref.loss.item()) < 0.05
    out.loss.backward()


def test_roberta_positions_offset_and_packed_positions():
    torch.manual_seed(0)
    cfg = tiny(model_type="roberta", pad_token_id=1, type_vocab_size=1, max_position_embeddings=20)
    model = build_model(cfg, "mlm").eval()
    ids = torch.randint(5, V, (1, 6))
    # explicit 0-based positions are offset by pad + 1, the same as the default rule from input_ids
    a = model(ids).last_hidden_state
    b = model(ids, position_ids=torch.arange(6)[None]).last_hidden_state
    torch.testing.assert_close(a, b)


def test_unknown_task_and_attention_are_config_errors():
    from bertforge.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown task"):
        build_model(tiny(), "summarisation")
    with pytest.raises(ConfigError, match="attention must be"):
        build_model(tiny(), "qa", attention="flash")


def test_varlen_meta_boundaries():
    meta = varlen_meta(torch.tensor([[1, 1, 2, 2, 2, 0], [1, 1, 1, 0, 0, 0]]))
    assert meta.indices.tolist() == [0, 1, 2, 3, 4, 6, 7, 8]
    assert meta.cu_seqlens.tolist() == [0, 2, 5, 8] and meta.max_seqlen == 3


def test_unpadded_varlen_path_on_cpu_matches_sdpa_and_skips_padding():
    """attention="varlen" off CUDA: matmuls on the real tokens only, attention by SDPA on the re-padded batch."""
    torch.manual_seed(0)
    a = build_model(tiny(), "pretraining", attention="sdpa").eval()
    b = build_model(tiny(), "pretraining", attention="varlen").eval()
    b.load_state_dict(a.state_dict())
    ids = torch.randint(5, V, (3, 10))
    mask = torch.tensor([[1] * 10, [1] * 6 + [0] * 4, [1] * 3 + [0] * 7])
    rows = []
    b.bert.encoder.layer[0].intermediate.dense.register_forward_hook(lambda m, i, o: rows.append(i[0].shape[0]))
    x, y = a(ids, mask), b(ids, mask)
    assert rows == [19]  # (N, H): 10 + 6 + 3 real tokens went through the FFN, not 30
    real = mask.bool()
    torch.testing.assert_close(y.last_hidden_state[real], x.last_hidden_state[real], atol=1e-5, rtol=0)
    assert (y.last_hidden_state[~real] == 0).all()


def test_flash_varlen_plumbing_with_a_reference_kernel(monkeypatch):
    """The CUDA flash path's plumbing (unpad, cu_seqlens, scatter back) run on CPU with a per-sequence
    reference standing in for the flash kernel: same per-sequence outputs as padded SDPA."""
    from bertforge.model import attention as attn

    calls = []

    def reference_varlen(q, k, v, meta, dropout_p, half_window=None):  # (N, nh, D) each
        calls.append(q.shape[0])
        out = torch.empty_like(q)
        cu = meta.cu_seqlens.tolist()
        for s, e in zip(cu[:-1], cu[1:]):
            out[s:e] = torch.nn.functional.scaled_dot_product_attention(
                q[s:e].transpose(0, 1), k[s:e].transpose(0, 1), v[s:e].transpose(0, 1)
            ).transpose(0, 1)
        assert meta.max_seqlen == max(e - s for s, e in zip(cu[:-1], cu[1:]))
        return out

    monkeypatch.setattr(attn, "varlen_usable", lambda h, d: True)
    monkeypatch.setattr(attn, "varlen", reference_varlen)
    torch.manual_seed(0)
    model = build_model(tiny(), "pretraining", attention="auto").eval()
    padded, packed, where = packed_and_padded()
    monkeypatch.setattr(model.bert, "attention_impl", "sdpa")
    a = model(**padded)
    monkeypatch.setattr(model.bert, "attention_impl", "auto")
    b = model(**packed)
    for i, (r, off, n) in where.items():
        torch.testing.assert_close(b.last_hidden_state[r, off : off + n], a.last_hidden_state[i, :n], atol=1e-5, rtol=0)
    torch.testing.assert_close(b.loss, a.loss, atol=1e-5, rtol=0)
    assert calls == [16, 16]  # both layers, on the 5 + 4 + 7 real tokens only
