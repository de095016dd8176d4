"""`bertforge data {wiki,docs,vocab,shards,prepare,inspect}`: the data chain, one step or all of it."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from bertforge.errors import UserError
from bertforge.runtime.io import refuse_empty_paths, write_text
from bertforge.runtime.signals import sigterm_interrupts


def data_add(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="data_command", metavar="STEP", parser_class=type(p), required=True)

    w = sub.add_parser("wiki", help="Wikipedia pages-articles dump (.xml/.xml.bz2) -> documents")
    w.add_argument("--dump", required=True, help="pages-articles dump: .xml, .xml.bz2 or -multistream.xml.bz2")
    w.add_argument("--index", help="a multistream dump's index (default: the -multistream-index.txt.bz2 beside it)")
    w.add_argument("--headings", action="store_true", help="keep section headings as lines (as WikiExtractor)")
    w.add_argument("--out", required=True, help="output directory of document text shards")
    _docs_common(w)

    d = sub.add_parser("docs", help="text files/globs, WikiExtractor dirs, hf:NAME, builtin:python-docs -> documents")
    d.add_argument(
        "--source",
        required=True,
        help="file, glob, directory, WikiExtractor dir, .xml[.bz2] dump, hf:NAME[:CONFIG] or builtin:python-docs",
    )
    d.add_argument("--out", required=True, help="output directory of document text shards")
    d.add_argument("--one-doc-per-file", action="store_true", help="each text file is one document")
    _docs_common(d)

    v = sub.add_parser("vocab", help="train a WordPiece or byte-level BPE vocab on documents (or convert one)")
    v.add_argument("--docs", help="document directory/files/glob to train on")
    v.add_argument("--from", dest="from_vocab", help="an existing vocab.txt/tokenizer.json to write as both files")
    v.add_argument(
        "--out", required=True, help="output directory: vocab.txt and tokenizer.json (bpe: tokenizer.json only)"
    )
    v.add_argument(
        "--model",
        choices=("wordpiece", "bpe"),
        default="wordpiece",
        help="wordpiece (BERT) or bpe (byte-level, RoBERTa/ModernBERT; vocab size rounded up to a multiple of 64)",
    )
    v.add_argument("--vocab-size", type=int, default=30522, help="tokens in the vocab, specials included")
    _casing_flags(v, "uncased when training; with --from, guessed from the vocab's name and tokens")
    v.add_argument("--unused", type=int, default=0, help="[unusedN] slots to reserve")
    v.add_argument("--min-frequency", type=int, default=2, help="fewest occurrences of a merged token")

    s = sub.add_parser("shards", help="documents -> pre-training instances -> NVIDIA HDF5 shards")
    s.add_argument("--docs", required=True, help="document directory (its *.txt), file or glob")
    s.add_argument("--vocab", required=True, help="vocab.txt, tokenizer.json or a directory holding one")
    s.add_argument("--out", required=True, help="output directory of the training shards")
    s.add_argument("--seq-len", type=int, default=128, help="max_seq_length")
    s.add_argument("--max-pred", type=int, default=20, help="max_predictions_per_seq")
    s.add_argument("--masked-lm-prob", type=float, default=0.15, help="fraction of tokens masked")
    s.add_argument(
        "--short-seq-prob", type=float, help="fraction of shorter sentence pairs (default 0.1; mlm_nsp only)"
    )
    s.add_argument("--dupe-factor", type=int, default=10, help="maskings of each document")
    s.add_argument("--shards", type=int, default=16, help="number of training shards")
    s.add_argument("--seed", type=int, default=12345, help="random seed")
    s.add_argument("--wwm", action="store_true", help="whole-word masking")
    s.add_argument("--dynamic-masking", action="store_true", help="store unmasked pairs; the loader masks each epoch")
    s.add_argument(
        "--objective",
        choices=("mlm_nsp", "mlm"),
        default="mlm_nsp",
        help="mlm_nsp: sentence pairs with NSP labels; mlm: full rows of consecutive sentences across documents "
        "([SEP] between documents), no segment B, no NSP label, masked in the loader",
    )
    s.add_argument("--eval-out", help="directory of held-out eval shards (with --eval-fraction)")
    s.add_argument("--eval-fraction", type=float, default=0.0, help="fraction of documents held out for eval")
    s.add_argument("--eval-shards", type=int, default=1, help="number of eval shards (with --eval-out)")
    _casing_flags(s, "a vocab.txt's casing, guessed from its name and tokens")
    s.add_argument("--workers", type=int, default=0, help="worker processes (0 = one per CPU core)")

    pr = sub.add_parser("prepare", help="the whole chain (docs -> vocab -> shards) from one config")
    pr.add_argument("--config", default="demo", help="preset name (configs/data/NAME.yaml) or a YAML path")
    pr.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config value")

    i = sub.add_parser("inspect", help="statistics of NVIDIA-format, dynamic or packed shards")
    i.add_argument("paths", nargs="+", help="shard files or directories")
    i.add_argument("--json", action="store_true", help="print JSON")
    i.add_argument("--plot", help="write histograms to this PNG")


def _docs_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--shards", type=int, default=8, help="document text shards to write")
    p.add_argument("--min-doc-chars", type=int, default=200, help="drop shorter documents")
    p.add_argument("--workers", type=int, default=0, help="worker processes (0 = one per CPU core)")


def _casing_flags(p: argparse.ArgumentParser, default: str) -> None:
    casing = p.add_mutually_exclusive_group()
    casing.add_argument("--cased", action="store_true", help=f"keep case and accents (default: {default})")
    casing.add_argument("--uncased", action="store_true", help=f"lower-case and strip accents (default: {default})")


def _lowercase(args: argparse.Namespace) -> bool | None:
    """--uncased True, --cased False, neither None (the step's default: guessed, or uncased when training)."""
    return True if args.uncased else False if args.cased else None


def data_run(args: argparse.Namespace) -> int:
    with sigterm_interrupts():  # SIGTERM ends as Ctrl-C does (`bertforge`'s main says so, exit 143)
        return _data_run(args)


# path flags (attribute, flag) whose empty value is refused; --source/--dump: `DocsConfig.validate` says it
PATH_FLAGS = (
    ("out", "--out"),
    ("docs", "--docs"),
    ("vocab", "--vocab"),
    ("from_vocab", "--from"),
    ("index", "--index"),
    ("eval_out", "--eval-out"),
    ("plot", "--plot"),
    ("config", "--config"),
)


def _check_flags(args: argparse.Namespace) -> None:
    """The flags of `data docs`, `wiki` and `vocab`, through the checks their `data prepare` sections get; an
    empty path anywhere."""
    from bertforge.data.config import DocsConfig, VocabConfig

    # `--out "$OUT"` with OUT unset: Path("") is the working directory, so the step would write its files there,
    # or read a vocab or documents from there (--vocab, --docs), or draw no plot (--plot)
    refuse_empty_paths((flag, getattr(args, key, None)) for key, flag in PATH_FLAGS)
    if any(not p.strip() for p in getattr(args, "paths", None) or []):
        raise UserError("a shard path is empty (the working directory): give shard files or directories")
    if args.data_command in ("wiki", "docs"):
        source = args.dump if args.data_command == "wiki" else args.source
        DocsConfig(
            source=source, min_doc_chars=args.min_doc_chars, num_shards=args.shards, workers=args.workers
        ).validate()
    elif args.data_command == "vocab":
        if args.from_vocab:  # a flag the step would ignore is refused: the user meant it to count
            trained = (
                ("--vocab-size", args.vocab_size, VocabConfig.vocab_size),
                ("--unused", args.unused, VocabConfig.unused_tokens),
                ("--min-frequency", args.min_frequency, VocabConfig.min_frequency),
            )
            if ignored := [f"{flag} {value}" for flag, value, default in trained if value != default]:
                raise UserError(
                    f"{', '.join(ignored)} shape a trained vocab, and --from {args.from_vocab} is written as it is: "
                    "drop them, or train a vocab with --docs"
                )
        VocabConfig(
            vocab_file=args.from_vocab,
            model=args.model,
            vocab_size=args.vocab_size,
            unused_tokens=args.unused,
            min_frequency=args.min_frequency,
        ).validate()


def _data_run(args: argparse.Namespace) -> int:
    _check_flags(args)
    if args.data_command in ("wiki", "docs", "vocab"):
        from bertforge.runtime.io import output_dir

        with output_dir(args.out, "--out"):  # removed again when the step fails before writing anything
            return _data_step(args)
    return _data_step(args)


def _data_step(args: argparse.Namespace) -> int:
    cmd = args.data_command
    if cmd == "wiki":
        from bertforge.data.documents import run_wiki

        run_wiki(
            args.dump,
            args.out,
            args.shards,
            args.min_doc_chars,
            args.workers or None,
            index=args.index,
            headings=args.headings,
        )
    elif cmd == "docs":
        from bertforge.data.documents import run_docs

        run_docs(args.source, args.out, args.shards, args.min_doc_chars, args.one_doc_per_file, args.workers or None)
    elif cmd == "vocab":
        run_vocab(
            args.docs,
            args.out,
            args.vocab_size,
            _lowercase(args),
            args.unused,
            args.min_frequency,
            args.from_vocab,
            model=args.model,
        )
    elif cmd == "shards":
        from bertforge.data.build import run_shards
        from bertforge.data.config import ShardsConfig

        _check_eval_options(args.eval_fraction, args.eval_out)
        if args.objective == "mlm" and args.short_seq_prob is not None:
            raise UserError(
                "--short-seq-prob shortens sentence pairs (--objective mlm_nsp); MLM-only rows are full rows, so it "
                "would be ignored: drop it"
            )

        params = ShardsConfig(
            seq_len=args.seq_len,
            max_pred=args.max_pred,
            masked_lm_prob=args.masked_lm_prob,
            short_seq_prob=ShardsConfig.short_seq_prob if args.short_seq_prob is None else args.short_seq_prob,
            dupe_factor=args.dupe_factor,
            num_shards=args.shards,
            seed=args.seed,
            wwm=args.wwm,
            dynamic_masking=args.dynamic_masking,
            objective=args.objective,
            eval_fraction=args.eval_fraction,
            eval_shards=args.eval_shards,
            workers=args.workers,
        )
        run_shards(args.docs, args.vocab, args.out, params, eval_dir=args.eval_out, lowercase=_lowercase(args))
    elif cmd == "prepare":
        from bertforge.config import load_config

        run_prepare(load_config("data", args.config, args.set))
    elif cmd == "inspect":
        from bertforge.data.inspect import run_inspect

        return run_inspect(args.paths, args.json, args.plot)
    return 0


def _check_eval_options(eval_fraction: float, eval_out: str | None) -> None:
    """Each of --eval-fraction and --eval-out does nothing without the other: refuse rather than ignore one."""
    if eval_fraction > 0 and not eval_out:
        raise UserError(
            f"--eval-fraction {eval_fraction} is ignored without --eval-out: add --eval-out DIR for the held-out "
            "eval shards, or drop --eval-fraction"
        )
    if eval_out and eval_fraction <= 0:
        raise UserError(
            f"--eval-out {eval_out} gets nothing without --eval-fraction: add e.g. --eval-fraction 0.01, or drop "
            "--eval-out"
        )


def run_vocab(
    docs: str | None,
    out: str | os.PathLike,
    vocab_size: int = 30522,
    lowercase: bool | None = None,
    unused: int = 0,
    min_frequency: int = 2,
    from_vocab: str | None = None,
    log=print,
    model: str = "wordpiece",
) -> Path:
    """Train a WordPiece or byte-level BPE (`model`) vocab on documents, or write an existing vocab as
    vocab.txt + tokenizer.json. `lowercase=None`: a trained vocab is uncased, an existing vocab.txt's casing is
    guessed from its name and tokens (`load_tokenizer`)."""
    from bertforge.data.build import document_files
    from bertforge.data.vocab import (
        load_tokenizer,
        round_vocab_size,
        save_tokenizer,
        tokenizer_file,
        tokenizer_model,
        train_bpe,
        train_wordpiece,
    )

    t0 = time.perf_counter()
    out = Path(out)
    _check_vocab_out(out)
    if from_vocab and docs:
        raise UserError(f"--from {from_vocab} copies a vocab and --docs {docs} trains one: give one of them")
    if from_vocab:
        tok = load_tokenizer(from_vocab, lowercase)
        if model == "bpe" and (kind := tokenizer_model(tok)) != "bpe":  # --model wordpiece is also the default
            raise UserError(
                f"--from {from_vocab} is a {kind} vocab, not bpe (--model bpe); it is written as it is: drop --model, "
                "or give a byte-level BPE tokenizer.json"
            )
        # a vocab.txt is written as it is: a repeated line leaves an id no token holds, which the tokens alone
        # cannot write back (and Google's and HF's readers give the line's token its last id, as we do)
        source = tokenizer_file(Path(from_vocab))
        save_tokenizer(tok, out, vocab_txt=None if source.suffix == ".json" else source)
    elif not docs:
        raise UserError("data vocab needs --docs (documents to train on) or --from (an existing vocab)")
    elif model == "bpe":
        if (size := round_vocab_size(vocab_size)) != vocab_size:
            log(f"data vocab: BPE vocab size {vocab_size} rounded up to {size} (a multiple of 64)")
        tok = train_bpe(document_files(docs), out, vocab_size, train_lowercase(lowercase), unused, min_frequency)
    elif model == "wordpiece":
        tok = train_wordpiece(document_files(docs), out, vocab_size, train_lowercase(lowercase), unused, min_frequency)
    else:
        raise UserError(f"vocab model must be wordpiece or bpe, not {model!r}")
    files = "vocab.txt, tokenizer.json"
    if (kind := tokenizer_model(tok)) != "wordpiece":
        # only a WordPiece vocab has a vocab.txt (`save_tokenizer`): a BPE one has none, nor a --from WordLevel one
        files = "tokenizer.json (byte-level BPE)" if kind == "bpe" else f"tokenizer.json ({kind})"
        if (out / "vocab.txt").is_file():  # an earlier WordPiece vocab's: read beside this one, it would mislead
            (out / "vocab.txt").unlink()
            log(f"data vocab: removed {out / 'vocab.txt'}, an earlier WordPiece vocab's (a {kind} vocab has none)")
    have = tok.get_vocab_size()
    short = ""
    if not from_vocab and have < vocab_size:  # the trainer stops when the corpus has no more pieces to merge
        short = f", fewer than the {vocab_size} asked for: the corpus holds no more (min frequency {min_frequency})"
    log(f"data vocab: {have} tokens{short} -> {out}/{files} ({time.perf_counter() - t0:.1f}s)")
    return out


def train_lowercase(lowercase: bool | None) -> bool:
    """The casing of a trained vocab: uncased unless asked otherwise (Google's default, bert-base-uncased)."""
    return True if lowercase is None else lowercase


def _check_vocab_out(out: Path) -> None:
    """`data vocab --out` replaces the vocab there: one it did not write is refused, not lost. Ours always has a
    tokenizer.json (written first); a vocab.txt without one is a downloaded vocab, and model files make a model
    directory (`export` writes tokenizers into those)."""
    if not out.is_dir():
        return
    if (out / "vocab.txt").is_file() and not (out / "tokenizer.json").is_file():
        raise UserError(
            f"--out {out} holds a vocab.txt that `data vocab` did not write (no tokenizer.json beside it): it "
            "would be replaced; choose another --out (or read it with --from)"
        )
    model_files = [n for n in ("config.json", "model.safetensors", "pytorch_model.bin") if (out / n).exists()]
    if model_files:
        raise UserError(f"--out {out} is a model directory ({model_files[0]}): give the vocab a directory of its own")


def run_prepare(cfg: Any, log=print) -> dict[str, Any]:
    """`bertforge data prepare`: documents -> vocab -> shards (+ eval shards) under cfg.output_dir.

    Each step skips work that is already done with the same settings (the document manifest, an existing
    vocab dir, finished shards), so a re-run after an interruption resumes.
    """
    from bertforge.runtime.io import output_dir

    with output_dir(cfg.output_dir) as root:  # a run that fails before writing anything leaves no directory
        return _prepare(cfg, root, log)


def _prepare(cfg: Any, root: Path, log) -> dict[str, Any]:
    from bertforge.config import save_config
    from bertforge.data.build import run_shards
    from bertforge.data.documents import run_docs

    t0 = time.perf_counter()
    docs_dir, vocab_dir = root / "docs", root / "vocab"
    shards_dir, eval_dir = root / cfg.shards_subdir, root / cfg.eval_subdir
    _check_prepare(cfg, root)
    documents = run_docs(
        cfg.docs.source,
        docs_dir,
        cfg.docs.num_shards,
        cfg.docs.min_doc_chars,
        cfg.docs.one_doc_per_file,
        cfg.docs.workers or None,
        log,
    )
    v = cfg.vocab
    trained_with = {k: getattr(v, k) for k in ("model", "vocab_size", "lowercase", "unused_tokens", "min_frequency")}
    trained_with["lowercase"] = train_lowercase(v.lowercase)  # unset and true train the same vocab: no retraining
    trained_with["documents"] = documents.get("settings")  # another corpus retrains the vocab too
    if v.vocab_file:
        run_vocab(None, vocab_dir, lowercase=v.lowercase, from_vocab=v.vocab_file, log=log)
    elif _vocab_done(vocab_dir, v.model) and _trained_with(vocab_dir) in (None, trained_with):
        log(f"data vocab: {vocab_dir} exists, trained with these settings; delete it to retrain")
    else:
        run_vocab(
            str(docs_dir),
            vocab_dir,
            v.vocab_size,
            v.lowercase,
            v.unused_tokens,
            v.min_frequency,
            log=log,
            model=v.model,
        )
        write_text(vocab_dir / TRAINED_WITH, json.dumps(trained_with, indent=1) + "\n")
    s = cfg.shards
    result = run_shards(
        docs_dir,
        vocab_dir / "tokenizer.json",
        shards_dir,
        s,
        eval_dir=eval_dir if s.eval_fraction > 0 else None,
        log=log,
    )
    save_config(cfg, root / "data_config.yaml")
    log(
        f"data prepare: done in {time.perf_counter() - t0:.1f}s -> {shards_dir}"
        + (f", {eval_dir}" if s.eval_fraction > 0 else "")
    )
    return result


def _check_prepare(cfg: Any, root: Path) -> None:
    """What the later steps would refuse, refused before the documents step (hours on a Wikipedia dump)."""
    from bertforge.data.vocab import check_vocab_room

    cfg.shards.validate()
    if cfg.vocab.vocab_file and not Path(cfg.vocab.vocab_file).exists():
        raise UserError(f"vocab.vocab_file {cfg.vocab.vocab_file} does not exist; fix it, or leave it empty")
    _check_vocab_out(root / "vocab")
    if cfg.vocab.vocab_file:  # read it now (a second): an empty or foreign file fails here, not after the documents
        from bertforge.data.vocab import load_tokenizer

        try:
            load_tokenizer(cfg.vocab.vocab_file, cfg.vocab.lowercase)
        except UserError as e:
            raise UserError(f"vocab.vocab_file: {e}") from None
    else:
        _vocab_done(root / "vocab", cfg.vocab.model)  # a vocab of the other model there: refused before the documents
        # too small for the special tokens: the trainer would say so after the documents step (hours on a dump)
        check_vocab_room(cfg.vocab.model, cfg.vocab.vocab_size, cfg.vocab.unused_tokens, "vocab.vocab_size")
    places = {"docs": "docs", "vocab": "vocab", "shards_subdir": cfg.shards_subdir}
    if cfg.shards.eval_fraction > 0:
        places["eval_subdir"] = cfg.eval_subdir
    seen: dict[Path, str] = {}
    for key, sub in places.items():
        where = (root / sub).resolve()
        if where in seen or where == root.resolve():
            other = seen.get(where, "output_dir")
            raise UserError(f"{key} ({sub}) is the {other} directory of this prepare: give each step its own")
        seen[where] = key


TRAINED_WITH = "trained_with.json"
"""The vocab section a `data prepare` vocab was trained with, beside it: a changed size or casing retrains."""


def _trained_with(vocab_dir: Path) -> dict[str, Any] | None:
    """The recorded settings of a prepared vocab; None for a vocab prepared before they were recorded."""
    try:
        return json.loads((vocab_dir / TRAINED_WITH).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _vocab_done(vocab_dir: Path, model: str) -> bool:
    """A trained vocab of this model is in vocab_dir (BPE: tokenizer.json alone; WordPiece: both files). A vocab
    of the other model is an error, not silently reused."""
    tj = vocab_dir / "tokenizer.json"
    if not tj.is_file():
        return False
    from bertforge.data.vocab import load_tokenizer, tokenizer_model

    have = tokenizer_model(load_tokenizer(tj))
    if have != model:
        raise UserError(
            f"{vocab_dir} holds a {have} vocab but vocab.model is {model}; delete {vocab_dir} to train a {model} "
            "vocab, or set vocab.model to match"
        )
    return model == "bpe" or (vocab_dir / "vocab.txt").is_file()
