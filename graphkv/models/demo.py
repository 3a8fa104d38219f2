"""``graphkv demo``: plan, allocate, (capture) and serve the tiny hybrid model end to end.

The demo compiles a plan for :class:`TinyHybridConfig` (Mamba-style recurrences and flex
attention sharing one pool), allocates it, wraps the paged model's forward with
:func:`graphkv.runtime.capture.capture` (graphs are captured on a GPU; on a CPU the wrapper says
why they are unavailable and every step runs eagerly) and runs a continuous-batching workload
whose requests arrive while others decode. It prints the plan report, then the run's numbers.
"""

from __future__ import annotations

import sys
import time
import warnings
from typing import Any, TextIO

import attrs

from graphkv.command.device_flag import device_from_flag
from graphkv.errors import Problem, SpecError
from graphkv.memory.available import check_pool_fits
from graphkv.models.tiny_hybrid import TinyHybridConfig, model_kv
from graphkv.plan import Plan, compile_plan
from graphkv.spec.budget import Budget
from graphkv.spec.limits import CudaGraphMode, Limits

__all__ = ["MAX_SEED", "DemoOptions", "DemoResult", "check_memory", "check_options", "demo_plan", "demo_requests",
           "run_demo", "serve_demo"]

MAX_SEED = (1 << 63) - 1  # torch.Generator.manual_seed takes a 64-bit seed


@attrs.frozen(kw_only=True)
class DemoOptions:
    """Workload and limits of a demo run (the defaults finish in seconds on a CPU)."""

    requests: int = 12
    prompt_len: tuple[int, int] = (4, 96)  # uniform in [low, high]
    new_tokens: int = 16
    max_num_seqs: int = 8
    max_num_batched_tokens: int = 256
    max_model_len: int = 512
    kv_memory: str = "2MiB"
    device: str = "auto"  # "auto": cuda when available
    capture: bool = True
    seed: int = 0
    threads: int = 1  # torch CPU threads: 1 gives timings that do not depend on how busy the machine is
    kernels: str = "auto"  # "triton" on a CPU: the GPU path (interpreted kernels, staged tables, rehearsed capture)
    compile: str = "auto"  # --hf only: graphkv.hf's compile mode (DEMO_COMPILE); "auto" is PagedModel's default
    trace_layers: bool = False  # --hf only, with compile "piecewise" / "fused": one decoder layer traced for all


@attrs.frozen(kw_only=True)
class DemoResult:
    """What a demo run measured."""

    device: str
    threads: int  # torch.get_num_threads() during the run
    graphs: str  # what capture did, or why graphs are unavailable
    steps: int
    requests: int
    tokens: int
    generated: int
    pages_reused: int
    seconds: float

    @property
    def tokens_per_second(self) -> float:
        """Processed (prompt + generated) tokens per second of stepping."""
        return self.tokens / self.seconds if self.seconds else 0.0

    def __str__(self) -> str:
        return "\n".join([
            f"device          {self.device}",
            f"threads         {self.threads} (torch.set_num_threads; --threads)",
            f"cuda graphs     {self.graphs}",
            f"requests        {self.requests} finished in {self.steps} steps (continuous batching)",
            f"tokens          {self.tokens} processed, {self.generated} generated",
            f"pages reused    {self.pages_reused} (handed out again after a request finished)",
            f"time            {self.seconds:.2f} s stepping, {self.tokens_per_second:,.0f} tokens/s, "
            f"{self.generated / self.seconds if self.seconds else 0.0:,.0f} generated tokens/s",
        ])


def demo_plan(options: DemoOptions, config: TinyHybridConfig | None = None) -> Plan:
    """The demo model's plan under ``options``' limits and KV memory."""
    config = config or TinyHybridConfig()
    # Decode steps replay FULL graphs; mixed (prefill) steps run eagerly: the recurrence backend
    # supports uniform batches only, and PIECEWISE graphs would need attention as registered ops.
    limits = Limits(max_model_len=options.max_model_len, max_num_seqs=options.max_num_seqs,
                    max_num_batched_tokens=options.max_num_batched_tokens,
                    cudagraph_mode=CudaGraphMode.FULL_DECODE_ONLY)
    return compile_plan(model_kv(config), limits, Budget.kv_bytes(options.kv_memory))


def check_memory(plan: Plan, device: str, kv_memory: str) -> None:
    """Refuse a pool (plus the step's buffers) the device cannot hold before allocating anything."""
    check_pool_fits(plan, device, field="--kv-memory", value=kv_memory,
                    fix=f", e.g. {DemoOptions().kv_memory} (the default: the demo needs a few MiB)")


