"""Configuration of `bertforge data prepare`: corpus -> documents -> vocab -> shards in one run."""

from __future__ import annotations

import dataclasses

from bertforge.config import refuse_empty_paths
from bertforge.errors import ConfigError
from bertforge.runtime.io import refuse_empty_paths as refuse_empty_flags

MAX_SEQ_LEN = 32768
"""The longest row the masking keys address (`instances.mask_batch`: 15 bits of column)."""


@dataclasses.dataclass
class DocsConfig:
    """Reading and cleaning the corpus."""

    source: str = "builtin:python-docs"
    """Corpus: a .xml/.xml.bz2 Wikipedia dump, a text file/glob, a WikiExtractor dir, hf:NAME[:CONFIG] or
    builtin:python-docs."""
    min_doc_chars: int = 200
    """Drop documents shorter than this many characters."""
    num_shards: int = 8
    """Text shards of documents to write."""
    one_doc_per_file: bool = False
    """Plain-text sources: each file is one document (otherwise a blank line ends a document)."""
    workers: int = 0
    """Worker processes for cleaning (0 = one per CPU core)."""

    def validate(self) -> None:
        if not self.source.strip():  # Path("") is the working directory: it would read whatever lies there
            raise ConfigError("docs.source (--source, --dump) is empty; name a corpus (see `bertforge data docs -h`)")
        if self.num_shards < 1:
            raise ConfigError(f"docs.num_shards (--shards) must be at least 1, got {self.num_shards}")
        for key, flag in (("min_doc_chars", "--min-doc-chars"), ("workers", "--workers")):
            if getattr(self, key) < 0:
                raise ConfigError(f"docs.{key} ({flag}) must be >= 0, got {getattr(self, key)}")


@dataclasses.dataclass
class VocabConfig:
    """The vocabulary (WordPiece or byte-level BPE): trained on the documents, or loaded."""

    vocab_file: str | None = None
    """An existing vocab.txt or tokenizer.json to use instead of training one."""
    model: str = "wordpiece"
    """Trained vocab: wordpiece (BERT; vocab.txt + tokenizer.json) or bpe (byte-level, RoBERTa/ModernBERT;
    tokenizer.json only, its size rounded up to a multiple of 64)."""
    vocab_size: int = 30522
    """Size of a trained vocab."""
    lowercase: bool | None = None
    """Uncased (lower-case and strip accents), as bert-base-uncased. Unset (null): a trained vocab is uncased, a
    vocab_file's casing is guessed from its name ("uncased"/"cased") and then from its tokens."""
    unused_tokens: int = 0
    """Number of [unusedN] slots to reserve."""
    min_frequency: int = 2
    """A piece must occur at least this often to enter a trained vocab."""

    def validate(self) -> None:
        refuse_empty_paths(self, "vocab.", ["vocab_file"])  # "" read as unset: a vocab was trained instead
        if self.vocab_file is None and self.vocab_size < 64:
            raise ConfigError(f"vocab.vocab_size must be at least 64, got {self.vocab_size}")
        if self.model not in ("wordpiece", "bpe"):
            raise ConfigError(f"vocab.model must be wordpiece or bpe, not {self.model!r}")
        if self.unused_tokens < 0:
            raise ConfigError(f"vocab.unused_tokens (--unused) must be >= 0, got {self.unused_tokens}")
        if self.min_frequency < 1:
            raise ConfigError(f"vocab.min_frequency (--min-frequency) must be >= 1, got {self.min_frequency}")


