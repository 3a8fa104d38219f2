"""How paged decode attention splits each sequence's K/V over programs, and the workspace it needs.

Pure functions of static quantities, computed on the host once per launch configuration (a capture
key fixes all of them), never from tensor values, so a captured graph always replays the same grid.

The split rule (:func:`num_decode_splits`): the decode kernel runs one program per (sequence, KV
head, split). A batch of ``num_seqs * num_kv_heads`` programs that already gives every SM
``PROGRAMS_PER_SM`` programs (``num_sms * PROGRAMS_PER_SM``, 264 on an H100) runs unsplit; a smaller
one splits each sequence into ``ceil(264 / (num_seqs * num_kv_heads))`` contiguous ranges of kernel
blocks, so that together they fill the GPU, but never into more ranges than leave every range at
least ``MIN_SPLIT_TOKENS`` tokens of a full-width table (``table_width_kernel_blocks //
max(1, MIN_SPLIT_TOKENS // kernel_block_size)``), and never into more than ``MAX_DECODE_SPLITS``.
``num_seqs`` is the batch as launched (a capture key's padded request count), not the live count.

Each split writes a partial (running max, sum and unnormalised output, fp32) per query head into the
workspace, rows ``seq * num_splits + split``; a second kernel combines them. With one split nothing
is written there and the first kernel writes the output itself.
"""

from __future__ import annotations

import torch

from graphkv.errors import Problem, SpecError

__all__ = ["DEFAULT_NUM_SMS", "MAX_DECODE_SPLITS", "MIN_SPLIT_TOKENS", "PROGRAMS_PER_SM", "decode_workspace",
           "decode_workspace_shape", "num_decode_splits", "workspace_row_floats"]

DEFAULT_NUM_SMS = 132  # an H100 SXM; pass torch.cuda.get_device_properties(d).multi_processor_count elsewhere
PROGRAMS_PER_SM = 2  # two resident programs per SM keep enough K/V loads in flight to reach HBM bandwidth
# A split below this reads too little K/V to pay for its partial's write and read: one 64-token tile of K and V
# (32 KiB in bf16 at head size 128) against a 2 KiB partial. It was 256 until an H100 (2026-11-26) showed short
# contexts starved of programs: at batch 1 and 512 tokens the rule gave 2 splits, 16 programs on 132 SMs, and the
# kernel took 11.5 us per layer (the 0.94B model's decode step spent 193 us of 1.6 ms in it), each program
# reading its 4 tiles one after another.
MIN_SPLIT_TOKENS = 64
MAX_DECODE_SPLITS = 128  # bounds the combine kernel's work and the workspace


def _check_counts(minimum: int, **values: int) -> None:
    """Raise SpecError naming every argument that is not an int >= ``minimum``."""
    problems = [Problem(field=name, value=value, limit=f"must be an int >= {minimum}",
                        fix=f"pass {name} of the launch (from the plan, the model and the device)")
                for name, value in values.items()
                if isinstance(value, bool) or not isinstance(value, int) or value < minimum]
    if problems:
        raise SpecError(*problems)


def num_decode_splits(num_seqs: int, *, num_kv_heads: int, table_width_kernel_blocks: int, kernel_block_size: int,
                      num_sms: int = DEFAULT_NUM_SMS) -> int:
    """Splits per sequence for a decode launch of ``num_seqs`` sequences (the padded batch of a
    capture key): 1 when ``num_seqs * num_kv_heads >= PROGRAMS_PER_SM * num_sms``, otherwise enough
    to reach that many programs, at most one per ``MIN_SPLIT_TOKENS`` tokens of the table's width
    and at most ``MAX_DECODE_SPLITS`` (see the module docstring). Pure; host-side.

    >>> num_decode_splits(1, num_kv_heads=8, table_width_kernel_blocks=2048, kernel_block_size=16)  # 32k tokens
    33
    >>> num_decode_splits(1, num_kv_heads=8, table_width_kernel_blocks=32, kernel_block_size=16)  # 512 tokens
    8
    >>> num_decode_splits(128, num_kv_heads=8, table_width_kernel_blocks=2048, kernel_block_size=16)
    1
    """
    _check_counts(1, num_seqs=num_seqs, num_kv_heads=num_kv_heads, kernel_block_size=kernel_block_size, num_sms=num_sms)
    _check_counts(0, table_width_kernel_blocks=table_width_kernel_blocks)
    programs = num_seqs * num_kv_heads
    wanted = PROGRAMS_PER_SM * num_sms
    if programs >= wanted:
        return 1
    min_kernel_blocks = max(1, MIN_SPLIT_TOKENS // kernel_block_size)
    by_length = max(1, table_width_kernel_blocks // min_kernel_blocks)
    return min(-(-wanted // programs), by_length, MAX_DECODE_SPLITS)


def workspace_row_floats(head_size: int) -> int:
    """Floats per (partial, query head) row: the ``head_size`` unnormalised outputs, the running max
    (log2 units) and the sum, rounded up to a multiple of 4 (16-byte rows)."""
    return -(-(head_size + 2) // 4) * 4


def decode_workspace_shape(max_num_seqs: int, *, num_q_heads: int, num_kv_heads: int, head_size: int,
                           table_width_kernel_blocks: int, kernel_block_size: int,
                           num_sms: int = DEFAULT_NUM_SMS) -> tuple[int, int, int]:
    """``(rows, num_q_heads, workspace_row_floats(head_size))`` float32: enough rows for any launch
    of ``num_seqs <= max_num_seqs`` sequences with the split rule's ``num_splits > 1`` (``num_seqs *
    num_splits`` rows; at least one row). Pure; size it once at plan time.

    >>> decode_workspace_shape(256, num_q_heads=32, num_kv_heads=8, head_size=128, table_width_kernel_blocks=2048,
    ...                        kernel_block_size=16)
    (64, 32, 132)
    """
    _check_counts(1, max_num_seqs=max_num_seqs, num_q_heads=num_q_heads, head_size=head_size)
    rows = 1
    for n in range(1, max_num_seqs + 1):
        splits = num_decode_splits(n, num_kv_heads=num_kv_heads, table_width_kernel_blocks=table_width_kernel_blocks,
                                   kernel_block_size=kernel_block_size, num_sms=num_sms)
        if splits == 1:
            break  # more sequences only split less
        rows = max(rows, n * splits)
    return rows, num_q_heads, workspace_row_floats(head_size)


def decode_workspace(max_num_seqs: int, *, num_q_heads: int, num_kv_heads: int, head_size: int,
                     table_width_kernel_blocks: int, kernel_block_size: int, device: torch.device | str,
                     num_sms: int = DEFAULT_NUM_SMS) -> torch.Tensor:
    """The persistent float32 workspace of :func:`decode_workspace_shape` on ``device`` (contents
    undefined: every launch writes the rows it reads). Allocate it once, next to the other
    persistent buffers, and pass it as ``workspace=`` on every launch, so a captured graph replays
    with no allocation.

    Example::

        ws = decode_workspace(256, num_q_heads=32, num_kv_heads=8, head_size=128,
                              table_width_kernel_blocks=2048, kernel_block_size=16, device="cuda")
    """
    shape = decode_workspace_shape(max_num_seqs, num_q_heads=num_q_heads, num_kv_heads=num_kv_heads,
                                   head_size=head_size, table_width_kernel_blocks=table_width_kernel_blocks,
                                   kernel_block_size=kernel_block_size, num_sms=num_sms)
    return torch.empty(shape, dtype=torch.float32, device=device)
