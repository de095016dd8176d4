"""Vocabularies: train a WordPiece or a byte-level BPE one with Hugging Face `tokenizers`, or load a vocab.txt /
tokenizer.json.

Layout of a vocab directory (`bertforge data vocab --out DIR`): WordPiece writes `vocab.txt` and
`tokenizer.json`; BPE writes `tokenizer.json` only (a BPE model is its merges as well as its tokens, which a
vocab.txt cannot hold). `load_tokenizer(DIR)` prefers tokenizer.json, so both load the same way, and the shard
manifest records which model it was (`tokenizer_model`).

A trained vocab keeps BERT's layout of special tokens: `[PAD]` = 0, then the optional `[unusedN]` slots, then
`[UNK] [CLS] [SEP] [MASK]` (bert-base-uncased has [PAD]=0, [unused0..98], [UNK]=100, [CLS]=101, [SEP]=102,
[MASK]=103). Both files are written: `vocab.txt` (one token per line, the id is the line number, what Google
and NVIDIA read) and `tokenizer.json` (what `tokenizers`/`transformers` load, normalizer included).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from bertforge.errors import UserError
from bertforge.runtime.io import write_bytes, write_text

BERT_SPECIALS = {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"}
# RoBERTa-style BPE tokenizers name the same roles differently
ROBERTA_SPECIALS = {"pad": "<pad>", "unk": "<unk>", "cls": "<s>", "sep": "</s>", "mask": "<mask>"}


def read_vocab_txt(path: str | os.PathLike) -> dict[str, int]:
    """token -> id from a vocab.txt (id = line number; a duplicated token takes its last line's id, as Google's
    `load_vocab`, Hugging Face's BertTokenizer and `tokenizers`' WordPiece read it, so ids match a checkpoint).
    A leading byte-order mark (Windows editors write one) is dropped: kept, it would rename the first token
    ("\ufeff[PAD]"), and a vocab opening with [UNK] would have none."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8-sig").split("\n")
    except UnicodeDecodeError as e:
        raise UserError(f"vocab {path} is not UTF-8 text ({e}); give a vocab.txt with one token per line") from e
    if lines and lines[-1] == "":
        lines.pop()
    vocab: dict[str, int] = {}
    for i, tok in enumerate(lines):
        vocab[tok.rstrip("\r")] = i
    return vocab


def vocab_rows(tok: Tokenizer) -> int:
    """Embedding rows a model needs for `tok`'s ids: its highest id + 1. A vocab.txt with a repeated line has fewer
    tokens (`get_vocab_size`) than that: its later tokens keep their line numbers as ids."""
    return max(tok.get_vocab().values(), default=-1) + 1


def _guess_lowercase(path: Path, vocab: dict[str, int]) -> bool:
    name = path.name.lower()
    if "uncased" in name:
        return True
    if "cased" in name:
        return False
    # an uncased vocab holds only what lower-casing leaves unchanged outside the [SPECIAL] tokens; "upper-case"
    # letters with no lower case (the double-struck ℂ, ℝ of maths text) survive lower-casing in uncased vocabs too
    return all(t == t.lower() for t in vocab if not (t.startswith("[") and t.endswith("]")))


def wordpiece_from_vocab(vocab: dict[str, int], lowercase: bool) -> Tokenizer:
    """A BERT WordPiece tokenizer (normalizer, pre-tokenizer, model, post-processor) over `vocab`."""
    tok = _bert_wordpiece(lowercase, vocab)
    # registered as special, "[MASK]" in a text stays one token (else: "[", "mask", "]"), as in Hugging Face's BERT
    tok.add_special_tokens([t for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]") if t in vocab])
    if "[CLS]" in vocab and "[SEP]" in vocab:
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]",
            pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
        )
    return tok


def corpus_tokenizer(tok: Tokenizer) -> Tokenizer:
    """A copy of `tok` for pre-training corpus text: its special tokens ([MASK], [SEP], <mask>, ...) are not
    matched in the text, which splits a literal "[MASK]" as any other text ("[", "mask", "]"), on every line
    alike, as Google's create_pretraining_data does (its BasicTokenizer knows no special tokens). Ids do not
    change (the specials stay in the model's vocab). Fine-tuning and serving keep `tok`: there a fill-mask
    input's [MASK] is the mask."""
    data = json.loads(tok.to_str())
    data["added_tokens"] = [t for t in data.get("added_tokens") or [] if not t.get("special")]
    return Tokenizer.from_str(json.dumps(data))