@dataclasses.dataclass
class ShardsConfig:
    """Pre-training instances (Google BERT create_pretraining_data) written as NVIDIA HDF5 shards: the
    parameters of `bertforge data shards` (its flags) and of the `shards:` section of `data prepare`."""

    seq_len: int = 128
    """max_seq_length: [CLS] A [SEP] B [SEP] padded to this."""
    max_pred: int = 20
    """max_predictions_per_seq."""
    masked_lm_prob: float = 0.15
    """Fraction of tokens to mask."""
    short_seq_prob: float = 0.1
    """Probability of a shorter target length."""
    dupe_factor: int = 10
    """Times each document is used with different masks."""
    num_shards: int = 16
    """HDF5 shards to write."""
    seed: int = 12345
    """Run seed; each shard's seed derives from it and the shard index."""
    wwm: bool = False
    """Whole-word masking."""
    dynamic_masking: bool = False
    """Store unmasked pairs and mask in the loader, a fresh draw every epoch."""
    objective: str = "mlm_nsp"
    """mlm_nsp: Google BERT sentence pairs with NSP labels; mlm: MLM-only rows (RoBERTa FULL-SENTENCES:
    consecutive sentences across documents, a [SEP] between documents, every row full but a shard's last; no
    segment B, no NSP label), stored unmasked and masked in the loader (train.objective mlm reads them)."""
    eval_fraction: float = 0.0
    """Fraction of documents held out into eval shards."""
    eval_shards: int = 1
    """Number of eval shards (when eval_fraction > 0)."""
    workers: int = 0
    """Worker processes building shards (0 = one per CPU core)."""

    def validate(self) -> None:
        # each message names the config key and the `bertforge data shards` flag: both front ends use this
        if self.seq_len < 8:
            raise ConfigError(
                f"shards.seq_len (--seq-len) must be at least 8 ([CLS] A [SEP] B [SEP] needs room), got {self.seq_len}"
            )
        if not 0 < self.masked_lm_prob < 1:
            raise ConfigError(f"shards.masked_lm_prob (--masked-lm-prob) must be in (0, 1), got {self.masked_lm_prob}")
        if self.max_pred < 1 or self.dupe_factor < 1 or self.num_shards < 1 or self.eval_shards < 1:
            raise ConfigError(
                "shards.max_pred, dupe_factor, num_shards and eval_shards (--max-pred, --dupe-factor, "
                "--shards, --eval-shards) must be >= 1"
            )
        if not 0.0 <= self.short_seq_prob <= 1.0:
            raise ConfigError(f"shards.short_seq_prob (--short-seq-prob) must be in [0, 1], got {self.short_seq_prob}")
        if self.workers < 0:
            raise ConfigError(f"shards.workers (--workers) must be >= 0, got {self.workers}")
        if self.seq_len > MAX_SEQ_LEN:
            raise ConfigError(f"shards.seq_len (--seq-len) must be at most {MAX_SEQ_LEN}, got {self.seq_len}")
        if self.max_pred > self.seq_len:
            raise ConfigError(
                f"shards.max_pred (--max-pred) {self.max_pred} is more than the {self.seq_len} tokens of a row "
                "(--seq-len): lower it (Google's recipe: 20 at 128, 80 at 512)"
            )
        if self.seed < 0:
            raise ConfigError(f"shards.seed (--seed) must be >= 0, got {self.seed}")
        if self.objective not in ("mlm_nsp", "mlm"):
            raise ConfigError(f"shards.objective (--objective) must be mlm_nsp or mlm, not {self.objective!r}")
        if self.objective == "mlm" and self.short_seq_prob != ShardsConfig.short_seq_prob:
            raise ConfigError(
                f"shards.short_seq_prob (--short-seq-prob) {self.short_seq_prob} shortens sentence pairs "
                "(objective mlm_nsp); MLM-only rows are full rows, so it would be ignored: leave it at its default"
            )
        if not 0.0 <= self.eval_fraction < 1.0:
            raise ConfigError(f"shards.eval_fraction (--eval-fraction) must be in [0, 1), got {self.eval_fraction}")

    def content(self) -> dict:
        """The settings that determine the shards' bytes (hashed into each shard and the manifest): all but
        `workers`, so a re-run with another worker count still skips finished shards. The default objective
        is left out too, so the sentence-pair shards written before it existed keep their hash."""
        out = {k: v for k, v in dataclasses.asdict(self).items() if k != "workers"}
        if self.objective == "mlm_nsp":
            del out["objective"]
        return out


@dataclasses.dataclass
class DataPrepConfig:
    """The data chain of one preset."""

    output_dir: str = "runs/data"
    """Root of the outputs: docs/, vocab/, shards/ (and eval shards) below it."""
    shards_subdir: str = "shards"
    """Directory of the training shards, below output_dir."""
    eval_subdir: str = "eval"
    """Directory of the held-out eval shards, below output_dir."""
    docs: DocsConfig = dataclasses.field(default_factory=DocsConfig)
    """Corpus and cleaning."""
    vocab: VocabConfig = dataclasses.field(default_factory=VocabConfig)
    """Vocabulary."""
    shards: ShardsConfig = dataclasses.field(default_factory=ShardsConfig)
    """Instances and shards."""

    def validate(self) -> None:
        # "" is the working directory: docs/, vocab/, the shards and data_config.yaml would land there (an unset
        # variable in `--set output_dir=$DIR`), as train.output_dir refuses for a run
        refuse_empty_flags(
            [("output_dir", self.output_dir)], "name the directory of the prepared data, e.g. runs/my_data", ConfigError
        )
