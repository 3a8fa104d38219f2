"""The human-readable report of a :class:`~graphkv.plan.Plan` (what ``graphkv plan`` prints).

Pure string formatting over the frozen plan: every number shown is a field of the plan, and
every choice is printed with the reason the planner recorded for it.
"""

from __future__ import annotations

from collections import Counter
from typing import Sequence

from graphkv.distributed.plans import ConsensusPlan
from graphkv.plan.plan import GroupPlan, Ledger, LedgerEntry, Plan
from graphkv.printable import printable
from graphkv.spec.budget import format_bytes

__all__ = ["format_consensus", "format_layers", "format_plan", "format_sizes", "format_table"]

_MAX_SIZES_SHOWN = 8
_MAX_LAYERS_SHOWN = 4


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]], *, right: Sequence[int] = (),
                 indent: str = "  ") -> list[str]:
    """Rows aligned under ``headers``; columns whose index is in ``right`` are right-aligned.

    The last column is never padded, so a long reason does not widen the table.
    """
    widths = [max(len(str(row[i])) for row in (headers, *rows)) for i in range(len(headers))]
    lines = []
    for row in (headers, *rows):
        cells = []
        for i, cell in enumerate(row):
            text = str(cell)
            if i == len(row) - 1:
                cells.append(text)
            else:
                cells.append(text.rjust(widths[i]) if i in right else text.ljust(widths[i]))
        lines.append((indent + "  ".join(cells)).rstrip())
    return lines


def format_sizes(sizes: Sequence[int]) -> str:
    """A capture ladder in one short line: ``1 2 4 8 … 512 (40 sizes)`` when long."""
    if not sizes:
        return "none"
    if len(sizes) <= _MAX_SIZES_SHOWN:
        return " ".join(str(s) for s in sizes)
    head = " ".join(str(s) for s in sizes[:4])
    return f"{head} … {sizes[-1]} ({len(sizes)} sizes)"


def format_layers(layers: Sequence[int]) -> str:
    """A layer-index list as its count and first few indices: ``12: 3, 7, 11, 15, …`` (``0 on this
    stage`` for a group with no layer on a pipeline stage)."""
    if not layers:
        return "0 on this stage"
    shown = ", ".join(str(i) for i in layers[:_MAX_LAYERS_SHOWN])
    more = ", …" if len(layers) > _MAX_LAYERS_SHOWN else ""
    return f"{len(layers)}: {shown}{more}"


def _layer_kinds(plan: Plan) -> str:
    counts = Counter(layer.spec.kind.value for layer in plan.layers)
    text = ", ".join(f"{n} {kind}" for kind, n in counts.items())
    if plan.cacheless:
        none = Counter(c.spec.kind for c in plan.cacheless)
        parts = [f"{n} {'read earlier layers’ KV' if kind.value == 'kv_shared' else 'hold nothing (MLP / MoE)'}"
                 for kind, n in none.items()]
        text += f"; {len(plan.cacheless)} layers without a cache: " + ", ".join(parts)
    return text


def _group_rows(groups: Sequence[GroupPlan]) -> list[list[str]]:
    return [[str(g.index), g.kind.value, g.spec.describe(), format_layers(g.layers), ",".join(g.backends),
             str(g.block_size), str(g.kernel_block_size), str(g.bpk), format_bytes(g.page_size_bytes),
             str(g.pages_per_request)] for g in groups]


