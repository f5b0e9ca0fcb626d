"""The processes of one training run: ``negotiate train`` under ``torchrun`` or ``accelerate launch``.

Both launchers start N copies of the same command and tell each its place in the environment
(``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``). This module owns
what the run does with that, and nothing else: :func:`from_env` reads it (one process when the
variables are absent), :func:`join` joins the process group (NCCL on GPUs, gloo on CPUs) and
picks this process's GPU, and the few collectives the trainer needs are here, each a no-op for
one process.

How the methods that learn from traces use several processes (``negotiate.training.trainer``):
every process reads the same traces and builds the same examples, and draws the same global
batch of ``--batch-size`` decisions from one seeded shuffle; process ``r`` takes decisions
``r, r + N, ...`` of it (:func:`share`). The step's loss is a sum over the batch's decisions
divided by the batch's token count, so the sum of the processes' gradients (:func:`sum_gradients`,
one all-reduce per step) is the gradient one process would compute on the whole batch, and
every process clips it and takes the same optimizer step: the weights stay equal without a
``DistributedDataParallel`` wrapper, whose per-forward bookkeeping does not fit the shared
prompt-prefix pass (two forward calls per micro-batch). With LoRA the all-reduce moves the
adapter's gradient only (4.9 million floats for SmolLM2-135M at rank 16: 3.5% of its weights). ``online-grpo``
hands the process group to TRL and accelerate, which set it up themselves.

Only rank 0 writes: the checkpoint, ``metrics.jsonl``, ``train.json``, the evaluation traces,
the log file and the progress bar.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from negotiate.errors import UserError

__all__ = ["Ranks", "from_env", "join", "leave", "share", "sum_gradients", "sum_floats", "gather", "broadcast_parameters"]


@dataclass(frozen=True)
class Ranks:
    """This process's place among the run's processes."""

    rank: int = 0
    """0 to ``world - 1``; rank 0 writes every file the run makes."""
    world: int = 1
    """How many processes train together (``WORLD_SIZE``)."""
    local: int = 0
    """Its rank on its own machine (``LOCAL_RANK``): the GPU it takes."""

    @property
    def main(self) -> bool:
        """Whether this process writes the run's files."""
        return self.rank == 0

    @property
    def many(self) -> bool:
        return self.world > 1


ONE = Ranks()
"""A run of one process."""


def from_env(environ: Mapping[str, str] = os.environ) -> Ranks:
    """The ranks torchrun or accelerate launch set; one process where they set none.

    >>> from_env({})
    Ranks(rank=0, world=1, local=0)
    >>> from_env({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"})
    Ranks(rank=1, world=2, local=1)
    """
    values = {}
    for name, key, default in (("world", "WORLD_SIZE", "1"), ("rank", "RANK", "0"), ("local", "LOCAL_RANK", None)):
        text = environ.get(key, default if default is not None else environ.get("RANK", "0"))
        try:
            values[name] = int(text)
        except ValueError:
            raise UserError("must be a whole number (set by torchrun or accelerate launch)", field=key, value=text) from None
    if values["world"] < 1:
        raise UserError("must be at least 1", field="WORLD_SIZE", value=values["world"])
    if not 0 <= values["rank"] < values["world"]:
        raise UserError(f"must be from 0 to WORLD_SIZE - 1 ({values['world'] - 1})", field="RANK", value=values["rank"])
    return Ranks(**values)


def join(ranks: Ranks) -> bool:
    """Join the process group (NCCL where CUDA is, else gloo) and take GPU ``LOCAL_RANK``; returns whether
    this call made the group (and :func:`leave` should end it). Nothing to do for one process."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.set_device(ranks.local % torch.cuda.device_count())  # load_policy's .to("cuda") lands here
    if not ranks.many:
        return False
    import torch.distributed as dist

    if dist.is_initialized():
        return False
    dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
    return True


def leave(made: bool, *, wait: bool = True) -> None:
    """Leave the process group this run made: once every rank is done (a barrier: rank 0 may still be saving), or at
    once after an error (``wait=False``: another rank may be inside a collective that will never complete; torchrun
    ends the others when one process fails)."""
    import torch.distributed as dist

    if made and dist.is_initialized():
        if wait:
            dist.barrier()
            # gloo's thread frees the barrier's work (a Python tensor: it needs the GIL) after the wait returns; a group
            # destroyed meanwhile joins that thread with the GIL held, and both wait for ever. A moment without the GIL
            # lets it finish.
            time.sleep(0.2)
        dist.destroy_process_group()


def share(items: Sequence, ranks: Ranks) -> list:
    """This rank's share of a global batch: items ``rank, rank + world, ...``.

    >>> share("abcde", Ranks(rank=1, world=2, local=1))
    ['b', 'd']
    """
    return list(items[ranks.rank :: ranks.world])


def sum_gradients(params: Sequence, ranks: Ranks) -> None:
    """Replace each parameter's gradient by its sum over the ranks (one all-reduce of one flat buffer).
    A parameter this rank gave no gradient counts as zeros."""
    if not ranks.many:
        return
    import torch
    import torch.distributed as dist

    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    offset = 0
    for p in params:
        n = p.numel()
        p.grad = flat[offset : offset + n].view_as(p)  # views of the one summed buffer: no second copy
        offset += n


def sum_floats(values: Sequence[float], ranks: Ranks) -> list[float]:
    """Each value summed over the ranks (the step's loss, the counts behind a logged mean)."""
    if not ranks.many:
        return list(values)
    import torch
    import torch.distributed as dist

    tensor = torch.tensor(list(values), dtype=torch.float64)
    if torch.cuda.is_available() and dist.get_backend() == "nccl":
        tensor = tensor.cuda()
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return [float(v) for v in tensor.cpu()]


def gather(value, ranks: Ranks) -> list:
    """Every rank's ``value`` (any picklable object), in rank order, on every rank."""
    if not ranks.many:
        return [value]
    import torch.distributed as dist

    out: list = [None] * ranks.world
    dist.all_gather_object(out, value)
    return out


def broadcast_parameters(params: Sequence, ranks: Ranks) -> None:
    """Rank 0's values of ``params`` on every rank (the starting point: a fresh LoRA adapter is drawn from
    the seed on each rank alike, and this makes sure of it, as DistributedDataParallel does)."""
    if not ranks.many:
        return
    import torch.distributed as dist

    for p in params:
        dist.broadcast(p.data, src=0)
