"""Instance creation and vocab loading against Google BERT's `create_pretraining_data.py` / `tokenization.py`.

`_google_document` below is Google's `create_instances_from_document` line by line (NVIDIA's and MLPerf's
copies are the same loop), with `rng.randint(a, b)` written as `a + int(rng.random() * (b - a + 1))`, the
form our port draws. Fed the same stream of uniforms, both must produce the same instances, token for token:
every branch (target length, A/B split, random next, the retries, putting segments back) is then checked
exactly, not only in distribution. The one deliberate difference (DESIGN §3.1): when 10 tries only found the
same document, Google labels the pair random-next and we label it IsNext; `google_label` switches.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from bertforge.data.instances import _document_instances, _Instances
from bertforge.data.vocab import load_tokenizer, read_vocab_txt


def _google_document(docs, di, max_seq_length, short_seq_prob, rand, google_label=False):
    """Google's create_instances_from_document (before truncation): [(tokens_a, tokens_b, is_random_next)]."""

    def randint(a, b):
        return a + int(rand() * (b - a + 1))

    document = docs[di]
    max_num_tokens = max_seq_length - 3
    target_seq_length = max_num_tokens
    if rand() < short_seq_prob:
        target_seq_length = randint(2, max_num_tokens)
    instances = []
    current_chunk: list = []
    current_length = 0
    i = 0
    while i < len(document):
        segment = document[i]
        current_chunk.append(segment)
        current_length += len(segment)
        if i == len(document) - 1 or current_length >= target_seq_length:
            a_end = 1
            if len(current_chunk) >= 2:
                a_end = randint(1, len(current_chunk) - 1)
            tokens_a = [t for j in range(a_end) for t in current_chunk[j]]
            tokens_b: list = []
            if len(current_chunk) == 1 or rand() < 0.5:
                target_b_length = target_seq_length - len(tokens_a)
                for _ in range(10):
                    random_document_index = randint(0, len(docs) - 1)
                    if random_document_index != di:
                        break
                random_document = docs[random_document_index]
                random_start = randint(0, len(random_document) - 1)
                for j in range(random_start, len(random_document)):
                    tokens_b.extend(random_document[j])
                    if len(tokens_b) >= target_b_length:
                        break
                i -= len(current_chunk) - a_end
                is_random_next = google_label or random_document_index != di
            else:
                is_random_next = False
                tokens_b = [t for j in range(a_end, len(current_chunk)) for t in current_chunk[j]]
            instances.append((tokens_a, tokens_b, int(is_random_next)))
            current_chunk = []
            current_length = 0
        i += 1
    return instances


def _ours(tokens, offsets, firsts, counts, di, max_seq_length, short_seq_prob, rand):
    out = _Instances()
    _document_instances(di, firsts, counts, offsets, rand, max_seq_length - 3, short_seq_prob, out)
    a = out.arrays()
    return [
        (tokens[s : s + n].tolist(), tokens[bs : bs + bn].tolist(), int(label))
        for s, n, bs, bn, label in zip(a["a_start"], a["a_len"], a["b_start"], a["b_len"], a["label"])
    ]


def _flatten(docs):
    lens = [len(s) for d in docs for s in d]
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64).tolist()
    counts = [len(d) for d in docs]
    firsts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64).tolist()
    tokens = np.array([t for d in docs for s in d for t in s], dtype=np.int64)
    return tokens, offsets, firsts, counts


def test_document_instances_equal_googles_on_the_same_draws():
    rng = np.random.default_rng(0)
    for _ in range(150):
        counts = rng.integers(1, 12, int(rng.integers(1, 6)))
        next_token = iter(range(10**6))
        docs = [[[next(next_token) for _ in range(int(rng.integers(1, 40)))] for _ in range(c)] for c in counts]
        tokens, offsets, firsts, counts_l = _flatten(docs)
        seq = int(rng.choice([8, 16, 32, 64, 128]))
        ssp = float(rng.choice([0.0, 0.5, 1.0]))
        for di in range(len(docs)):
            seed = int(rng.integers(1 << 30))
            r_ref, r_ours = random.Random(seed), random.Random(seed)
            want = _google_document(docs, di, seq, ssp, r_ref.random)
            assert _ours(tokens, offsets, firsts, counts_l, di, seq, ssp, r_ours.random) == want
            assert r_ref.random() == r_ours.random()  # the same number of draws


def test_document_instances_equal_googles_on_real_text(shared_data):
    tok = load_tokenizer(shared_data / "bert_vocab" / "bert-base-uncased-vocab.txt")
    docs: list[list[list[int]]] = [[]]
    for line in (shared_data / "bert_sample_text" / "sample_text.txt").read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line:
            docs.append([])
        elif ids := tok.encode(line, add_special_tokens=False).ids:
            docs[-1].append(ids)
    docs = [d for d in docs if d]
    assert len(docs) == 3
    tokens, offsets, firsts, counts = _flatten(docs)
    for seed in range(20):
        for seq, ssp in ((128, 0.1), (32, 0.5), (16, 1.0)):
            for di in range(len(docs)):
                r_ref, r_ours = random.Random(seed), random.Random(seed)
                want = _google_document(docs, di, seq, ssp, r_ref.random)
                assert _ours(tokens, offsets, firsts, counts, di, seq, ssp, r_ours.random) == want


def test_a_duplicated_vocab_line_takes_its_last_id_as_google_and_hugging_face(tmp_path):
    # Google's load_vocab, transformers' BertTokenizer and tokenizers' WordPiece.read_file: the last line wins
    path = tmp_path / "vocab.txt"
    path.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\nworld\nhello\nfoo\n", encoding="utf-8")
    tokenizers = pytest.importorskip("tokenizers")
    assert read_vocab_txt(path) == tokenizers.models.WordPiece.read_file(str(path))
    assert load_tokenizer(path).encode("hello foo world", add_special_tokens=False).ids == [7, 8, 6]
