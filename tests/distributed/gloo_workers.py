"""Worker processes for the gloo consensus tests (spawned by ``torch.multiprocessing``).

Each worker joins one gloo process group, runs several consensus checks on it in a fixed order,
writes what it saw to ``<out>/<rank>.json`` and leaves with ``os._exit`` (a group that lost a
rank must not be torn down politely). The test reads the files; nothing here asserts.
"""

from __future__ import annotations

import json
import os
import socket
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

GROUP_TIMEOUT_S = 20  # the process group's own timeout (init and collectives)
CONSENSUS_TIMEOUT_S = 3.0  # how long compile_consensus waits for a missing rank


def free_port() -> int:
    """A TCP port nothing listens on right now (bound to 0 and released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _join(rank: int, world: int, port: int, backend: str = "gloo") -> None:
    import torch.distributed as dist

    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=GROUP_TIMEOUT_S))


def _outcome(call: Callable[[], Any]) -> dict[str, Any]:
    """``{"plan": ...}`` or ``{"error": type, "fields": [...], "message": ..., "seconds": ...}``."""
    from graphkv.errors import GraphkvError

    start = time.perf_counter()
    try:
        agreed = call()
    except GraphkvError as err:
        return {"error": type(err).__name__, "fields": [p.field for p in err.problems], "message": str(err),
                "seconds": time.perf_counter() - start}
    return {"plan": agreed.to_dict(), "seconds": time.perf_counter() - start}


def _write(out: str, rank: int, seen: dict[str, Any]) -> None:
    Path(out, f"{rank}.json").write_text(json.dumps(seen))


def _end_with_a_dead_rank(rank: int, dying: int, out: str, seen: dict[str, Any], call: Callable[[], Any]) -> None:
    """Rank ``dying`` writes what it saw and exits once the others reach the barrier; they then run ``call``
    without it (as ``seen["dead"]``), write and exit."""
    import torch.distributed as dist

    if rank == dying:
        _write(out, rank, seen)
        dist.barrier()
        time.sleep(0.2)  # let the barrier's last message leave this process before it dies
        os._exit(0)
    dist.barrier()
    seen["dead"] = _outcome(call)
    _write(out, rank, seen)
    os._exit(0)


def four_ranks(rank: int, world: int, port: int, out: str) -> None:
    """Qwen3-Next over tp 2 x pp 2: unequal budgets, a mismatched spec, a rank that cannot plan, a dead rank."""
    from graphkv import Budget, Limits
    from graphkv.distributed import compile_consensus
    from graphkv.presets import preset_model

    _join(rank, world, port)
    whole = preset_model("qwen3-next-80b-a3b")
    local = whole.shard(2, rank % 2).stage(2, rank // 2)
    seen: dict[str, Any] = {}
    seen["agree"] = _outcome(lambda: compile_consensus(local, Limits(), Budget.kv_bytes(f"{10 + rank}GiB"),
                                                       timeout=CONSENSUS_TIMEOUT_S))
    fp8 = preset_model("qwen3-next-80b-a3b", kv_cache_dtype="fp8").shard(2, 1).stage(2, 0)
    seen["mismatch"] = _outcome(lambda: compile_consensus(fp8 if rank == 1 else local, Limits(),
                                                          Budget.kv_bytes("10GiB"), timeout=CONSENSUS_TIMEOUT_S))
    seen["own_failure"] = _outcome(lambda: compile_consensus(local, Limits(),
                                                             Budget.kv_bytes("1MiB" if rank == 2 else "10GiB"),
                                                             timeout=CONSENSUS_TIMEOUT_S))
    _end_with_a_dead_rank(rank, 3, out, seen, lambda: compile_consensus(local, Limits(), Budget.kv_bytes("10GiB"),
                                                                        timeout=CONSENSUS_TIMEOUT_S))


def two_ranks(rank: int, world: int, port: int, out: str) -> None:
    """Llama-3.1-8B over tp 2 with 8 and 6 GiB, different limits, a cpu:gloo group passed explicitly, rank 0 late,
    then rank 0 (the store's host) dies."""
    from graphkv import Budget, Limits
    from graphkv.distributed import compile_consensus
    from graphkv.presets import preset_model

    _join(rank, world, port)
    local = preset_model("llama-3.1-8b").shard(2, rank)
    seen: dict[str, Any] = {}
    seen["agree"] = _outcome(lambda: compile_consensus(local, Limits(), Budget.kv_bytes("8GiB" if rank == 0 else "6GiB"),
                                                       timeout=CONSENSUS_TIMEOUT_S))
    limits = Limits(max_model_len=4096) if rank == 1 else Limits()
    seen["mismatch"] = _outcome(lambda: compile_consensus(local, limits, Budget.kv_bytes("8GiB"),
                                                          timeout=CONSENSUS_TIMEOUT_S))
    import torch.distributed as dist

    # A group whose backend is not plain gloo (as an nccl group on GPUs): the exchange runs on a gloo group beside it.
    composite = dist.new_group(ranks=[0, 1], backend="cpu:gloo")
    seen["composite_backend"] = dist.get_backend(composite)
    seen["composite"] = _outcome(lambda: compile_consensus(local, Limits(), Budget.kv_bytes("4GiB"), group=composite,
                                                           timeout=CONSENSUS_TIMEOUT_S))
    # Rank 0 late (alive, calling after twice the timeout): rank 1 must not wait for the group's own 20 s.
    late = 2 * CONSENSUS_TIMEOUT_S

    def late_zero() -> Any:
        if rank == 0:
            time.sleep(late)
        return compile_consensus(local, Limits(), Budget.kv_bytes("8GiB"), timeout=CONSENSUS_TIMEOUT_S)

    seen["late_zero"] = _outcome(late_zero)
    _end_with_a_dead_rank(rank, 0, out, seen, lambda: compile_consensus(local, Limits(), Budget.kv_bytes("8GiB"),
                                                                        timeout=CONSENSUS_TIMEOUT_S))


def launch(worker: Callable[..., None], nprocs: int, out: Path, deadline_s: float = 90.0) -> list[dict[str, Any]]:
    """Spawn ``nprocs`` workers on a fresh port and return what each wrote; kills them all after ``deadline_s``."""
    import torch.multiprocessing as mp

    context = mp.start_processes(worker, args=(nprocs, free_port(), str(out)), nprocs=nprocs, join=False,
                                 start_method="spawn")
    deadline = time.monotonic() + deadline_s
    try:
        while not context.join(timeout=max(deadline - time.monotonic(), 0.1)):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{nprocs} consensus workers still running after {deadline_s:g} s")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
    return [json.loads(Path(out, f"{rank}.json").read_text()) for rank in range(nprocs)]


def nccl_ranks(rank: int, world: int, port: int, out: str) -> None:
    """Llama-3.1-8B over tp 2 on two GPUs (nccl world), 8 and 6 GiB."""
    import torch

    from graphkv import Budget, Limits
    from graphkv.distributed import compile_consensus
    from graphkv.presets import preset_model

    torch.cuda.set_device(rank)
    _join(rank, world, port, backend="nccl")
    local = preset_model("llama-3.1-8b").shard(2, rank)
    seen = {"agree": _outcome(lambda: compile_consensus(local, Limits(), Budget.kv_bytes("8GiB" if rank == 0 else "6GiB"),
                                                        timeout=CONSENSUS_TIMEOUT_S))}
    _write(out, rank, seen)
    os._exit(0)
