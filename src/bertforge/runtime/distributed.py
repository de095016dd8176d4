"""Distributed setup: read the launcher's environment, start the process group, wrap the model in DDP.

Recognised launchers (first match wins):
- torchrun / torch.distributed.run: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR/PORT;
- Open MPI `mpirun`: OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE; MPICH/Intel MPI: PMI_RANK/PMI_SIZE
  (+ MPI_LOCALRANKID); MASTER_ADDR must be set (e.g. `mpirun -x MASTER_ADDR=host0`);
- SLURM `srun`: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE; MASTER_ADDR from the
  environment (examples/pretrain.sbatch sets it to the first node of the allocation).
Backend from `bertforge.device.dist_backend`: NCCL on CUDA, gloo on CPU. The model's forward never uses this
module (`model/hf_interop.py` calls `unwrap` to save a wrapped model).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.distributed as dist
from torch import nn

from bertforge import device as dev
from bertforge.errors import UserError, first_line

T = TypeVar("T")


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    launcher: str = "none"

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def _int(env: dict[str, str], key: str, default: int | None = None) -> int:
    """`env[key]` as an int; `default` when unset or empty. A variable without a default must be set."""
    value = env.get(key)
    if value:
        return int(value)
    if default is None:
        raise UserError(f"the launcher set no {key} (or an empty one); set it or launch with torchrun")
    return default


def env_info(env: dict[str, str] | None = None) -> DistInfo:
    """Rank, world size and local rank from whichever launcher started this process."""
    env = dict(os.environ if env is None else env)
    if "RANK" in env and "WORLD_SIZE" in env:
        world = _int(env, "WORLD_SIZE")
        return DistInfo(
            _int(env, "RANK"), world, _int(env, "LOCAL_RANK", 0), _int(env, "LOCAL_WORLD_SIZE", world), "torchrun"
        )
    if "OMPI_COMM_WORLD_SIZE" in env:
        world = _int(env, "OMPI_COMM_WORLD_SIZE")
        return DistInfo(
            _int(env, "OMPI_COMM_WORLD_RANK"),
            world,
            _int(env, "OMPI_COMM_WORLD_LOCAL_RANK", 0),
            _int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", world),
            "mpi",
        )
    if "PMI_SIZE" in env:
        world = _int(env, "PMI_SIZE")
        return DistInfo(
            _int(env, "PMI_RANK"), world, _int(env, "MPI_LOCALRANKID", 0), _int(env, "MPI_LOCALNRANKS", world), "mpi"
        )
    if "SLURM_PROCID" in env and _int(env, "SLURM_NTASKS", 1) > 1 and "SLURM_STEP_ID" in env:
        world = _int(env, "SLURM_NTASKS")
        per_node = env.get("SLURM_NTASKS_PER_NODE", str(world)).split("(")[0]
        return DistInfo(_int(env, "SLURM_PROCID"), world, _int(env, "SLURM_LOCALID", 0), int(per_node), "slurm")
    return DistInfo()


def init_distributed(device_spec: str = "auto", timeout_s: float = 1800.0) -> tuple[DistInfo, torch.device]:
    """Start the process group (if this is a multi-process run) and pick this rank's device."""
    info = env_info()
    device = dev.resolve_device(device_spec, local_rank=info.local_rank, option="train.device")
    if not info.distributed or dist.is_initialized():
        return info, device
    if info.launcher != "torchrun":
        if "MASTER_ADDR" not in os.environ:
            raise UserError(
                f"launched by {info.launcher} with {info.world_size} processes but MASTER_ADDR is not "
                "set; export MASTER_ADDR=<first node's address> (and MASTER_PORT) for every process"
            )
        os.environ.setdefault("MASTER_PORT", "29500")
        os.environ.update(RANK=str(info.rank), WORLD_SIZE=str(info.world_size), LOCAL_RANK=str(info.local_rank))
    dev.set_device(device)
    dist.init_process_group(
        backend=dev.dist_backend(device),
        init_method="env://",
        rank=info.rank,
        world_size=info.world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    return info, device


PEER_WAIT_S = 5.0
"""Seconds rank 0, whose process hosts the rendezvous store under srun and mpirun, keeps it up for the other ranks
to read a failed rank's line."""
_FAILED, _READ = "bertforge/failed/", "bertforge/read/"


def cleanup() -> None:
    """End the process group. Called in a `finally` while a run's error propagates, it also passes the error on:
    a rank that fails alone (a damaged shard in its lanes) leaves the others in a collective, and under srun or
    mpirun (no torchrun agent to stop them) gloo then failed each with a traceback of a connection closed by
    the peer. The failed rank's UserError line goes into the rendezvous store, and a rank whose collective
    failed raises that line, naming the rank, in place of its own error. Not where the line cannot arrive: NCCL
    waits out train.ddp_timeout before a collective fails, and a rank 0 that fails alone under srun or mpirun
    takes the store with it (its peers' collectives fail once its process has gone)."""
    if not dist.is_initialized():
        return
    rank, world, error = dist.get_rank(), dist.get_world_size(), sys.exc_info()[1]
    peer = _pass_on(error, rank, world) if error is not None else None
    dist.destroy_process_group()
    if peer is not None:
        raise UserError(peer) from None


def _pass_on(error: BaseException, rank: int, world: int) -> str | None:
    """For `cleanup`: publish this rank's UserError, or return the line of a peer whose failure failed this rank's
    collective (a RuntimeError: gloo's "Connection closed by peer", NCCL's DistBackendError)."""
    if not isinstance(error, (UserError, RuntimeError)) or not _store_up():
        return None
    try:
        store = dist.distributed_c10d._get_default_store()
        if isinstance(error, UserError):
            store.set(f"{_FAILED}{rank}", first_line(error))
            return None
        failed = [r for r in range(world) if r != rank and store.check([f"{_FAILED}{r}"])]
        if not failed:
            return None
        line = store.get(f"{_FAILED}{failed[0]}").decode()
        store.set(f"{_READ}{rank}", "1")
        if rank == 0:  # the store's host (srun, mpirun): up until the others have read the line too (bounded)
            others = [f"{_READ}{r}" for r in range(1, world) if r not in failed]
            deadline = time.monotonic() + PEER_WAIT_S
            while others and not store.check(others) and time.monotonic() < deadline:
                time.sleep(0.05)
        return f"rank {failed[0]} stopped the run: {line}"
    except Exception:  # the store has gone after all: the error stays as it was
        return None


def _store_up() -> bool:
    """Whether the rendezvous store still listens: a call to a store whose host (rank 0 under srun or mpirun)
    has gone fails too, but with a C++ stack trace on stderr."""
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT", "")
    if not addr or not port.isdigit():
        return True  # not known here: the call's own failure decides
    try:
        with socket.create_connection((addr, int(port)), timeout=2):
            return True
    except OSError:
        return False


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def on_main(work: Callable[[], T]) -> T | None:
    """`work()` on rank 0 while the others wait (a barrier), its result on rank 0 (None elsewhere). A UserError
    on rank 0 (a full disk while it writes) is raised on every rank with the same one line: the ranks waiting in
    a barrier would otherwise each fail with a traceback of a closed connection."""
    if not dist.is_initialized():
        return work()
    result, error = None, None
    if dist.get_rank() == 0:
        try:
            result = work()
        except UserError as e:
            error = str(e)
    error = broadcast_object(error)  # doubles as the barrier
    if error is not None:
        raise UserError(error)
    return result


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum a tensor over ranks in place (a no-op in one process)."""
    if dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def broadcast_object(obj, src: int = 0):
    if not dist.is_initialized():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def wrap_ddp(model: nn.Module, device: torch.device, info: DistInfo) -> nn.Module:
    """DistributedDataParallel for multi-process runs; the model itself otherwise."""
    if not info.distributed:
        return model
    ids = [device.index] if device.type in ("cuda", "xpu") and device.index is not None else None
    # gradients are bucketed as views of the communication buffers: one copy fewer per step
    return nn.parallel.DistributedDataParallel(model, device_ids=ids, gradient_as_bucket_view=True)


def unwrap(model: nn.Module) -> nn.Module:
    """The plain model under DDP and torch.compile wrappers."""
    while True:
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if inner is None:
            return model
        model = inner


@contextlib.contextmanager
def maybe_no_sync(model: nn.Module, accumulating: bool) -> Iterator[None]:
    """Skip DDP's gradient all-reduce on accumulation micro-batches: one all-reduce per optimizer step."""
    if accumulating and isinstance(model, nn.parallel.DistributedDataParallel):
        with model.no_sync():
            yield
    else:
        yield
