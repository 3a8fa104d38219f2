"""``graphkv bench memory``: the memory benchmark as a command (and as :func:`bench_memory`).

Runs :func:`graphkv.memory.bench.run_phases` for each model (``demo``, the tiny hybrid model with a
forward to capture, and bundled presets with a KV budget scaled to the available memory), prints
predicted vs measured per phase with the error in %, and with ``--out DIR`` writes ``memory.json``
(one row per model and phase: ``phase``, ``predicted_bytes``, ``measured_bytes``, ``method``; on a GPU
the ``kv_pool`` and ``static_buffers`` rows add ``predicted_reserved_bytes`` and ``measured_reserved_bytes``,
and each graph key ``measured_peak_bytes`` / ``measured_kept_bytes`` read through its capture pool),
``memory.png`` and, after a GPU run that captured graphs, ``graph_calibration.json``.

For a preset graphkv.hf runs, :func:`preset_graphs` also measures graph memory at the preset's real
shapes (two reduced depths, extrapolated to its own) and ``--out`` writes ``<preset>.<arch>.json``,
labelled to ship in :mod:`graphkv.calibrations`. On a CPU it prints why nothing was measured.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any, Sequence, TextIO

import attrs

from graphkv.command.args import count, nonempty
from graphkv.command.device_flag import DEVICE_CHOICES, device_from_flag
from graphkv.errors import GraphkvError, Problem, SpecError
from graphkv.memory.repeat import MAX_PROCESSES

__all__ = ["DEFAULT_MODELS", "MemoryBenchOptions", "add_bench_parser", "bench_memory", "format_run", "run_bench"]

DEFAULT_MODELS = ("demo", "llama-3.1-8b")
GRAPH_COMPILE_MODES = ("piecewise", "fused")  # --compile: how a preset's captures compile its forward
_CPU_KV_CAP = 1 << 30  # a preset's auto KV budget on a CPU: at most 1 GiB (zeroing more only costs time)
_AUTO_FRACTION = 4  # a preset's auto KV budget: a quarter of the available memory


@attrs.frozen(kw_only=True)
class MemoryBenchOptions:
    """What to measure: ``models`` (``"demo"`` or preset names), the device (``auto``: CUDA when
    available), the presets' KV budget (``None``: a quarter of the available memory, at most 1 GiB on
    a CPU), ``out`` (a directory for memory.json / memory.png, or ``None``), the progress bar, and
    ``full_depth``: capture each preset at its own depth and check it holds within the shipped
    calibration (:mod:`graphkv.memory.full_depth`) instead of measuring it at two reduced depths;
    ``compile``: the :class:`~graphkv.hf.PagedModel` compile mode a preset's graphs are captured with
    (``"piecewise"``: pieces as traced; ``"fused"``: pieces compiled by Inductor)."""

    models: tuple[str, ...] = DEFAULT_MODELS
    device: str = "auto"
    kv_memory: str | None = None
    out: str | None = None
    progress: bool = True
    full_depth: bool = False
    compile: str = "piecewise"


def add_bench_parser(sub: Any) -> None:
    """Add ``graphkv bench memory`` to the subcommands ``sub``."""
    bench = sub.add_parser("bench", help="measure graphkv against its plan (memory)",
                           description="Benchmarks that measure the runtime against the plan.")
    kinds = bench.add_subparsers(dest="bench", metavar="BENCHMARK", required=True)
    memory = kinds.add_parser(
        "memory", help="plan -> allocate -> step -> capture: predicted vs measured bytes per phase",
        description="Plan, allocate, build the step and capture, measuring each phase's memory of this process "
                    "(NVML per process on a GPU, else torch.cuda statistics; live storages on a CPU) beside the "
                    "plan's ledger. Needs the runtime extra; --out's plot needs the bench extra (matplotlib).")
    memory.add_argument("--model", dest="models", action="append", metavar="NAME",
                        type=nonempty("'demo' or a preset name"),
                        help=f"'demo' or a preset (`graphkv presets`); repeat for several (default: "
                             f"{' and '.join(DEFAULT_MODELS)})")
    memory.add_argument("--device", default="auto", choices=DEVICE_CHOICES,
                        help="default: %(default)s (cuda when available)")
    memory.add_argument("--kv-memory", metavar="SIZE", type=nonempty("a size, e.g. 1GiB"),
                        help="KV pool bytes of each preset (default: a quarter of the available memory, at most "
                             "1 GiB on a CPU; the demo keeps its own 2 MiB)")
    memory.add_argument("--out", metavar="DIR", type=nonempty("a directory"),
                        help="write memory.json, memory.png and (after a GPU capture) graph_calibration.json here")
    memory.add_argument("--processes", metavar="N", type=count(1, maximum=MAX_PROCESSES), default=1,
                        help="run the measurement in N fresh processes and compare every measured row (each "
                             "process's files under --out DIR/process-<i>, the comparison in repeat.json; default 1)")
    memory.add_argument("--full-depth", action="store_true",
                        help="capture each preset at its own depth (random weights: 16 GB for llama-3.1-8b) and "
                             "check that its graph pool holds within the calibration shipped for this GPU, instead "
                             "of calibrating at two reduced depths; exit status 1 when it does not, or when a GPU "
                             "cannot check it")
    memory.add_argument("--compile", choices=GRAPH_COMPILE_MODES, default="piecewise",
                        help="how a preset's forward is compiled for its captures: piecewise (pieces as traced) or "
                             "fused (each piece compiled by Inductor, as graphkv.hf's compile='fused' serves); "
                             "default: %(default)s")
    memory.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


def run_bench(args: argparse.Namespace) -> int:
    """Run ``graphkv bench memory`` from parsed arguments; 0 on success, 1 when a ``--full-depth`` capture
    exceeds its calibration or, on a GPU, could not be checked (no calibration ships for it, a key was
    not captured, the capture failed)."""
    from graphkv.extras import require

    require("runtime", "torch", needed_by="graphkv bench memory")
    import torch

    torch.set_num_threads(1)  # as every benchmark: memory does not depend on it, the run's time does less
    models = tuple(args.models or DEFAULT_MODELS)
    if args.full_depth and all(name == "demo" for name in models):
        from graphkv.errors import Problem, SpecError

        raise SpecError(Problem(field="--full-depth", value=" ".join(f"--model {name}" for name in models),
                                limit="checks presets at their own depth against their shipped calibration; the "
                                      "demo has neither",
                                fix="add --model PRESET (`graphkv presets`), or drop --full-depth"))
    options = MemoryBenchOptions(models=models, device=args.device,
                                 kv_memory=args.kv_memory, out=args.out,
                                 progress=not args.no_progress and sys.stderr.isatty(), full_depth=args.full_depth,
                                 compile=args.compile)
    if args.processes > 1:
        from graphkv.memory.repeat import repeat_in_processes

        _out_dir(options.out)  # a bad --out fails before any process starts
        argv = [flag for name in options.models for flag in ("--model", name)] + ["--device", options.device]
        argv += ["--kv-memory", options.kv_memory] if options.kv_memory is not None else []
        argv += ["--full-depth"] if options.full_depth else []
        argv += ["--compile", options.compile]
        repeat_in_processes(argv, args.processes, out_dir=options.out, progress=options.progress)
        return 0
    runs = bench_memory(options)
    return 1 if any(run.holds is False for run in runs) else 0


def _out_dir(out: str | None) -> Path | None:
    if out is None:
        return None
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise SpecError(Problem(field="--out", value=out, limit="exists and is not a directory",
                                fix="pass a directory (it is created when missing)"))
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise SpecError(Problem(field="--out", value=out, limit=f"cannot be created ({e.strerror or e})",
                                fix="pass a writable directory")) from None
    return path


def _auto_kv_bytes(device: Any) -> tuple[int, int, str]:
    """A preset's automatic KV budget on ``device``: a quarter of the available memory (at most 1 GiB on
    a CPU), with the available bytes and where they were read."""
    from graphkv.memory.available import available_bytes

    have, where = available_bytes(device)
    kv = have // _AUTO_FRACTION if device.type == "cuda" else min(have // _AUTO_FRACTION, _CPU_KV_CAP)
    return kv, have, where


def _preset_plan(name: str, kv_memory: str | None, device: Any) -> tuple[Any, str, int | None]:
    """A preset's plan under the default limits, its budget text and hidden size."""
    from graphkv.memory.available import check_pool_fits
    from graphkv.plan import compile_plan
    from graphkv.presets import list_presets, preset_model
    from graphkv.spec.budget import Budget, format_bytes, parse_bytes
    from graphkv.spec.limits import Limits

    if name not in list_presets():
        raise SpecError(Problem(field="--model", value=name, limit=f"must be 'demo' or one of {list(list_presets())}",
                                fix="pick a listed preset (`graphkv presets`)"))
    model = preset_model(name)
    if kv_memory is not None:
        kv, text = parse_bytes(kv_memory, field="--kv-memory"), f"{kv_memory} (--kv-memory)"
    else:
        kv, have, where = _auto_kv_bytes(device)
        text = f"{format_bytes(kv)} (auto: a quarter of {format_bytes(have)} {where}" + \
            (", at most 1 GiB on a CPU)" if device.type != "cuda" else ")")
    plan = compile_plan(model, Limits(), Budget.kv_bytes(kv))
    if kv_memory is not None:  # the auto budget is a quarter of what is available; a typed one may be more
        check_pool_fits(plan, device, field="--kv-memory", value=kv_memory,
                        fix=", e.g. 256MiB, or leave it unset (a quarter of the available memory)")
    return plan, text, model.hidden_size


