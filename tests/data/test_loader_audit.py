"""Audit of the loader's dynamic masking and shard reading: the random words of masking stay in the data's vocab
when a caller leaves vocab_size out, and a shard that vanished or is locked is not called corrupt."""

from __future__ import annotations

import errno
import fcntl
import itertools
import json

import h5py
import numpy as np
import pytest

from bertforge.data.loader import PretrainLoader, eval_batches
from bertforge.data.shardset import open_shard, reading
from bertforge.errors import UserError

VOCAB = 64


def _dynamic_dir(d, shards=2, rows=24, seq_len=16):
    """Dynamic-masking shards of a 64-word vocab (recorded in their attributes), with a manifest."""
    rng = np.random.default_rng(0)
    d.mkdir()
    for s in range(shards):
        ids = np.zeros((rows, seq_len), np.int32)
        mask = np.zeros((rows, seq_len), np.int8)
        for r in range(rows):
            n = int(rng.integers(6, seq_len + 1))
            ids[r, :n] = [2, *rng.integers(5, VOCAB, n - 2), 3]
            mask[r, :n] = 1
        with h5py.File(d / f"shard_{s}.hdf5", "w") as h:
            h.create_dataset("input_ids", data=ids)
            h.create_dataset("input_mask", data=mask)
            h.create_dataset("segment_ids", data=np.zeros_like(mask))
            h.create_dataset("next_sentence_labels", data=np.zeros(rows, np.int8))
            h.attrs.update(
                {"bertforge_kind": "dynamic", "vocab_size": VOCAB, "max_pred": 3, "masked_lm_prob": 0.15}
                | {"pad_id": 0, "cls_id": 2, "sep_id": 3, "mask_id": 4, "wwm": False}
            )
    shards_list = [{"file": f"shard_{s}.hdf5", "instances": rows} for s in range(shards)]
    (d / "manifest.json").write_text(json.dumps({"shards": shards_list, "vocab_size": VOCAB}))
    return d


def test_random_words_stay_in_the_shards_vocab_when_vocab_size_is_left_out(tmp_path):
    """from_dir and eval_batches drew the random words of dynamic masking below 30522 unless told the vocab: on
    shards of a smaller vocab (the bench's time-to-accuracy loader, any caller that leaves it out) those ids
    are past the embedding of a model sized from the shards: an IndexError at the first step."""
    d = _dynamic_dir(tmp_path / "dyn")
    every_masked_word_random = (0.0, 1.0)
    loader = PretrainLoader.from_dir(d, 8, 8, 0, 1, seed=0, num_workers=0, mask_split=every_masked_word_random)
    batches = list(itertools.islice(loader.iterate(), 6))  # two epochs of 48 rows
    batches += list(eval_batches(d, 8, mask_split=every_masked_word_random))
    assert sum(int((b["masked_positions"] > 0).sum()) for b in batches) > 100
    assert max(int(b["input_ids"].max()) for b in batches) < VOCAB
    # a vocab_size given still wins (the run passes the data's rows)
    assert PretrainLoader.from_dir(d, 8, 8, 0, 1, seed=0, num_workers=0, vocab_size=VOCAB + 8).spec.vocab_size == 72


def test_a_shard_deleted_during_the_run_is_not_called_corrupt(tmp_path):
    """A shard listed at start-up and gone when a lane reached it was "corrupt or truncated ... delete the file"."""
    d = _dynamic_dir(tmp_path / "dyn")
    it = PretrainLoader.from_dir(d, 8, 8, 0, 1, seed=0, num_workers=0, vocab_size=VOCAB).iterate()
    for s in range(2):
        (d / f"shard_{s}.hdf5").unlink()
    with pytest.raises(UserError, match=r"shard_\d.hdf5 no longer exists .*restore the file") as e:
        next(it)
    assert "corrupt" not in str(e.value) and "delete the file" not in str(e.value)


def test_a_locked_shard_is_not_called_corrupt(tmp_path):
    """HDF5 locks the files it opens: a shard another process holds open for writing, or one on a file system
    without locks (NFS without lockd), failed as "corrupt or truncated ... delete the file" in the loader."""
    d = _dynamic_dir(tmp_path / "dyn")
    it = PretrainLoader.from_dir(d, 8, 8, 0, 1, seed=0, num_workers=0, vocab_size=VOCAB).iterate()
    held = [open(d / f"shard_{s}.hdf5", "rb") for s in range(2)]  # noqa: SIM115 - a writer's locks, for the test
    try:
        for f in held:
            fcntl.flock(f, fcntl.LOCK_EX)  # flock locks conflict across descriptors, even in one process
        with pytest.raises(UserError, match="another process holds it open for writing; wait") as e:
            next(it)
        assert "corrupt" not in str(e.value) and "delete" not in str(e.value)
        with pytest.raises(UserError, match="another process holds it open for writing"):
            open_shard(d / "shard_0.hdf5").close()
    finally:
        for f in held:
            f.close()
    with pytest.raises(UserError, match="no file locks; set HDF5_USE_FILE_LOCKING=FALSE") as e, reading("x.hdf5"):
        raise OSError(errno.ENOLCK, "Unable to synchronously open file (unable to lock file, errno = 37)")
    assert "corrupt" not in str(e.value)
