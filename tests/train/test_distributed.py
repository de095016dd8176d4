"""Distributed: 2 gloo processes == 1 process with the same global batch; a 2-node run on loopback; env parsing."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tests.train.conftest import saved_weights

from bertforge.runtime.distributed import env_info
from bertforge.train import checkpoint as ckpt


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    env["OMP_NUM_THREADS"] = "1"
    return env


def _run(args: list[str], timeout: int = 300) -> None:
    proc = subprocess.run(args, env=_env(), capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_a_user_error_of_rank_0_alone_is_one_line_on_every_rank(tmp_path):
    """Rank 0 writing (a checkpoint, best/) on a full disk: the ranks waiting in a barrier each failed with a
    traceback of a closed connection. `on_main` gives them rank 0's line."""
    script = tmp_path / "main.py"
    script.write_text(
        "from bertforge.errors import UserError\n"
        "from bertforge.runtime import distributed as D\n"
        "info, _ = D.init_distributed('cpu')\n"
        "def work():\n"
        "    raise UserError('no space left while writing best/')\n"
        "try:\n"
        "    D.on_main(work)\n"
        "except UserError as e:\n"
        "    print(f'rank {info.rank}: {e}', flush=True)\n"
        "print(f'rank {info.rank}: then {D.on_main(lambda: 42)}', flush=True)\n"
        "D.barrier()\nD.cleanup()\n"  # gloo's threads left running at exit can abort the process (terminate called ...)
    )
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(_free_port())]
    env = {**_env(), "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    proc = subprocess.run([*cmd, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in (0, 1):
        assert f"rank {rank}: no space left while writing best/" in proc.stdout
    assert "rank 0: then 42" in proc.stdout and "rank 1: then None" in proc.stdout
    assert "Traceback" not in proc.stderr


def test_rank_0_failing_to_log_stops_every_rank_with_its_line(shards, tmp_path, overrides):
    """Rank 0 alone writes metrics.jsonl: on a full disk there the other ranks went on into the next gradient
    all-reduce, to die with a traceback of a closed connection (NCCL: to wait out train.ddp_timeout). Two
    processes as srun starts them (no torchrun agent to kill the rest when one fails): both exit with the line."""
    script = tmp_path / "full_disk.py"
    script.write_text(
        "import sys\n"
        "from bertforge.errors import UserError\n"
        "from bertforge.runtime import metrics as M\n"
        "real = M.MetricsLogger.log\n"
        "def log(self, step, metrics):\n"
        "    if self.is_main and step == 2:\n"
        "        raise UserError('metrics.jsonl: no space left on the device')\n"
        "    return real(self, step, metrics)\n"
        "M.MetricsLogger.log = log\n"
        "from bertforge.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    sets = [f"--set={s}" for s in overrides(shards, tmp_path / "run", **{"train.max_steps": 4})]
    port = str(_free_port())
    env = {**_env(), "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src"), "MASTER_ADDR": "127.0.0.1"}
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), "pretrain", *sets],
            env={**env, "MASTER_PORT": port, "SLURM_PROCID": str(r), "SLURM_NTASKS": "2", "SLURM_STEP_ID": "0"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in (0, 1)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=240)
        assert proc.returncode == 2 and "metrics.jsonl: no space left on the device" in err, err[-3000:]
        assert "Traceback" not in err, err[-3000:]


LAYERS = {"train.compile": True, "train.compile_scope": "layers"}


@pytest.mark.parametrize(
    ("two_extra", "atol"),
    [({}, 1e-6), pytest.param(LAYERS, 2e-5, marks=pytest.mark.slow)],
    ids=["eager", "compiled-layer-by-layer"],
)
def test_two_processes_equal_one(shards, tmp_path, overrides, two_extra, atol):
    """Two gloo ranks (eager, or each encoder layer compiled inside DDP) train the weights of one eager process."""
    one, two = tmp_path / "one", tmp_path / "two"
    base = {"train.max_steps": 4, "train.save_every": 2}
    sets = lambda out, **x: [f"--set={s}" for s in overrides(shards, out, **base, **x)]  # noqa: E731
    _run([sys.executable, "-m", "bertforge", "pretrain", *sets(one)])
    _run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(_free_port()),
            "-m",
            "bertforge",
            "pretrain",
            *sets(two, **two_extra),
        ]
    )
    a, b = saved_weights(one), saved_weights(two)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=atol, msg=k)
    # the runs trained: step 2 -> 4 changed the weights (the last poly step has lr 0, step 3 does not)
    step2 = load_file(str(ckpt.list_checkpoints(one / "checkpoints")[0].model_dir / "model.safetensors"))
    assert any(not torch.equal(step2[k], a[k]) for k in a)
    meta = ckpt.latest_checkpoint(two / "checkpoints").meta()
    assert meta["world_size"] == 2


@pytest.mark.slow
def test_two_nodes_on_loopback(shards, tmp_path, overrides):
    """Two torchrun agents (--nnodes 2), c10d rendezvous on 127.0.0.1: trains and saves."""
    out = tmp_path / "nodes"
    port = _free_port()
    sets = [f"--set={s}" for s in overrides(shards, out, **{"train.max_steps": 3})]
    agents = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes",
                "2",
                "--node-rank",
                str(rank),
                "--nproc-per-node",
                "1",
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                f"127.0.0.1:{port}",
                "--rdzv-id",
                "bertforge-test",
                "-m",
                "bertforge",
                "pretrain",
                *sets,
            ],
            env=_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in (0, 1)
    ]
    outs = [a.communicate(timeout=300)[0] for a in agents]
    assert all(a.returncode == 0 for a in agents), "\n".join(o[-3000:] for o in outs)
    latest = ckpt.latest_checkpoint(out / "checkpoints")
    assert latest.step == 3 and latest.meta()["world_size"] == 2


@pytest.mark.parametrize(
    "env,expected",
    [
        ({}, (0, 1, 0, "none")),
        ({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1"}, (3, 8, 1, "torchrun")),
        (
            {"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "16", "OMPI_COMM_WORLD_LOCAL_RANK": "5"},
            (5, 16, 5, "mpi"),
        ),
        ({"PMI_RANK": "2", "PMI_SIZE": "4"}, (2, 4, 0, "mpi")),
        (
            {
                "SLURM_PROCID": "9",
                "SLURM_NTASKS": "16",
                "SLURM_LOCALID": "1",
                "SLURM_STEP_ID": "0",
                "SLURM_NTASKS_PER_NODE": "8(x2)",
            },
            (9, 16, 1, "slurm"),
        ),
        # an sbatch script itself (no job step) is not a distributed rank
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "16"}, (0, 1, 0, "none")),
    ],
)
def test_env_info(env, expected):
    info = env_info(env)
    assert (info.rank, info.world_size, info.local_rank, info.launcher) == expected