def _demo(device: Any) -> tuple[Any, str, Any, int]:
    from graphkv.models.demo import DemoOptions, demo_plan
    from graphkv.models.tiny_hybrid import TinyHybridConfig

    options, config = DemoOptions(), TinyHybridConfig()

    def forward_for(pool: Any, step: Any) -> Any:
        from graphkv.models.paged_tiny_hybrid import PagedTinyHybrid
        from graphkv.models.tiny_hybrid import init_weights

        return PagedTinyHybrid(init_weights(config, seed=0).to(device), pool).forward

    return demo_plan(options, config), f"{options.kv_memory} (the demo's default)", forward_for, config.hidden_size


@attrs.frozen(kw_only=True)
class PresetGraphs:
    """A preset's graph memory measured at its real shapes: the ``runs`` at two reduced depths, the
    calibration extrapolated to its own depth (``None`` unless both depths captured every key), the
    held-out check's line and a one-line ``summary``."""

    name: str
    runs: tuple[Any, ...]
    calibration: Any
    num_layers: int
    summary: str

    @property
    def held_out(self) -> str | None:
        """The held-out check's line of the deeper run, when a calibration was made."""
        return self.runs[-1].held_out if self.calibration is not None else None

    def write(self, directory: Path, device: Any) -> Path:
        """Write ``<name>.<arch>.json`` into ``directory``: the calibration with the labels
        :mod:`graphkv.calibrations` needs to ship it (card, compute capability, versions)."""
        import torch

        from graphkv import __version__
        from graphkv.memory.available import cuda_arch

        arch = cuda_arch(device)
        path = directory / f"{self.name}.{arch}.json"
        deep = self.runs[-1]
        self.calibration.write(path, model=self.name, arch=arch, device_name=torch.cuda.get_device_name(device),
                               graphkv=__version__, torch=torch.__version__, cuda=str(torch.version.cuda),
                               num_layers=self.num_layers, held_out=self.held_out,
                               keys=[{**_key_record(r), "layers": deep.model} for r in deep.rows
                                     if r.num_tokens is not None])
        return path