_LOADED: dict[tuple, Tokenizer] = {}


def load_tokenizer(path: str | os.PathLike, lowercase: bool | None = None, cache: bool = False) -> Tokenizer:
    """A `tokenizers.Tokenizer` from a vocab.txt, a tokenizer.json, or a directory holding one (a model
    directory too): the one tokenizer loader of bertforge (data, pretraining, fine-tuning, serving).

    A directory prefers tokenizer.json. For a vocab.txt, `lowercase=None` takes `do_lower_case` from a
    tokenizer_config.json beside it (Hugging Face model directories, as transformers reads them), else the
    tokenizer.json beside it when that holds the same tokens (what `data vocab` wrote with it), else guesses from
    the file name ("uncased"/"cased") and then from the tokens. A tokenizer.json carries its own normalizer, so
    `lowercase` is ignored for it. Truncation and padding are off (a sentence-transformers tokenizer.json pads
    and cuts to 128; windows and padding are the caller's). The vocab must contain [CLS], [SEP] and [MASK] (or
    <s>, </s>, <mask>), and the unknown-word token its model names ([UNK]). `cache=True` returns one shared
    tokenizer per file and setting (the shard workers': do not modify it).
    """
    path = tokenizer_file(Path(path))
    if cache:
        st = path.stat()
        key = (str(path.resolve()), st.st_size, st.st_mtime_ns, lowercase)
        if key not in _LOADED:
            _LOADED[key] = load_tokenizer(path, lowercase)
        return _LOADED[key]
    if lowercase is None and path.suffix != ".json" and _config_lowercase(path.parent) is None:
        # the casing `data vocab --cased/--uncased` chose is in the tokenizer.json written beside the vocab.txt;
        # a guess from the tokens could differ, and shards would then be built with another tokenizer than
        # the one checkpoints ship (`save_hf_tokenizer` takes that tokenizer.json too). A tokenizer_config.json's
        # do_lower_case still decides first: transformers' BertTokenizer(Fast) rebuilds the normalizer from it
        path = tokenizer_source(path)
    if path.suffix == ".json":
        try:
            tok = Tokenizer.from_file(str(path))
        except Exception as e:  # tokenizers raises a plain Exception on malformed JSON
            raise UserError(f"{path} is not a valid tokenizer.json ({e})") from e
    else:
        vocab = read_vocab_txt(path)
        if lowercase is None:
            lowercase = _config_lowercase(path.parent)
        if lowercase is None:
            lowercase = _guess_lowercase(path, vocab)
        tok = wordpiece_from_vocab(vocab, lowercase)
    special_ids(tok, source=path)  # raises when [CLS]/[SEP]/[MASK] are missing
    unk = getattr(tok.model, "unk_token", None)
    if unk and unk not in tok.get_vocab():
        # else the first word it cannot spell stops tokenization with a Rust error, hours into `data shards`
        raise UserError(
            f"vocab {path} lacks the token {unk}, which every word it cannot spell becomes; add {unk} to it "
            "(Google's vocab.txt files have [UNK] on line 101, id 100)"
        )
    tok.no_truncation()
    tok.no_padding()
    return tok


def tokenizer_file(path: Path) -> Path:
    """The tokenizer file a path names: itself, or a directory's tokenizer.json, else its vocab.txt."""
    if path.is_dir():
        for name in ("tokenizer.json", "vocab.txt"):
            if (path / name).is_file():
                return path / name
        raise UserError(f"vocab directory {path} has neither tokenizer.json nor vocab.txt")
    if not path.is_file():
        raise UserError(f"vocab {path} does not exist; give a vocab.txt, a tokenizer.json or a directory holding one")
    return path


def _config_lowercase(directory: Path) -> bool | None:
    """`do_lower_case` of a Hugging Face tokenizer_config.json in `directory`, or None."""
    cfg = directory / "tokenizer_config.json"
    if not cfg.is_file():
        return None
    try:
        value = json.loads(cfg.read_text(encoding="utf-8")).get("do_lower_case")
    except (ValueError, UnicodeDecodeError, AttributeError):
        return None
    return bool(value) if value is not None else None


