"""Where training runs: the accelerator `train.accelerator: auto` resolves to, how many devices
and processes that makes, and the strategy they train with (DDP whenever more than one process
trains). A run over several machines is refused unless a cluster launcher started it, since rank
0 would otherwise wait for peers that never come.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import TYPE_CHECKING

import torch

from pipeline.config_schema import Config
from pipeline.errors import ConfigError

if TYPE_CHECKING:  # Lightning loads where a strategy is built: resolving the device needs none
    from lightning.pytorch.strategies import Strategy

GPU_ACCELERATORS = ("gpu", "cuda")


def resolve_accelerator(requested: str) -> str:
    if requested != "auto":
        return requested
    if torch.cuda.is_available():
        return "gpu"
    if torch.backends.mps.is_available():
        return "mps"
    return "cpu"


def device_count(devices, accelerator: str) -> int:
    """How many devices `Trainer(devices=...)` will use on this node."""
    if isinstance(devices, (list, tuple)):
        return len(devices)
    if isinstance(devices, str) and devices != "auto":
        devices = [d for d in devices.split(",") if d.strip()] if "," in devices else int(devices)
        return len(devices) if isinstance(devices, list) else device_count(devices, accelerator)
    if devices == "auto" or devices == -1:
        return torch.cuda.device_count() if accelerator in GPU_ACCELERATORS else 1
    return int(devices)


def resolve_strategy(requested: str, num_devices: int, num_nodes: int) -> str:
    """`auto`: DDP whenever more than one process trains (gloo on CPU, NCCL on GPU)."""
    if requested != "auto":
        return requested
    return "ddp" if num_devices * num_nodes > 1 else "auto"


def check_cluster_launch(num_nodes: int, devices_per_node: int) -> None:
    """Several machines train together only when a cluster launcher started every process:
    torchrun (its TORCHELASTIC_RUN_ID, RANK, WORLD_SIZE, ...), SLURM's srun (SLURM_NTASKS,
    SLURM_PROCID, ...) or hand-set MASTER_ADDR/NODE_RANK/LOCAL_RANK, which Lightning's cluster
    environments read. Started plainly, rank 0 would wait for the other machines until
    `train.ddp_timeout`: refused before any compute, naming the key and the launchers."""
    if num_nodes == 1:
        return
    from lightning.fabric.plugins.environments import (
        LightningEnvironment,
        SLURMEnvironment,
        TorchElasticEnvironment,
    )

    launched = (
        TorchElasticEnvironment.detect()
        or SLURMEnvironment.detect()
        or LightningEnvironment().creates_processes_externally
    )
    if not launched:
        raise ConfigError(
            f"config key 'train.num_nodes': {num_nodes} machines need a cluster launcher to "
            "start one process per device on each: `torchrun --nnodes N --nproc-per-node D "
            "--node-rank R --master-addr HOST --master-port PORT -m pipeline.stages.train` "
            "on every machine, or `srun` in a SLURM job (see the training docs); or set "
            "train.num_nodes=1"
        )
    expected = num_nodes * devices_per_node
    world_size = os.environ.get("WORLD_SIZE") or os.environ.get("SLURM_NTASKS")
    if world_size is not None and int(world_size) != expected:
        raise ConfigError(
            f"config key 'train.num_nodes': {num_nodes} machines x {devices_per_node} "
            f"device(s) (train.devices) make {expected} processes, but the launcher started "
            f"{world_size}; make train.num_nodes x train.devices equal the launcher's world size"
        )


def build_strategy(cfg: Config, accelerator: str) -> str | Strategy:
    """`train.strategy` resolved; plain DDP gets `train.ddp_timeout` for its collectives, so a
    rank that died or hangs ends the job after that long instead of stalling the others."""
    t = cfg.train
    strategy = resolve_strategy(t.strategy, device_count(t.devices, accelerator), t.num_nodes)
    if strategy == "ddp":
        from lightning.pytorch.strategies import DDPStrategy

        return DDPStrategy(timeout=timedelta(seconds=t.ddp_timeout))
    return strategy