def preset_graphs(name: str, device: Any, choice: Any, progress: Any, *, limits: Any, kv_bytes: int | None = None,
                  dtype: str = "bfloat16", compile: bool | str | None = "piecewise",  # noqa: A002 - PagedModel's
                  **overrides: Any) -> PresetGraphs:
    """Measure preset ``name``'s graph memory at its real shapes: a random-weight model served by
    graphkv.hf at the two depths of :func:`~graphkv.memory.preset_forward.depths`, each planned for
    ``limits`` (the preset plan's: the same capture keys) with ``max_model_len`` cut to 4096 and a
    pool of ``kv_bytes`` (default: a quarter of the available memory), captured key by key through
    its pool; the two fits extrapolated to the preset's depth (:func:`~graphkv.memory.depth_fit.extrapolate`).
    ``compile``: the :class:`~graphkv.hf.PagedModel` compile mode (``"piecewise"``: mixed keys are captured piece
    by piece, as the plan's FULL_AND_PIECEWISE mode asks; keys the forward cannot capture are rows marked not
    captured and left out of the fit). A failure (a capture error, out of memory, any torch RuntimeError) ends
    this preset's measurement
    with the reason in ``summary``; the other models' results are kept. MoE presets are skipped with why.
    After each depth, torch's compile caches are reset (``torch._dynamo.reset()``): they would keep that
    depth's model, graphs and pieces alive.
    On a CPU nothing is built (CUDA graphs need a GPU) unless ``overrides`` shrink the widths (tests:
    the path runs, its graph rows unmeasured). A preset graphkv.hf does not run is skipped with why."""
    from graphkv.memory.bench import run_phases
    from graphkv.memory.depth_fit import extrapolate
    from graphkv.memory.preset_forward import (depths, gathered_expert_bytes, graph_limits, measured_presets,
                                               preset_forward, served_presets)
    from graphkv.presets import load_preset_config
    from graphkv.spec.budget import format_bytes

    total = int(load_preset_config(name)["num_hidden_layers"])
    shallow, deep = depths(name)
    if name not in served_presets():
        return PresetGraphs(name=name, runs=(), calibration=None, num_layers=total,
                            summary=f"graph memory not measured: graphkv.hf does not run this preset's family "
                                    f"(measured presets: {', '.join(measured_presets())})")
    if name not in measured_presets():
        gathered = gathered_expert_bytes(name, limits.max_num_batched_tokens)
        return PresetGraphs(name=name, runs=(), calibration=None, num_layers=total,
                            summary=f"graph memory not measured: graphkv.hf's MoE layers on a GPU gather each token's "
                                    f"expert weights (transformers' batched_mm), {format_bytes(gathered)} for the "
                                    f"{limits.max_num_batched_tokens}-token key, more than the GPU holds; measured "
                                    f"once a fused MoE path serves them")
    if device.type != "cuda" and not overrides:
        return PresetGraphs(name=name, runs=(), calibration=None, num_layers=total,
                            summary=f"graph memory not measured: CUDA graphs need a GPU (there, a random-weight model "
                                    f"at its shapes is captured at {shallow} and {deep} layers and extrapolated to "
                                    f"{total})")
    import torch

    reduced_limits = graph_limits(limits)  # the preset plan's capture keys, max_model_len at most 4096
    runs = []
    # One pool size for both depths, read once: what the first depth leaves cached must not size the second.
    pool_bytes = kv_bytes if kv_bytes is not None else _auto_kv_bytes(device)[0]
    for layers in (shallow, deep):
        try:
            target = preset_forward(name, layers, device, limits=reduced_limits, kv_bytes=pool_bytes, dtype=dtype,
                                    compile=compile, **overrides)
            runs.append(run_phases(target.plan, device, choice, budget=f"{pool_bytes:,} B (graph measurement)",
                                   progress=progress, forward_for=target.forward_for, hidden_size=target.hidden_size))
        except (GraphkvError, RuntimeError) as e:  # a capture error, out of memory, a compile failure (torch's
            # errors are RuntimeErrors): this preset's measurement ends with the reason, the other models' results stay
            text = " ".join(str(e).split())[:300]
            return PresetGraphs(name=name, runs=tuple(runs), calibration=None, num_layers=total,
                                summary=f"graph memory not measured: at {layers} layer{'' if layers == 1 else 's'}, "
                                        f"{type(e).__name__}: {text}")
        finally:
            target = None
            _release_compiled(device)
    fits = [r.calibration for r in runs]
    if any(f is None for f in fits):
        first = next((r for r in runs[0].rows if r.num_tokens is not None), None)
        why = first.method if first is not None else "not measured: the plan captures no key"
        return PresetGraphs(name=name, runs=tuple(runs), calibration=None, num_layers=total,
                            summary=f"graph memory at {shallow} and {deep} layers {why}; no calibration")
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else str(device)
    calibration = extrapolate(fits[0], fits[1], shallow_layers=shallow, deep_layers=deep, num_layers=total,
                              source=f"{name} on {where}")
    line = runs[-1].held_out
    summary = (f"graph calibration extrapolated to {total} layers: {calibration.per_graph_bytes:,.0f} B per graph, "
               f"outputs {calibration.output_bytes_per_token:,.1f} B and workspace "
               f"{calibration.workspace_bytes_per_token:,.1f} B per token, lazy workspaces "
               f"{calibration.lazy_workspace_bytes:,.0f} B" + (f"; {line}" if line else ""))
    return PresetGraphs(name=name, runs=tuple(runs), calibration=calibration, num_layers=total, summary=summary)


