"""Configuration of `bertforge data prepare`: corpus -> documents -> vocab -> shards in one run."""

from __future__ import annotations

import dataclasses

from bertforge.errors import ConfigError


@dataclasses.dataclass
class DocsConfig:
    """Reading and cleaning the corpus."""

    source: str = "builtin:python-docs"
    """Corpus: a .xml/.xml.bz2 Wikipedia dump, a text file/glob, a WikiExtractor dir, hf:NAME[:CONFIG] or builtin:python-docs."""
    min_doc_chars: int = 200
    """Drop documents shorter than this many characters."""
    num_shards: int = 8
    """Text shards of documents to write."""


@dataclasses.dataclass
class VocabConfig:
    """The WordPiece vocabulary: trained on the documents, or loaded."""

    vocab_file: str | None = None
    """An existing vocab.txt or tokenizer.json to use instead of training one."""
    vocab_size: int = 30522
    """Size of a trained vocab."""
    lowercase: bool = True
    """Uncased (lower-case and strip accents), as bert-base-uncased."""
    unused_tokens: int = 0
    """Number of [unusedN] slots to reserve."""


@dataclasses.dataclass
class ShardsConfig:
    """Pre-training instances (Google BERT create_pretraining_data) written as NVIDIA HDF5 shards."""

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
    eval_fraction: float = 0.0
    """Fraction of documents held out into eval shards."""

    def validate(self) -> None:
        if self.seq_len < 8:
            raise ConfigError(f"shards.seq_len must be at least 8, got {self.seq_len}")
        if not 0 < self.masked_lm_prob < 1:
            raise ConfigError(f"shards.masked_lm_prob must be in (0, 1), got {self.masked_lm_prob}")
        if self.max_pred < 1 or self.dupe_factor < 1 or self.num_shards < 1:
            raise ConfigError("shards.max_pred, shards.dupe_factor and shards.num_shards must be >= 1")
        if not 0.0 <= self.eval_fraction < 1.0:
            raise ConfigError(f"shards.eval_fraction must be in [0, 1), got {self.eval_fraction}")


@dataclasses.dataclass
class DataPrepConfig:
    """The data chain of one preset."""

    output_dir: str = "runs/data"
    """Root of the outputs: docs/, vocab/, shards/ (and eval shards) below it."""
    docs: DocsConfig = dataclasses.field(default_factory=DocsConfig)
    """Corpus and cleaning."""
    vocab: VocabConfig = dataclasses.field(default_factory=VocabConfig)
    """Vocabulary."""
    shards: ShardsConfig = dataclasses.field(default_factory=ShardsConfig)
    """Instances and shards."""