def special_ids(tok: Tokenizer, source: str | os.PathLike = "the vocab") -> dict[str, int]:
    """Ids of pad/unk/cls/sep/mask ([PAD] ... or RoBERTa's <pad> ...); an error when cls/sep/mask are missing."""
    vocab = tok.get_vocab()
    for names in (BERT_SPECIALS, ROBERTA_SPECIALS):
        if all(names[r] in vocab for r in ("cls", "sep", "mask")):
            ids = {role: vocab[t] for role, t in names.items() if t in vocab}
            ids.setdefault("pad", 0)
            return ids
    missing = [t for t in ("[CLS]", "[SEP]", "[MASK]") if t not in vocab]
    raise UserError(
        f"vocab {source} lacks the special tokens {', '.join(missing)}; BERT pre-training needs [CLS], [SEP] "
        "and [MASK] - use a BERT vocab or train one with `bertforge data vocab`"
    )


def continuation_table(tok: Tokenizer) -> np.ndarray:
    """bool [vocab_size]: True where a token continues the previous word (whole-word masking).

    WordPiece marks continuations with "##" (Google BERT's whole-word masking joins them to the previous
    word); byte-level BPE marks word starts with "Ġ" instead, so there every other non-special token continues.
    """
    vocab = tok.get_vocab()
    table = np.zeros(max(vocab.values()) + 1, dtype=bool)
    model = tok.model
    if isinstance(model, models.WordPiece):
        prefix = model.continuing_subword_prefix or "##"
        for t, i in vocab.items():
            table[i] = t.startswith(prefix) and len(t) > len(prefix)
    elif isinstance(model, models.BPE):
        specials = set(ROBERTA_SPECIALS.values()) | set(BERT_SPECIALS.values())
        for t, i in vocab.items():
            table[i] = not t.startswith("Ġ") and t not in specials
    return table


def tokenizer_model(tok: Tokenizer) -> str:
    """ "wordpiece", "bpe" (or the model's class name, lower-cased): what a manifest records."""
    return type(tok.model).__name__.lower()


def vocab_hash(path: str | os.PathLike) -> str:
    """sha256 of the vocab file (of vocab.txt/tokenizer.json when given a directory)."""
    path = Path(path)
    if path.is_dir():
        path = next(p for p in (path / "vocab.txt", path / "tokenizer.json") if p.is_file())
    return hashlib.sha256(path.read_bytes()).hexdigest()


def casing_beyond_hash(path: str | os.PathLike, tok: Tokenizer) -> str | None:
    """The casing of `tok` (loaded from `path` without --cased/--uncased) where `vocab_hash(path)` cannot see it:
    a vocab.txt (or a directory's) read through the tokenizer.json beside it with another casing than the
    vocab.txt alone gives. `data vocab --from X --uncased` rewrites only that tokenizer.json, so shards keyed on
    the vocab's hash alone would be kept with the old casing. None where they agree: hashes stay as they were."""
    path = Path(path)
    txt = path / "vocab.txt" if path.is_dir() else path
    if txt.suffix == ".json" or not txt.is_file() or not isinstance(tok.model, models.WordPiece):
        return None
    vocab = read_vocab_txt(txt)
    config = _config_lowercase(txt.parent)
    alone = wordpiece_from_vocab(vocab, _guess_lowercase(txt, vocab) if config is None else config)
    ours, theirs = _casing(tok), _casing(alone)
    return None if ours == theirs or ours is None else f"lowercase={ours[0]},strip_accents={ours[1]}"


def _casing(tok: Tokenizer) -> tuple[bool, bool] | None:
    """(lower-cases, strips accents) of a BERT normalizer (strip_accents None follows lowercase, as in HF)."""
    norm = json.loads(tok.to_str()).get("normalizer") or {}
    if norm.get("type") != "BertNormalizer":
        return None
    lower = bool(norm.get("lowercase", True))
    strip = norm.get("strip_accents")
    return lower, lower if strip is None else bool(strip)