def _full_depth(name: str, plan: Any, device: Any, choice: Any, progress: Any, compile: str) -> Any:  # noqa: A002
    """:func:`~graphkv.memory.full_depth.check_full_depth` of preset ``name`` (its plan's capture keys, a quarter
    of the available memory for its pool), its compiled state freed afterwards."""
    from graphkv.memory.full_depth import check_full_depth

    try:
        return check_full_depth(name, device, choice, progress, limits=plan.limits, compile=compile,
                                kv_bytes=_auto_kv_bytes(device)[0])
    finally:
        _release_compiled(device)


def _key_record(row: Any) -> dict[str, Any]:
    """A capture key's measurement as a calibration file lists it."""
    return {"num_tokens": row.num_tokens, "uniform": row.uniform, "peak_bytes": row.measured_peak_bytes,
            "kept_bytes": row.measured_kept_bytes, "reserved_bytes": row.measured_reserved_bytes}


def _release_compiled(device: Any) -> None:
    """Free what a reduced-depth run compiled and cached: torch keeps every compile backend (and with it
    the piecewise runners, their graphs and the weights their pieces read) until ``torch._dynamo.reset()``,
    so the next depth would run beside the last one's model. After a sticky CUDA error the cache
    cannot be emptied; that error is already this preset's reason."""
    import torch

    torch._dynamo.reset()
    gc.collect()  # the model, pool and graphs sit in reference cycles: freed now, not inside the next depth's readings
    if device.type == "cuda":
        try:
            torch.cuda.empty_cache()
        except RuntimeError:
            pass