def _percent(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def _ledger_rows(entries: Sequence[LedgerEntry], budget_bytes: int | None) -> list[list[str]]:
    rows = []
    for e in entries:
        share = [_percent(e.nbytes, budget_bytes)] if budget_bytes is not None else []
        rows.append([e.name, format_bytes(e.nbytes), *share, e.reason])
    return rows


def _ledger_lines(ledger: Ledger) -> list[str]:
    lines = [f"Ledger: the KV budget of {format_bytes(ledger.budget_bytes)}, every byte attributed"]
    lines += format_table(["entry", "bytes", "budget", "reason"], _ledger_rows(ledger.kv_entries, ledger.budget_bytes),
                          right=(1, 2))
    lines.append("Beside the pool (allocated outside the KV budget)")
    lines += format_table(["entry", "bytes", "reason"], _ledger_rows(ledger.other_entries, None), right=(1,))
    return lines


def _cudagraph_lines(plan: Plan) -> list[str]:
    cg = plan.cudagraph
    mode = cg.mode.value if cg.mode is cg.requested_mode else f"{cg.requested_mode.value} -> {cg.mode.value}"
    lines = ["CUDA graphs",
             f"  support         {cg.support.name} (limited by {cg.limited_by})",
             f"  mode            {mode} (requested -> resolved)"]
    lines += [f"  downgrade       {d}" for d in cg.downgrades]
    lines.append(f"  decode sizes    {format_sizes(cg.capture_sizes.decode)}")
    lines.append(f"  mixed sizes     {format_sizes(cg.capture_sizes.mixed)}")
    if cg.max_capture_size:
        lines.append(f"  largest step    {cg.max_capture_size} tokens ({cg.max_capture_size_reason}); "
                     "larger steps run uncaptured")
    return lines


def _concurrency_line(plan: Plan) -> str:
    cap = plan.capacity
    by_kind: Counter[str] = Counter()
    for g in plan.groups:
        by_kind[g.kind.value] += g.pages_per_request
    split = " + ".join(f"{n} {kind}" for kind, n in by_kind.items())
    target = plan.limits.concurrency
    asked = f"; concurrency={target} asked" if target is not None else ""
    return (f"  concurrency     {cap.max_concurrency} request(s) of max_model_len at once "
            f"({cap.pages_per_request} pages each: {split}{asked})")


def _mamba_padding_line(plan: Plan) -> str:
    block = plan.block
    if not block.mamba_page_bytes:
        return "  mamba padding   none (no state layers)"
    pad = block.mamba_page_padding_bytes
    return (f"  mamba padding   {format_bytes(pad)} per page ({_percent(pad, block.mamba_page_bytes)} of the "
            f"{format_bytes(block.mamba_page_bytes)} page; state is {format_bytes(block.mamba_state_bytes)})")


def format_plan(plan: Plan, *, budget_text: str | None) -> str:
    """The plan as a report of at most a few dozen lines: every decision with its reason.

    ``budget_text`` describes where the KV bytes came from (e.g. ``Budget.describe()``); ``None``
    prints the ledger's budget bytes.

    >>> from graphkv import Budget, FullAttentionSpec, Limits, ModelKV, compile
    >>> model = ModelKV.from_specs("tiny", [(FullAttentionSpec(num_kv_heads=8, head_size=128), "flash_attn")] * 2)
    >>> print(format_plan(compile(model, Limits(max_model_len=4096), Budget.kv_bytes("1GiB")), budget_text=None))
    ... # doctest: +ELLIPSIS
    graphkv plan: tiny
    ...
    """
    cap = plan.capacity
    block = plan.block
    if block.mamba_block_size is not None:
        mamba_bs = str(block.mamba_block_size)
    elif any(g.is_ssm for g in plan.groups):
        mamba_bs = "none (mamba_cache_mode=none keeps one state per request)"
    else:  # mamba_cache_mode does not apply: say so, whatever mode was asked
        mamba_bs = f"none (no state layers: mamba_cache_mode={plan.limits.mamba_cache_mode.value} does not apply)"
    budget = budget_text if budget_text is not None else f"{format_bytes(plan.ledger.budget_bytes)} for the KV pool"
    lines = [
        f"graphkv plan: {plan.model_name}",
        f"  layers          {len(plan.layers)} KV {'layer' if len(plan.layers) == 1 else 'layers'}: {_layer_kinds(plan)}",
        *(f"  budget          {budget}".split("\n")),  # the GPU budget's breakdown is several lines
        f"  block size      {plan.block_size} tokens per page — {block.reason}",
        f"  mamba block     {mamba_bs}",
        "",
        f"KV cache groups: gs = {plan.group_size} layers per group -> {len(plan.slots)} pool slots, "
        f"{len(plan.groups)} group(s)",
    ]
    lines += format_table(["#", "kind", "spec", "layers", "backend", "block", "kernel", "bpk", "page", "pages/req"],
                          _group_rows(plan.groups), right=(0, 5, 6, 7, 8, 9))
    lines += [
        "",
        "Capacity",
        f"  page index      {format_bytes(plan.pool_bytes_per_block)} across {len(plan.slots)} slots "
        f"(pool_bytes_per_block = {plan.pool_bytes_per_block} B)",
        f"  num_blocks      {plan.num_blocks} — {cap.num_blocks_reason}",
        f"  usable pages    {cap.usable_pages} (page 0 is the null page); pool {format_bytes(plan.pool_bytes)}",
        f"  max_model_len   {plan.max_model_len} — {cap.max_model_len_reason}",
        _concurrency_line(plan),
        _mamba_padding_line(plan),
        "",
        *_cudagraph_lines(plan),
        "",
        *_ledger_lines(plan.ledger),
    ]
    if plan.notes:
        lines += ["", "Notes", *(f"  - {note}" for note in plan.notes)]
    return "\n".join(printable(line) for line in lines)  # names and notes come from a config file


def _rank_rows(consensus: ConsensusPlan) -> list[list[str]]:
    return [[str(r.rank), str(r.tp_rank), str(r.pp_rank), f"{r.model_layers[0]}-{r.model_layers[1]}",
             format_bytes(r.budget_bytes), format_bytes(r.pool_bytes_per_block), str(r.num_blocks), str(r.max_model_len)]
            for r in consensus.ranks]


def format_consensus(consensus: ConsensusPlan, *, budget_text: str) -> str:
    """What ``graphkv plan --tp N --pp M`` prints: each rank's own figures, what they agreed on and
    why, then the agreed plan of every pipeline stage (:func:`format_plan`).

    ``budget_text`` describes the budget each rank planned from (the same flags on every rank).
    """
    tp, pp = consensus.tensor_parallel_size, consensus.pipeline_parallel_size
    lines = [f"graphkv plan: {printable(consensus.stages[0].model_name)} on {tp * pp} ranks (tp {tp} x pp {pp})",
             f"  each rank       plans its own shard / stage from {budget_text}",
             "", "Ranks: their own plans (rank = pp rank x tp + tp rank)"]
    lines += format_table(["rank", "tp", "pp", "model layers", "KV budget", "page index", "num_blocks", "max_model_len"],
                          _rank_rows(consensus), right=(0, 1, 2, 4, 5, 6, 7))
    replicas = consensus.kv_tp_replicas
    lines += ["", "Agreed by every rank",
              f"  num_blocks      {consensus.num_blocks} — {consensus.num_blocks_reason}",
              f"  max_model_len   {consensus.max_model_len} — {consensus.max_model_len_reason}",
              f"  tp replicas     {replicas} — consecutive tensor-parallel ranks whose caches are identical"
              + (" (MLA latents / replicated KV heads)" if replicas > 1 else "")]
    for k, plan in enumerate(consensus.stages):
        members = [str(r.rank) for r in consensus.ranks if r.pp_rank == k]
        title = f"stage {k} of {pp}" if pp > 1 else "the agreed plan"
        pool = format_bytes(plan.pool_bytes)
        lines += ["", f"=== {title} (ranks {', '.join(members)}) ===",
                  format_plan(plan, budget_text=f"{pool}: the agreed {plan.num_blocks} pages of "
                                                f"{plan.pool_bytes_per_block} B per rank")]
    return "\n".join(lines)