def check_options(options: DemoOptions) -> str:
    """Validate the options a demo run reads before anything is built; returns the device to use
    (``"cpu"`` or ``"cuda"``). Raises :class:`SpecError` naming the flag."""
    import torch

    device = device_from_flag(options.device, torch.cuda.is_available())
    if not 1 <= options.threads <= 1024:
        raise SpecError(Problem(field="--threads", value=options.threads, limit="must be between 1 and 1024",
                                fix="pass the number of CPU threads torch may use, e.g. 1"))
    if not 0 <= options.seed <= MAX_SEED:
        raise SpecError(Problem(field="--seed", value=options.seed, limit=f"must be in [0, {MAX_SEED}] (a 64-bit seed)",
                                fix="pass a smaller seed"))
    return device


def demo_requests(options: DemoOptions, vocab_size: int) -> tuple[list[Any], dict[int, list[Any]]]:
    """``options.requests`` random prompts (lengths in ``options.prompt_len``, seeded by
    ``options.seed``): the half present at the start, and the rest arriving one every other step."""
    import torch

    from graphkv.models.demo_engine import DemoRequest

    gen = torch.Generator().manual_seed(options.seed)
    low, high = options.prompt_len
    requests = [DemoRequest(req_id=i, prompt=torch.randint(0, vocab_size, (int(n),), generator=gen).tolist(),
                            max_new_tokens=options.new_tokens)
                for i, n in enumerate(torch.randint(low, high + 1, (options.requests,), generator=gen))]
    first = (len(requests) + 1) // 2
    return requests[:first], {2 * (i + 1): [r] for i, r in enumerate(requests[first:])}


def serve_demo(engine: Any, options: DemoOptions, vocab_size: int, *, device: str, graphs: str,
               progress: bool) -> DemoResult:
    """Run :func:`demo_requests` through ``engine`` (a :class:`DemoEngine`) and measure it."""
    import torch

    first, arrivals = demo_requests(options, vocab_size)
    total = len(first) + sum(map(len, arrivals.values()))
    show = progress and sys.stderr.isatty()

    def on_step(stats: Any) -> None:
        if show:
            sys.stderr.write(f"\rgraphkv demo: step {stats.steps}, {stats.finished}/{total} requests finished")

    start = time.perf_counter()
    with warnings.catch_warnings():
        # Eager flex attention (CPU) warns that it is slower than compiled flex; the demo knows.
        warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile")
        engine.run(first, arrivals=arrivals, on_step=on_step)
    if show:
        sys.stderr.write("\n")
    if device == "cuda":
        torch.cuda.synchronize()
    s = engine.stats
    return DemoResult(device=str(device) if device == "cpu" else torch.cuda.get_device_name(),
                      threads=torch.get_num_threads(), graphs=graphs,
                      steps=s.steps, requests=s.finished, tokens=s.tokens, generated=s.generated,
                      pages_reused=s.pages_reused, seconds=time.perf_counter() - start)


def run_demo(options: DemoOptions, *, out: TextIO | None = None, progress: bool = True) -> DemoResult:
    """Run the demo: print the plan report to ``out`` (default stdout), serve ``options.requests``
    requests, return the numbers."""
    import torch

    from graphkv.models.demo_engine import DemoEngine
    from graphkv.models.paged_tiny_hybrid import PagedTinyHybrid
    from graphkv.models.tiny_hybrid import init_weights
    from graphkv.report import format_plan
    from graphkv.runtime.capture.graphs import capture
    from graphkv.runtime.ops.choice import rehearses
    from graphkv.runtime.pool.allocate import allocate
    from graphkv.runtime.step.step import Step

    out = out if out is not None else sys.stdout
    config = TinyHybridConfig()
    device = check_options(options)
    plan = demo_plan(options, config)
    check_memory(plan, device, options.kv_memory)
    torch.set_num_threads(options.threads)
    print(format_plan(plan, budget_text=f"{options.kv_memory} (--kv-memory)"), file=out)
    model = PagedTinyHybrid(init_weights(config, seed=options.seed).to(device), allocate(plan, device),
                            kernels=options.kernels)
    step = Step(plan, device, kernels=options.kernels)
    forward = capture(plan, static_inputs={"input_ids": step.input_ids})(model.forward)
    if options.capture:
        graphs = str(forward.capture(progress=progress, prepare=step.capture_context,
                                     rehearse=rehearses(step.kernels, device)))
    else:
        graphs = "capture disabled (--no-capture); every step runs eagerly"
    return serve_demo(DemoEngine(plan, step, forward, vocab_size=config.vocab_size), options, config.vocab_size,
                      device=device, graphs=graphs, progress=progress)