def _fmt(n: int | None) -> str:
    return "n/a" if n is None else f"{n:,} B"


def format_run(run: Any) -> list[str]:
    """The table of one run: phase, predicted, measured, error %, method."""
    from graphkv.report import format_table

    graphs = [r for r in run.rows if r.num_tokens is not None]
    collapse = len(graphs) > 1 and all(r.measured_bytes is None for r in graphs)
    rows = []
    for r in run.rows:
        if collapse and r.num_tokens is not None:
            if r is graphs[0]:  # none measured: one line for every key (memory.json has each)
                rows.append([f"graph_pool ({len(graphs)} keys)", _fmt(sum(g.predicted_bytes for g in graphs)), "n/a",
                             "n/a", r.method])
            continue
        err = r.error_pct
        rows.append([r.phase, _fmt(r.predicted_bytes), _fmt(r.measured_bytes),
                     "n/a" if err is None else f"{err:+.2f}%", r.method])
    lines = [f"{run.model}: KV budget {run.budget}"]
    lines += format_table(["phase", "predicted", "measured", "error", "method"], rows, right=(1, 2, 3))
    lines += [f"  note: {n}" for n in run.notes]
    return lines


def _check_kv_memory(options: MemoryBenchOptions) -> None:
    """Refuse a ``--kv-memory`` that is no size, or that no model of the run reads (the demo plans its own
    pool): before, ``--kv-memory 1XiB --model demo`` ran and ignored it."""
    if options.kv_memory is None:
        return
    from graphkv.spec.budget import parse_bytes

    parse_bytes(options.kv_memory, field="--kv-memory")
    if all(name == "demo" for name in options.models):
        raise SpecError(Problem(field="--kv-memory", value=options.kv_memory,
                                limit="sizes a preset's KV pool; the demo plans its own (2MiB)",
                                fix="drop --kv-memory, or add --model PRESET (e.g. --model llama-3.1-8b)"))


