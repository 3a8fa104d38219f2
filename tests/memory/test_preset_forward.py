"""A preset's real shapes at reduced depth for graph-memory measurement, and the depth extrapolation."""

from __future__ import annotations

import attrs
import pytest
import torch

from graphkv.errors import SpecError
from graphkv.memory.depth_fit import extrapolate
from graphkv.memory.preset_forward import depths, preset_forward, reduced_config, served_presets
from graphkv.plan.graph_pool import GraphPoolModel
from graphkv.spec.limits import Limits

SMALL = dict(hidden_size=64, intermediate_size=64, vocab_size=128, num_attention_heads=4, num_key_value_heads=2,
             head_dim=16)


def test_served_presets_are_the_families_graphkv_hf_runs() -> None:
    assert served_presets() == ("gpt-oss-120b", "gpt-oss-20b", "llama-3.1-8b", "nemotron-h-8b", "qwen3-next-80b-a3b")


@pytest.mark.parametrize("name, expected", [("llama-3.1-8b", (1, 2)), ("gpt-oss-20b", (2, 4)),
                                            ("qwen3-next-80b-a3b", (4, 8)), ("nemotron-h-8b", (9, 20))])
def test_depths_hold_one_and_two_periods_of_the_layer_pattern(name: str, expected: tuple[int, int]) -> None:
    assert depths(name) == expected


def test_reduced_configs_keep_the_real_widths_and_the_layer_pattern() -> None:
    llama = reduced_config("llama-3.1-8b", 2)
    assert (llama.num_hidden_layers, llama.hidden_size, llama.vocab_size, llama.intermediate_size) == (2, 4096, 128256, 14336)
    assert llama.num_key_value_heads == 8
    oss = reduced_config("gpt-oss-20b", 4)
    assert oss.layer_types == ["sliding_attention", "full_attention"] * 2
    assert (oss.num_local_experts, oss.vocab_size, oss.sliding_window) == (32, 201088, 128)
    nxt = reduced_config("qwen3-next-80b-a3b", 8)
    assert nxt.layer_types == (["linear_attention"] * 3 + ["full_attention"]) * 2
    assert (nxt.num_experts, nxt.moe_intermediate_size, nxt.head_dim) == (512, 512, 256)
    nemo = reduced_config("nemotron-h-8b", 9)
    assert nemo.num_hidden_layers == 9 and nemo.hybrid_override_pattern == "M-M-M-M*-"


@pytest.mark.parametrize("name, layers, message", [
    ("deepseek-v3", 1, "has no graphkv.hf forward"), ("llama-3.1-8b", 0, "must be an int in 1..32"),
    ("llama-3.1-8b", 33, "must be an int in 1..32"), ("llama-3.1-8b", True, "must be an int in 1..32")])
