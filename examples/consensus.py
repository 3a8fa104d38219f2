"""Four ranks agree on one KV plan over torch.distributed: Qwen3-Next on tensor parallel 2 x pipeline parallel 2.

    python examples/consensus.py        # 4 CPU processes over gloo; on GPUs, init with "nccl" instead

Each rank builds what it caches (``shard`` for its tensor-parallel rank, ``stage`` for its
pipeline stage) and plans it from the memory it has — here 20, 18, 16 and 19 GiB, as four GPUs
with different free memory would measure. ``compile_consensus`` exchanges the plans and every rank
gets the same result: the smallest pool, the shortest auto-fit length, one plan per stage.
"""

from __future__ import annotations

import socket
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from graphkv import Budget, Limits
from graphkv.distributed import compile_consensus
from graphkv.presets import preset_model

TP, PP = 2, 2
FREE_GIB = (20, 18, 16, 19)  # what each rank measured (torch.cuda.mem_get_info on a GPU)


def rank_main(rank: int, port: int) -> None:
    """One rank: join the group, plan its own shard / stage, agree, print (rank 0)."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=TP * PP,
                            timeout=timedelta(seconds=60))
    local = preset_model("qwen3-next-80b-a3b").shard(TP, rank % TP).stage(PP, rank // TP)
    agreed = compile_consensus(local, Limits(max_num_seqs=64), Budget.kv_bytes(f"{FREE_GIB[rank]}GiB"), timeout=60)
    mine = agreed.plan_for(local)  # this rank's stage plan: allocate exactly this
    if rank == 0:
        for r in agreed.ranks:
            print(f"rank {r.rank} (tp {r.tp_rank}, pp {r.pp_rank}): layers {r.model_layers[0]}-{r.model_layers[1]}, "
                  f"own plan {r.num_blocks} pages")
        print(f"agreed: {agreed.num_blocks} pages, max_model_len {agreed.max_model_len}, block size {mine.block_size}")
        print(f"stage 0 holds {len(mine.layers)} layers, {mine.pool_bytes_per_block} B per page index")
    dist.destroy_process_group()


def main() -> None:
    """Spawn the four ranks on a free local port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(rank_main, args=(port,), nprocs=TP * PP, join=True)


if __name__ == "__main__":
    main()