def bench_memory(options: MemoryBenchOptions, *, out: TextIO | None = None, nvml: Any = None) -> list[Any]:
    """Run the memory benchmark, print it to ``out`` (default stdout), write ``options.out``'s files;
    returns one :class:`~graphkv.memory.bench.MemoryRun` per model of ``options.models``, in their
    order (``demo, llama = bench_memory(...)``); a preset's run holds its reduced-depth graph runs
    (``graph_runs``) and their outcome (``graph_summary``). ``nvml``: the NVML module to read (default
    pynvml; a stand-in in tests)."""
    import torch

    from graphkv import __version__
    from graphkv.memory.bench import run_phases
    from graphkv.memory.meters import open_meter
    from graphkv.memory.progress import Progress

    out = out if out is not None else sys.stdout
    _check_kv_memory(options)
    device = torch.device(device_from_flag(options.device, torch.cuda.is_available()))
    directory = _out_dir(options.out)
    targets = []
    for name in options.models:  # plan everything first: a bad --model fails before anything is allocated
        if name == "demo":
            plan, budget, forward_for, hidden = _demo(device)
        else:
            plan, budget, hidden = _preset_plan(name, options.kv_memory, device)
            forward_for = None
        targets.append((plan, budget, forward_for, hidden))
    choice = open_meter(device, nvml=nvml)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.machine()
    print(f"graphkv {__version__} bench memory on {device} ({where}; torch {torch.__version__}, "
          f"{torch.get_num_threads()} thread(s))", file=out)
    if choice.nvml_line is not None:
        print(choice.nvml_line, file=out)
    print(f"measured with: {choice.method}", file=out)
    progress = Progress(options.progress)
    runs = []  # one per model asked, each preset's reduced-depth graph runs inside it
    shippable: list[PresetGraphs] = []
    try:
        for name, (plan, budget, forward_for, hidden) in zip(options.models, targets):
            run = run_phases(plan, device, choice, budget=budget, progress=progress, forward_for=forward_for,
                             hidden_size=hidden)
            print("", file=out)
            print("\n".join(format_run(run)), file=out)
            if name != "demo" and options.full_depth:
                check = _full_depth(name, plan, device, choice, progress, options.compile)
                if check.run is not None:
                    print("", file=out)
                    print("\n".join(format_run(check.run)), file=out)
                print("", file=out)
                print(f"{name}: {check.summary}", file=out)
                # on a GPU a check that could not be made counts as not holding (exit status 1)
                holds = check.holding.holds if check.holding is not None else (False if device.type == "cuda" else None)
                run = attrs.evolve(run, graph_runs=() if check.run is None else (check.run,),
                                   graph_summary=check.summary, holds=holds)
            elif name != "demo":
                graphs = preset_graphs(name, device, choice, progress, limits=plan.limits, compile=options.compile)
                for depth_run in graphs.runs:
                    print("", file=out)
                    print("\n".join(format_run(depth_run)), file=out)
                print("", file=out)
                print(f"{name}: {graphs.summary}", file=out)
                if graphs.calibration is not None:
                    shippable.append(graphs)
                run = attrs.evolve(run, graph_runs=graphs.runs, graph_summary=graphs.summary)
            runs.append(run)
    finally:
        if choice.meter is not None:
            choice.meter.close()
    if directory is not None:
        try:
            _write(directory, runs, device, choice, out)
            for graphs in shippable:
                path = graphs.write(directory, device)
                print(f"wrote {path} (copy it into graphkv/calibrations to ship it)", file=out)
        except OSError as e:
            raise SpecError(Problem(field="--out", value=str(directory), limit=f"cannot be written ({e.strerror or e})",
                                    fix="pass a writable directory")) from None
    return runs


def _write(directory: Path, runs: Sequence[Any], device: Any, choice: Any, out: TextIO) -> None:
    """memory.json and memory.png of every run and its reduced-depth graph runs; graph_calibration.json
    from the first whole model (never a reduced-depth graph run) that fitted one."""
    from graphkv import __version__
    from graphkv.memory.plot import write_plot

    shown = [r for run in runs for r in run.with_graph_runs()]
    data = {"graphkv": __version__, "device": str(device), "nvml": choice.nvml_line, "method": choice.method,
            "rows": [r.to_dict(run.model) for run in shown for r in run.rows]}
    (directory / "memory.json").write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    write_plot(shown, directory / "memory.png")
    written = ["memory.json", "memory.png"]
    calibrated = [run for run in runs if run.calibration is not None]
    if calibrated:
        run = calibrated[0]
        run.calibration.write(directory / "graph_calibration.json", model=run.model, device=run.device,
                              keys=[{**_key_record(r), "measured_bytes": r.measured_bytes} for r in run.rows
                                    if r.num_tokens is not None])
        written.append("graph_calibration.json")
    else:
        print("no graph_calibration.json: no capture key was measured (CUDA graphs need a GPU and a model forward)",
              file=out)
    print(f"wrote {', '.join(os.fspath(directory / w) for w in written)}", file=out)