def test_reduced_config_refuses(name: str, layers: object, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        reduced_config(name, layers)  # type: ignore[arg-type]


def test_preset_forward_plans_and_runs_a_shrunk_model_on_the_cpu() -> None:
    """The path `bench memory` takes on a GPU, at tiny widths: plan, allocate, capture (rehearsed), run."""
    from graphkv.runtime import Step, allocate
    from graphkv.runtime.capture.graphs import capture

    limits = Limits(max_model_len=64, max_num_seqs=2, max_num_batched_tokens=16)
    pf = preset_forward("gpt-oss-20b", 2, torch.device("cpu"), limits=limits, kv_bytes=1 << 20, dtype="float32",
                        **SMALL)
    assert pf.plan.model_name == "gpt-oss-20b (2 layers)" and pf.hidden_size == 64
    assert [type(layer.spec).__name__ for layer in pf.plan.layers] == ["SlidingWindowSpec", "FullAttentionSpec"]
    pool, step = allocate(pf.plan, "cpu"), Step(pf.plan, "cpu")
    forward = capture(pf.plan, static_inputs={"input_ids": step.input_ids})(pf.forward_for(pool, step))
    report = forward.capture(progress=False, prepare=step.capture_context, rehearse=True)
    assert report.rehearsed and len(report.keys) == len(forward.keys) > 0


def test_extrapolation_is_linear_in_layers_and_clamped() -> None:
    shallow = GraphPoolModel(per_graph_bytes=1000.0, output_bytes_per_token=10.0, workspace_bytes_per_token=100.0,
                             calibrated=True, source="a", hidden_size=64)
    deep = attrs.evolve(shallow, per_graph_bytes=1500.0, output_bytes_per_token=8.0, workspace_bytes_per_token=140.0)
    m = extrapolate(shallow, deep, shallow_layers=2, deep_layers=4, num_layers=24, source="gpt-oss-20b on H100")
    # c(L) = c1 + (c2 - c1) x (L - 2) / 2: 1000 + 500 x 11, 10 - 2 x 11 (clamped at 0), 100 + 40 x 11
    assert (m.per_graph_bytes, m.output_bytes_per_token, m.workspace_bytes_per_token) == (6500.0, 0.0, 540.0)
    assert m.calibrated and m.hidden_size == 64
    assert m.source == "gpt-oss-20b on H100: measured at 2 and 4 layers, extrapolated linearly to 24"
    same = extrapolate(shallow, deep, shallow_layers=2, deep_layers=4, num_layers=4, source="x")
    assert (same.per_graph_bytes, same.workspace_bytes_per_token) == (1500.0, 140.0)


def test_preset_graphs_runs_both_depths_and_says_why_nothing_was_measured_on_a_cpu() -> None:
    from graphkv.memory.command import preset_graphs
    from graphkv.memory.meters import open_meter
    from graphkv.memory.progress import Progress

    cpu = torch.device("cpu")
    choice, quiet = open_meter(cpu), Progress(False)
    limits = Limits(max_model_len=64, max_num_seqs=2, max_num_batched_tokens=16)
    shrunk = preset_graphs("llama-3.1-8b", cpu, choice, quiet, limits=limits, kv_bytes=1 << 20, dtype="float32",
                           **SMALL)
    assert [r.model for r in shrunk.runs] == ["llama-3.1-8b (1 layer)", "llama-3.1-8b (2 layers)"]
    assert shrunk.calibration is None
    assert shrunk.summary == ("graph memory at 1 and 2 layers not measured: CUDA graphs need a GPU (a CPU runs every "
                              "step eagerly); no calibration")
    skipped = preset_graphs("nemotron-h-8b", cpu, choice, quiet, limits=Limits())
    assert skipped.runs == () and skipped.summary == (
        "graph memory not measured: CUDA graphs need a GPU (there, a random-weight model at its shapes is captured at "
        "9 and 20 layers and extrapolated to 52)")
    other = preset_graphs("deepseek-v3", cpu, choice, quiet, limits=Limits())
    assert other.runs == () and other.summary == ("graph memory not measured: graphkv.hf does not run this preset's "
                                                  "family (measured presets: llama-3.1-8b, nemotron-h-8b)")
    moe = preset_graphs("qwen3-next-80b-a3b", cpu, choice, quiet, limits=Limits())
    assert moe.runs == () and moe.summary == (
        "graph memory not measured: graphkv.hf's MoE layers on a GPU gather each token's expert weights "
        "(transformers' batched_mm), 480.00 GiB for the 8192-token key, more than the GPU holds; measured once a "
        "fused MoE path serves them")


def test_preset_graphs_takes_the_preset_plans_own_limits() -> None:
    """The preset plan's limits (max_model_len 'auto') plan the reduced models at 4096 tokens, with the same
    capture keys (a regression: min(4096, 'auto') raised TypeError)."""
    from graphkv.memory.command import preset_graphs
    from graphkv.memory.meters import open_meter
    from graphkv.memory.progress import Progress
    from graphkv.plan.graph_keys import capture_keys

    cpu = torch.device("cpu")
    graphs = preset_graphs("llama-3.1-8b", cpu, open_meter(cpu), Progress(False), limits=Limits(), kv_bytes=64 << 20,
                           dtype="float32", **SMALL)
    assert [r.model for r in graphs.runs] == ["llama-3.1-8b (1 layer)", "llama-3.1-8b (2 layers)"]
    rows = [r for r in graphs.runs[0].rows if r.num_tokens is not None]
    assert len(rows) == len(capture_keys(_llama_plan().cudagraph, Limits())) == 86  # decode 1..256, mixed 1..512


def _llama_plan():
    from graphkv.plan import compile_plan
    from graphkv.presets import preset_model
    from graphkv.spec.budget import Budget

    return compile_plan(preset_model("llama-3.1-8b"), Limits(), Budget.kv_bytes("1GiB"))


def test_moe_presets_are_not_measured_and_the_gather_is_computed() -> None:
    from graphkv.memory.preset_forward import gathered_expert_bytes, measured_presets

    assert measured_presets() == ("llama-3.1-8b", "nemotron-h-8b")
    # gpt-oss-20b: 8192 tokens x 4 experts x 3 x 2880 x 2880 x 2 B; qwen3-next: x 10 experts x 3 x 2048 x 512 x 2 B
    assert gathered_expert_bytes("gpt-oss-20b", 8192) == 8192 * 4 * 3 * 2880 * 2880 * 2
    assert gathered_expert_bytes("qwen3-next-80b-a3b", 8192) == 480 << 30
    assert gathered_expert_bytes("llama-3.1-8b", 8192) == 0


def test_held_out_keys_are_predicted_from_a_fit_to_the_others() -> None:
    from graphkv.memory.held_out import held_out, held_out_line
    from graphkv.plan.graph_keys import GraphKey

    keys = [GraphKey(num_tokens=n, num_reqs=None, uniform=True) for n in (64, 32, 16, 8, 4, 2)]
    kept = [1000 + 10 * n for n in (64, 32, 16, 8, 4, 2)]
    kept[3] = 1100  # key 8 is held out: predicted 1080, measured 1100 (-1.82 %)
    checked = held_out(keys, kept, first_peak_bytes=5000)
    assert [(k.num_tokens, k.measured_bytes, k.predicted_bytes) for k in checked] == [
        (32, 1320, 1320.0), (8, 1100, 1080.0), (2, 1020, 1020.0)]
    assert held_out_line(checked) == (
        "held-out keys: the model fitted to every other key predicts the other 3 keys' kept bytes; furthest "
        "decode(8): 1,100 B measured, 1,080 B predicted (-20 B, -1.82 %) — within the bar of 5 % or 64 KiB")
    assert held_out(keys[:3], kept[:3], first_peak_bytes=5000) == ()


def test_the_held_out_bar_is_five_percent_but_never_below_64_kib() -> None:
    """A 2 KiB key predicted at 40 KB is within (64 KiB floor; graphs keeping weak outputs keep a few KiB); a 10 MB
    key predicted 6 % high is outside; a 10 MB key 4 % high is within. The line names the key furthest from its bar."""
    from graphkv.memory.held_out import HeldOutKey, held_out_line

    small = HeldOutKey(num_tokens=4096, uniform=False, measured_bytes=2048, predicted_bytes=40_000.0)
    high = HeldOutKey(num_tokens=8, uniform=True, measured_bytes=10_000_000, predicted_bytes=10_600_000.0)
    close = HeldOutKey(num_tokens=16, uniform=True, measured_bytes=10_000_000, predicted_bytes=10_400_000.0)
    assert (small.within, high.within, close.within) == (True, False, True)
    assert (small.bar_bytes, high.bar_bytes) == (65536, 500_000.0)
    assert held_out_line([small, close]).endswith(
        "furthest decode(16): 10,000,000 B measured, 10,400,000 B predicted (+400,000 B, +4.00 %) — within the bar of "
        "5 % or 64 KiB")
    assert held_out_line([small, high, close]).endswith("(+600,000 B, +6.00 %) — OUTSIDE the bar of 5 % or 64 KiB")
    assert held_out_line([]) is None


def test_a_failing_preset_capture_ends_only_that_preset_with_its_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    """A torch error while measuring a preset's graphs (here raised by the forward's builder) becomes the summary,
    naming the depth and the error, instead of ending the benchmark and losing the other models' results."""
    import graphkv.memory.command as command
    from graphkv.memory.meters import open_meter
    from graphkv.memory.progress import Progress

    def fail(*args: object, **kwargs: object) -> None:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr("graphkv.memory.preset_forward.preset_forward", fail)
    cpu = torch.device("cpu")
    graphs = command.preset_graphs("llama-3.1-8b", cpu, open_meter(cpu), Progress(False), limits=Limits(),
                                   kv_bytes=1 << 20, dtype="float32", **SMALL)
    assert graphs.runs == () and graphs.calibration is None
    assert graphs.summary == ("graph memory not measured: at 1 layer, RuntimeError: CUDA error: an illegal memory "
                              "access was encountered")


def test_bench_memory_returns_one_run_per_model_with_the_presets_graph_runs_inside(
        tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU flow of `bench memory` on a preset, rehearsed on a CPU at tiny widths: the preset's reduced-depth
    graph runs are kept inside its run (a regression: they were appended to the returned list, so
    ``demo, llama = bench_memory(...)`` raised ValueError on the GPU), and memory.json holds their rows."""
    import json

    import graphkv.memory.command as command

    real = command.preset_graphs

    def shrunk(name, device, choice, progress, *, limits, compile):  # type: ignore[no-untyped-def]  # noqa: A002
        assert compile == "piecewise"  # --compile's default
        return real(name, device, choice, progress, limits=limits, kv_bytes=8 << 20, dtype="float32",
                    compile=compile, **SMALL)

    monkeypatch.setattr(command, "preset_graphs", shrunk)
    runs = command.bench_memory(command.MemoryBenchOptions(models=("demo", "llama-3.1-8b"), device="cpu",
                                                           kv_memory="64MiB", out=str(tmp_path), progress=False),
                                out=open(tmp_path / "out.txt", "w"))
    demo, llama = runs
    assert (demo.model, demo.graph_runs, demo.graph_summary) == ("tiny-hybrid", (), None)
    assert llama.model == "llama-3.1-8b"
    assert [r.model for r in llama.graph_runs] == ["llama-3.1-8b (1 layer)", "llama-3.1-8b (2 layers)"]
    assert llama.graph_summary == ("graph memory at 1 and 2 layers not measured: CUDA graphs need a GPU (a CPU runs "
                                   "every step eagerly); no calibration")
    models = {r["model"] for r in json.loads((tmp_path / "memory.json").read_text())["rows"]}
    assert models == {"tiny-hybrid", "llama-3.1-8b", "llama-3.1-8b (1 layer)", "llama-3.1-8b (2 layers)"}


def test_every_piecewise_model_of_a_process_captures_its_mixed_keys() -> None:
    """Three PagedModels compiled piecewise in one process each capture all their keys (rehearsed). A regression: the
    compiled entries were kept on the forward code every transformers model shares, so once 8 were used (the
    recompile limit) later models ran uncompiled and their PIECEWISE keys were not captured."""
    from graphkv.runtime import Step, allocate
    from graphkv.runtime.capture.graphs import capture

    limits = Limits(max_model_len=64, max_num_seqs=8, max_num_batched_tokens=64)
    for layers in (1, 2, 1):
        pf = preset_forward("llama-3.1-8b", layers, torch.device("cpu"), limits=limits, kv_bytes=1 << 20,
                            dtype="float32", compile="piecewise", **SMALL)
        pool, step = allocate(pf.plan, "cpu"), Step(pf.plan, "cpu")
        forward = capture(pf.plan, static_inputs={"input_ids": step.input_ids})(pf.forward_for(pool, step))
        report = forward.capture(progress=False, prepare=step.capture_context, rehearse=True)
        # decode 1..8 and mixed 1..16 (vLLM's 2 x max_num_seqs): 4 + 5 keys
        assert report.skipped == () and len(report.keys) == len(forward.keys) == 9, (layers, report.skipped)
