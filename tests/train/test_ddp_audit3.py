"""Multi-process pre-training (audit 3): a rank that fails alone stops the others with its line."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import h5py


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    src = str(Path(__file__).resolve().parents[2] / "src")
    return {**env, "OMP_NUM_THREADS": "1", "PYTHONPATH": src, "MASTER_ADDR": "127.0.0.1"}


def test_a_bad_shard_of_rank_1_alone_is_rank_0s_line_too(shards, tmp_path, overrides):
    """2 ranks x 1 lane over 4 shards: rank 1 reads shards 1 and 3 alone. Damaged, they stopped rank 1 with one
    line, while rank 0, waiting in the gradient all-reduce, died with gloo's traceback of a connection closed by
    the peer (srun, mpirun: no torchrun agent to stop it). Now rank 0 names rank 1 and its line."""
    for name in ("shard_1.hdf5", "shard_3.hdf5"):
        with h5py.File(shards / name, "a") as h:
            ids = h["input_ids"][:]
            ids[:, 1] = 999  # past the vocab of 64: the loader's check names the shard and row
            del h["input_ids"]
            h.create_dataset("input_ids", data=ids)
    sets = [f"--set={s}" for s in overrides(shards, tmp_path / "run", **{"train.max_steps": 2})]
    port = str(_free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "bertforge", "pretrain", *sets],
            env={**_env(), "MASTER_PORT": port, "SLURM_PROCID": str(r), "SLURM_NTASKS": "2", "SLURM_STEP_ID": "0"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in (0, 1)
    ]
    errs = [p.communicate(timeout=120)[1] for p in procs]
    line = "input_ids holds 999; the model's vocab has 64 tokens"
    for proc, err in zip(procs, errs):
        assert proc.returncode == 2 and line in err and "Traceback" not in err, err[-3000:]
    assert "rank 1 stopped the run: shard" in errs[0], errs[0][-3000:]