def save_tokenizer(tok: Tokenizer, out_dir: str | os.PathLike, vocab_txt: Path | None = None) -> Path:
    """Write tokenizer.json and, for WordPiece, vocab.txt (tokens in id order) into `out_dir`, atomically; returns
    the dir. A byte-level BPE vocab has no vocab.txt: its tokens (Ġ-prefixed) read as WordPiece would be mostly
    [UNK]. `vocab_txt`: the vocab.txt `tok` was read from, written as it is (its line endings, and a repeated
    line, whose earlier id no token of `tok` holds: the tokens alone cannot say what that line was)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    vocab = tok.get_vocab()
    by_id = sorted(vocab.items(), key=lambda kv: kv[1])
    wordpiece = isinstance(tok.model, models.WordPiece)
    if [i for _, i in by_id] != list(range(len(by_id))) and not (wordpiece and vocab_txt is not None):
        raise UserError(
            f"tokenizer ids are not contiguous 0..{len(by_id) - 1} (a vocab.txt with a repeated line?); cannot "
            f"write {out}"
        )
    write_text(out / "tokenizer.json", tok.to_str(pretty=True))  # first: a vocab.txt alone is someone else's
    if wordpiece and vocab_txt is not None:
        write_bytes(out / "vocab.txt", vocab_txt.read_bytes())
    elif wordpiece:
        write_text(out / "vocab.txt", "".join(t + "\n" for t, _ in by_id))
    return out


def tokenizer_source(vocab_file: Path) -> Path:
    """The file that defines a vocab's tokenizer: a vocab.txt's sibling tokenizer.json when it holds the same
    tokens (it carries the normalizer, lower-casing included, that a vocab.txt can only be guessed from), else
    the file itself."""
    sibling = vocab_file.with_name("tokenizer.json")
    if vocab_file.name != "tokenizer.json" and sibling.is_file():
        try:
            if Tokenizer.from_file(str(sibling)).get_vocab() == read_vocab_txt(vocab_file):
                return sibling
        except Exception:  # tokenizers raises a plain Exception on malformed JSON: keep the vocab.txt
            pass
    return vocab_file


def save_hf_tokenizer(vocab_file: Path, out_dir: Path, model_max_length: int) -> None:
    """The tokenizer files of a Hugging Face model directory, so that `AutoTokenizer` (and the fill-mask pipeline)
    loads the tokenizer the model was trained with, whatever the architecture: tokenizer.json (normalizer,
    post-processor), tokenizer_config.json (class, special tokens, lower-casing), and for WordPiece vocab.txt
    (Google's and NVIDIA's readers)."""
    src = tokenizer_source(vocab_file)
    tok = load_tokenizer(src)
    by_id = {i: t for t, i in tok.get_vocab().items()}
    names = {role: by_id[i] for role, i in special_ids(tok, source=src).items() if i in by_id}
    config: dict[str, object] = {f"{role}_token": t for role, t in names.items()}
    config["model_max_length"] = model_max_length
    if isinstance(tok.model, models.WordPiece):
        normalizer = json.loads(tok.to_str()).get("normalizer") or {}
        config.update(tokenizer_class="BertTokenizer", do_lower_case=bool(normalizer.get("lowercase", False)))
        # a vocab.txt (whatever its name) is copied byte for byte: its line endings, its repeated lines, which a
        # vocab.txt written from the tokens cannot hold (a checkpoint of a run on such a vocab failed to save)
        save_tokenizer(tok, out_dir, vocab_txt=None if vocab_file.suffix == ".json" else vocab_file)
    else:
        config["tokenizer_class"] = "PreTrainedTokenizerFast"
        write_text(out_dir / "tokenizer.json", tok.to_str(pretty=True))
    write_text(out_dir / "tokenizer_config.json", json.dumps(config, indent=2) + "\n")


def document_lines(path: Path) -> Iterator[str]:
    """The lines of a documents file (`data vocab` and `data shards` read them); bytes that are not UTF-8 are one
    line naming the file."""
    try:
        with open(path, encoding="utf-8") as f:
            yield from f
    except UnicodeDecodeError as e:
        raise UserError(f"{path} is not UTF-8 text ({e}); convert it or clean it with `bertforge data docs`") from e


def iter_document_lines(paths: Iterable[Path]) -> Iterator[str]:
    for p in paths:
        yield from (line for line in document_lines(p) if line.strip())


def _continuation_symbols(tok: Tokenizer, paths: list[Path]) -> list[str]:
    """The "##c" symbols of every character that continues a word in the corpus, sorted; [] when it has no words.

    The trainer numbers these symbols in the order it meets them while iterating a Rust HashMap of words, which
    is seeded at random per process, and breaks ties between equally frequent merges by symbol id: so the same
    corpus gave different vocabs (different tokens, not only a different order). Handing them to the trainer
    as fixed tokens in a sorted order makes every id, and so every tie, the same on every run.

    BertNormalizer maps each character on its own, so the raw text's characters and their neighbours say it
    all without normalizing the corpus (which alone would take longer than the training).
    """
    roles: dict[str, _CharRole] = {}
    found: set[str] = set()
    words = False
    for chunk in _line_chunks(iter_document_lines(paths)):
        for ch in set(chunk) - roles.keys():
            roles[ch] = _char_role(tok, ch)
        found.update(*(roles[ch].inner for ch in set(chunk)))
        words = words or any(roles[ch].word for ch in set(chunk))
        codes = np.frombuffer(chunk.encode("utf-32-le"), dtype=np.uint32)
        codes = codes[~np.isin(codes, _codes(roles, "vanishes"))]  # (n,) what the normalizer keeps
        joined = np.isin(codes[:-1], _codes(roles, "joins_right")) & np.isin(codes[1:], _codes(roles, "joins_left"))
        for c in np.unique(codes[1:][joined]).tolist():
            found.update(roles[chr(c)].first)
    return ["##" + c for c in sorted(found)] if words else []


@dataclasses.dataclass(frozen=True)
class _CharRole:
    """What one raw character becomes in a word: its normalized form n, split by the pre-tokenizer."""

    vanishes: bool  # n == "" (control characters, combining accents when uncased)
    joins_left: bool  # n's first character joins a word character before it
    joins_right: bool  # n's last character joins a word character after it
    first: str  # what continues a word when it joins one on its left: n's first character
    inner: str  # what continues a word wherever it stands: every non-first character of n's pieces
    word: bool  # n holds a word character at all


def _char_role(tok: Tokenizer, ch: str) -> _CharRole:
    assert tok.normalizer is not None and tok.pre_tokenizer is not None
    n = tok.normalizer.normalize_str(ch)
    pieces = [w for w, _ in tok.pre_tokenizer.pre_tokenize_str(n)]
    left = bool(n) and [w for w, _ in tok.pre_tokenizer.pre_tokenize_str("a" + n)][0] != "a"
    right = bool(n) and [w for w, _ in tok.pre_tokenizer.pre_tokenize_str(n + "a")][-1] != "a"
    return _CharRole(not n, left, right, n[0] if left else "", "".join(w[1:] for w in pieces), bool(pieces))


def _codes(roles: dict[str, _CharRole], flag: str) -> np.ndarray:
    return np.array([ord(c) for c, r in roles.items() if getattr(r, flag)], dtype=np.uint32)


def _line_chunks(lines: Iterable[str], size: int = 1 << 20) -> Iterator[str]:
    """Lines joined into chunks of about `size` characters (they end in a newline, so no word spans two)."""
    buf: list[str] = []
    n = 0
    for line in lines:
        buf.append(line if line.endswith("\n") else line + "\n")
        n += len(line)
        if n >= size:
            yield "".join(buf)
            buf, n = [], 0
    if buf:
        yield "".join(buf)


def _bert_wordpiece(lowercase: bool, vocab: dict[str, int] | None = None) -> Tokenizer:
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=100))
    # BertNormalizer: clean control chars, split CJK chars, lower-case + strip accents when uncased (Google BERT)
    tok.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=lowercase, lowercase=lowercase
    )
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    return tok


def _training_inputs(files: Iterable[str | os.PathLike], unused_tokens: int) -> tuple[list[Path], list[str]]:
    """The document files (an error when there are none) and the special tokens of a trained vocab, BERT's
    layout: [PAD] = 0, the [unusedN] slots, [UNK] [CLS] [SEP] [MASK]."""
    paths = [Path(f) for f in files]
    if not paths:
        raise UserError("no document files to train a vocab on; run `bertforge data docs` or `data wiki` first")
    return paths, ["[PAD]"] + [f"[unused{i}]" for i in range(unused_tokens)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def check_vocab_room(model: str, vocab_size: int, unused_tokens: int, flag: str = "--vocab-size") -> None:
    """A UserError when `vocab_size` leaves no room beyond the special tokens ([PAD] [UNK] [CLS] [SEP] [MASK] and
    the [unusedN] slots) and the alphabet: 26 letters for WordPiece, 256 bytes for byte-level BPE (whose size is
    rounded up first). `data prepare` asks before its documents step, the trainers before training."""
    specials = 5 + unused_tokens
    size, base, what = vocab_size, specials + 26, "an alphabet"
    if model == "bpe":
        size, base, what = round_vocab_size(vocab_size), specials + 256, "256 bytes"
    if size <= base:
        raise UserError(
            f"{flag} {vocab_size} is too small for a {model} vocab of {specials} special tokens (BERT's 5 and "
            f"unused_tokens {unused_tokens}) plus {what}: set it above {base}"
        )


def train_wordpiece(
    files: Iterable[str | os.PathLike],
    out_dir: str | os.PathLike,
    vocab_size: int = 30522,
    lowercase: bool = True,
    unused_tokens: int = 0,
    min_frequency: int = 2,
) -> Tokenizer:
    """Train a BERT WordPiece vocab on text files (one sentence per line) and save it to `out_dir`.

    The same files and settings give byte-identical vocab.txt and tokenizer.json (see _continuation_symbols).
    """
    check_vocab_room("wordpiece", vocab_size, unused_tokens)
    paths, specials = _training_inputs(files, unused_tokens)
    tok = _bert_wordpiece(lowercase)
    continuations = _continuation_symbols(tok, paths)
    if not continuations:
        shown = ", ".join(str(p) for p in paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")
        raise UserError(f"no text to train a vocab on in {shown} (no words); give documents with text")
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=specials + continuations,
        continuing_subword_prefix="##",
        show_progress=False,
    )
    tok.train_from_iterator(iter_document_lines(paths), trainer=trainer)
    # rebuild from the vocab alone: the "##c" symbols were fixed tokens for the trainer, not special tokens
    vocab = tok.get_vocab()
    tok = _bert_wordpiece(lowercase, vocab)
    tok.add_special_tokens(specials)
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
    )
    save_tokenizer(tok, out_dir)
    return tok


BPE_MULTIPLE = 64
"""A trained BPE vocab's size is rounded up to a multiple of this (the embedding and decoder matmuls run on
tensor-core-friendly shapes; ModernBERT pads its vocab the same way)."""


def round_vocab_size(n: int, multiple: int = BPE_MULTIPLE) -> int:
    return -(-n // multiple) * multiple


def _bpe_tokenizer(lowercase: bool) -> Tokenizer:
    """Byte-level BPE (GPT-2/RoBERTa): every byte is in the alphabet, so no text is ever [UNK]."""
    tok = Tokenizer(models.BPE())
    # NFC so that the same text in two Unicode forms gives the same bytes; lower-case when uncased
    tok.normalizer = normalizers.Sequence(
        [normalizers.NFC(), normalizers.Lowercase()] if lowercase else [normalizers.NFC()]
    )
    # a space before every line's first word too: sentences are tokenized one line at a time and then joined
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.decoder = decoders.ByteLevel()
    return tok


def mask_takes_its_space(tok: Tokenizer, mask: str = "[MASK]") -> None:
    """A byte-level BPE's [MASK] takes the space before it (`lstrip`, as Hugging Face's RoBERTa and ModernBERT
    tokenizers register <mask>): "the cat [MASK] on" is then `Ġcat [MASK] Ġon`, as training masked `Ġsat` whole,
    not `Ġcat Ġ [MASK] Ġon` with a lone space token the model never saw before a mask."""
    if mask in tok.get_vocab():
        tok.add_special_tokens([AddedToken(mask, special=True, lstrip=True)])


def train_bpe(
    files: Iterable[str | os.PathLike],
    out_dir: str | os.PathLike,
    vocab_size: int = 50368,
    lowercase: bool = False,
    unused_tokens: int = 0,
    min_frequency: int = 2,
) -> Tokenizer:
    """Train a byte-level BPE vocab on text files and save it to `out_dir` as tokenizer.json.

    vocab_size is rounded up to a multiple of 64; special tokens are BERT's names in BERT's order ([PAD] = 0,
    [unusedN], [UNK], [CLS], [SEP], [MASK]), so every data and model path treats both vocabs alike. A corpus
    too small for that many merges gives fewer tokens; [unusedN] tokens then pad the vocab to the multiple.
    The same files and settings give a byte-identical tokenizer.json.
    """
    check_vocab_room("bpe", vocab_size, unused_tokens)
    paths, specials = _training_inputs(files, unused_tokens)
    size = round_vocab_size(vocab_size)
    tok = _bpe_tokenizer(lowercase)
    trainer = trainers.BpeTrainer(
        vocab_size=size,
        min_frequency=min_frequency,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(iter_document_lines(paths), trainer=trainer)
    mask_takes_its_space(tok)
    have = tok.get_vocab_size()
    if have % BPE_MULTIPLE:
        tok.add_special_tokens([f"[unused{unused_tokens + i}]" for i in range(round_vocab_size(have) - have)])
    vocab = tok.get_vocab()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
    )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_text(out / "tokenizer.json", tok.to_str(pretty=True))
    return tok
