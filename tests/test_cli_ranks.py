"""``graphkv plan --tp N --pp M``: every rank planned, the agreement and the stage plans, in text, JSON and vllm flags."""

from __future__ import annotations

import json

import pytest

from graphkv.cli import main
from graphkv.errors import SpecError
from graphkv.presets import load_preset_config, preset_model


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_report_lists_every_rank_the_agreement_and_each_stage(capsys: pytest.CaptureFixture[str]) -> None:
    """Qwen3-Next tp 2 x pp 2 on 20 GiB: 4 rank rows of 6425 pages (3342336 B per page index), 2 stage plans."""
    code, out, err = run(capsys, "plan", "--tp", "2", "--pp", "2", "--kv-memory", "20GiB")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "graphkv plan: qwen3-next-80b-a3b on 4 ranks (tp 2 x pp 2)"
    rows = [line.split() for line in lines if line.strip() and line.split()[0] in "0123" and "GiB" in line]
    assert [row[:4] + row[-2:] for row in rows] == [["0", "0", "0", "0-23", "6425", "262144"],
                                                    ["1", "1", "0", "0-23", "6425", "262144"],
                                                    ["2", "0", "1", "24-47", "6425", "262144"],
                                                    ["3", "1", "1", "24-47", "6425", "262144"]]
    assert "=== stage 0 of 2 (ranks 0, 1) ===" in lines and "=== stage 1 of 2 (ranks 2, 3) ===" in lines
    assert sum(line.startswith("  layers          24 KV layers: 18 mamba, 6 full_attention") for line in lines) == 2
    assert any(line.startswith("  num_blocks      6425 — the smallest of 4 ranks' own counts") for line in lines)


def test_json_carries_the_consensus_and_every_stage(capsys: pytest.CaptureFixture[str]) -> None:
    """--json with --pp 2: the top level is stage 0's plan, "consensus" the agreement, its ranks and both stages."""
    code, out, _ = run(capsys, "plan", "--preset", "llama-3.1-8b", "--tp", "2", "--pp", "2", "--json")
    assert code == 0
    data = json.loads(out)
    consensus = data["consensus"]
    assert (consensus["tensor_parallel_size"], consensus["pipeline_parallel_size"]) == (2, 2)
    assert data["num_blocks"] == consensus["num_blocks"] == 40960  # 20 GiB // (16 layers x 16 x 4 heads x 256 x 2 B)
    assert [len(stage["layers"]) for stage in consensus["stages"]] == [16, 16]
    assert [r["model_layers"] for r in consensus["ranks"]] == [[0, 15], [0, 15], [16, 31], [16, 31]]
    assert (data["inputs"]["tp"], data["inputs"]["pp"], data["inputs"]["limits"]["max_concurrent_batches"]) == (2, 2,
                                                                                                               None)


@pytest.mark.parametrize("ranks", [("--tp", "2"), ("--pp", "2")])
def test_the_agreed_plans_keep_the_graph_calibration(capsys: pytest.CaptureFixture[str], ranks: tuple[str, str]) -> None:
    """--gpu H100 for llama-3.1-8b over 2 ranks: the ranks' budgets use the shipped calibration, and so do the agreed
    plans' ledgers (they said "UNCALIBRATED estimate" while the reserve came from the calibration)."""
    code, out, err = run(capsys, "plan", "--preset", "llama-3.1-8b", "--gpu", "H100", *ranks, "--json")
    assert code == 0, err
    data = json.loads(out)
    plans = [data, *data["consensus"].get("stages", [])]
    reasons = [key["reason"] for plan in plans for key in plan["ledger"]["graph_keys"]]
    assert reasons and all(reason.endswith("(calibrated: llama-3.1-8b.sm_90.json (llama-3.1-8b))") for reason in reasons)
    code, out, err = run(capsys, "plan", "--preset", "llama-3.1-8b", "--gpu", "H100", *ranks)
    assert code == 0, err
    pool_lines = [line for line in out.splitlines() if line.lstrip().startswith("graph pool ")]
    assert pool_lines and all(" calibrated: " in line and "UNCALIBRATED" not in line for line in pool_lines)


def test_stages_paging_promoted_and_full_layers_alike_agree(capsys: pytest.CaptureFixture[str]) -> None:
    """gpt-oss-20b with the hybrid manager off pages its sliding layers as full attention: a stage holding only layer
    0 (sliding, promoted) and one starting at layer 1 (full) page alike and agree (they were refused as 'groups[0]
    differs' because one group's description said where its first layer was promoted from)."""
    code, out, err = run(capsys, "plan", "--preset", "gpt-oss-20b", "--pp", "2", "--pp-partition", "1,23",
                         "--disable-hybrid-kv-cache-manager", "--json")
    assert code == 0, err
    stages = json.loads(out)["consensus"]["stages"]
    assert [len(stage["layers"]) for stage in stages] == [1, 23]
    assert [[g["block_size"] for g in stage["groups"]] for stage in stages] == [[16], [16]]


def test_a_simulation_of_minutes_is_refused_naming_what_fits(capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    """A 16384-layer config at --pp 1024 was accepted (57 s of planning, 213 s with --gpu): the work, each stage
    planned over the whole model (three times with --gpu) and each tensor-parallel shard built once, is capped, and
    the error names the most stages (or the largest --tp) that fit; --pp 16 still plans."""
    config = dict(load_preset_config("llama-3.1-8b"), num_hidden_layers=16384)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    code, _, err = run(capsys, "plan", "--hf-config", str(path), "--pp", "1024")
    assert code == 2 and ("16859136 stage-layer plans, more than 2097152" in err
                          and "plan at most 123 stages at --tp 1" in err), err
    code, _, err = run(capsys, "plan", "--hf-config", str(path), "--pp", "64", "--gpu", "H200", "--weights-memory",
                       "1GiB")
    assert code == 2 and "(--gpu fits each stage)" in err and "plan at most 41 stages at --tp 1" in err, err
    code, _, err = run(capsys, "plan", "--hf-config", str(path), "--tp", "32", "--pp", "2")
    assert code == 2 and "plan with --tp <= 25 at --pp 2" in err, err
    code, out, err = run(capsys, "plan", "--hf-config", str(path), "--pp", "16")
    assert code == 0, err


def test_tp_only_json_keeps_one_plan_and_the_agreement(capsys: pytest.CaptureFixture[str]) -> None:
    """--tp 4 alone: one stage, so "consensus" holds no stage list; Qwen3-Next pages at 272 tokens."""
    code, out, _ = run(capsys, "plan", "--tp", "4", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["block_size"] == 272 and "stages" not in data["consensus"]
    assert [r["tp_rank"] for r in data["consensus"]["ranks"]] == [0, 1, 2, 3]


def test_stages_keep_pp_plus_one_steps_in_flight(capsys: pytest.CaptureFixture[str]) -> None:
    """gpt-oss-20b in 2 stages at 2048 tokens per step: sliding groups keep cdiv(127 + 3 x 2048, 16) + 1 = 393 pages."""
    code, out, _ = run(capsys, "plan", "--preset", "gpt-oss-20b", "--pp", "2", "--max-num-batched-tokens", "2048",
                       "--max-model-len", "32768", "--json")
    assert code == 0
    groups = json.loads(out)["groups"]
    assert [g["pages_per_request"] for g in groups if g["kind"] == "sliding_window"] == [393]


def test_emit_vllm_sizes_the_pool_for_the_widest_stage(capsys: pytest.CaptureFixture[str]) -> None:
    """Llama split 10 / 22 layers: 20 GiB gives stage 1 14894 pages of 22 x 65536 B; the pinned pool covers it."""
    code, out, _ = run(capsys, "plan", "--preset", "llama-3.1-8b", "--pp", "2", "--pp-partition", "10,22",
                       "--emit", "vllm")
    assert code == 0
    assert "  --pipeline-parallel-size 2 \\" in out.splitlines()
    assert f"--kv-cache-memory-bytes {14894 * 22 * 65536}" in [line.strip(" \\") for line in out.splitlines()]


def test_tp_the_heads_cannot_split_stays_every_problem_in_the_python_api() -> None:
    """The CLI's one --tp line is a translation: preset_model(..., tp=3) still raises all four head problems."""
    with pytest.raises(SpecError) as info:
        preset_model("qwen3-next-80b-a3b", tp=3)
    assert [p.field for p in info.value.problems] == [
        "config.num_key_value_heads", "config.num_attention_heads", "config.linear_num_key_heads",
        "config.linear_num_value_heads"]


@pytest.mark.parametrize("typed", ["ten,22", "²,46", "1" + "0" * 5000 + ",3"])
def test_partition_that_is_not_counts_is_a_usage_error(capsys: pytest.CaptureFixture[str], typed: str) -> None:
    """--pp-partition ten,22 (or a superscript digit, which str.isdigit accepts and int refuses, or a count too long
    to convert) is refused by the parser in one line naming the flag, exit 2."""
    with pytest.raises(SystemExit) as info:
        main(["plan", "--pp", "2", "--pp-partition", typed])
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.startswith(f"graphkv: error: --pp-partition: {typed[:40]!r} must be layer "
                                                   "counts separated by commas, e.g. 10,12,12,10")


def test_gpu_weights_split_over_every_rank(capsys: pytest.CaptureFixture[str]) -> None:
    """--gpu with tp 2 x pp 2: each rank holds a quarter of the 162649725440-byte checkpoint."""
    code, out, _ = run(capsys, "plan", "--gpu", "H100", "--tp", "2", "--pp", "2", "--json")
    assert code == 0
    assert json.loads(out)["budget"]["weights_bytes"] == 162649725440 // 4


def test_emit_vllm_keeps_a_page_count_the_user_fixed(capsys: pytest.CaptureFixture[str]) -> None:
    """--num-blocks-override with --tp 2: the agreed plan still emits --num-gpu-blocks-override, not a memory size."""
    code, out, _ = run(capsys, "plan", "--preset", "llama-3.1-8b", "--tp", "2", "--num-blocks-override", "4096",
                       "--emit", "vllm")
    assert code == 0
    assert "--num-gpu-blocks-override 4096" in [line.strip(" \\") for line in out.splitlines()]
    assert "--kv-cache-memory-bytes" not in out


def test_an_uneven_pp_partition_charges_each_stage_its_layers_weights(capsys: pytest.CaptureFixture[str],
                                                                     tmp_path) -> None:
    """llama-3.1-8b's checkpoint (16060522496 B, 32 layers, vocab 128256 x hidden 4096 in bf16: 1050673152 B for the
    embedding and as much for the untied head) at --pp 2 --pp-partition 1,31: every rank was charged half (8.03 GB),
    so stage 1 (31 layers and the head, 14.57 GB) was given a KV pool that does not fit beside its weights. Stage 0
    holds 1/32 of the layers' 13959176192 B and the embedding, stage 1 31/32 and the head."""
    config = {**load_preset_config("llama-3.1-8b"), "vocab_size": 128256, "tie_word_embeddings": False}
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 16060522496}}))
    code, out, _ = run(capsys, "plan", "--hf-config", str(tmp_path), "--gpu", "H100", "--pp", "2",
                       "--pp-partition", "1,31", "--json")
    assert code == 0
    data = json.loads(out)
    embedding, body = 128256 * 4096 * 2, 16060522496 - 2 * 128256 * 4096 * 2
    stage0, stage1 = -(-body // 32) + embedding, -(-body * 31 // 32) + embedding
    assert (stage0, stage1) == (1486897408, 14573625088)
    assert data["budget"]["weights_bytes"] == stage0
    ranks = {r["rank"]: r["budget_bytes"] for r in data["consensus"]["ranks"]}
    assert abs((ranks[0] - ranks[1]) - (stage1 - stage0)) < 1 << 30, (ranks, stage1 - stage0)


def test_a_partition_of_a_config_without_vocab_charges_at_least_the_even_split(capsys: pytest.CaptureFixture[str]) \
        -> None:
    """The presets keep no vocab_size, so where the embeddings sit is unknown: a stage is charged its layers' share of
    its tensor-parallel share, but at least the even split (qwen3-next-80b-a3b, 162649725440 B, --tp 4 --pp 2
    --pp-partition 4,44: stage 0 half of 40662431360 B, stage 1 44/48 of it), never less than before."""
    code, out, _ = run(capsys, "plan", "--preset", "qwen3-next-80b-a3b", "--gpu", "H100", "--tp", "4", "--pp", "2",
                       "--pp-partition", "4,44", "--json")
    assert code == 0
    data = json.loads(out)
    per_tp = -(-162649725440 // 4)
    assert data["budget"]["weights_bytes"] == -(-162649725440 // 8) == 20331215680
    ranks = {r["rank"]: r["budget_bytes"] for r in data["consensus"]["ranks"]}
    assert {ranks[r] for r in range(4)} == {ranks[0]} and {ranks[r] for r in range(4, 8)} == {ranks[4]}
    stage1 = -(-per_tp * 44 // 48)
    assert abs((ranks[0] - ranks[4]) - (stage1 - 20331215680)) < 1 << 30


def test_each_distinct_shard_is_planned_once(capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    """A stage's tensor-parallel ranks hold equal shards: deepseek-v3 at --tp 8 --pp 16 plans 16 ranks' budgets, not
    128 (the key once compared each stage's pipeline record, which holds the rank's own shard, so nothing matched);
    an uneven --pp-partition of 2 stages plans 2."""
    import graphkv.command.ranks as ranks

    calls = []
    plan_with_budget = ranks.plan_with_budget
    monkeypatch.setattr(ranks, "plan_with_budget", lambda *a, **k: calls.append(k.get("stage")) or
                        plan_with_budget(*a, **k))
    assert run(capsys, "plan", "--preset", "deepseek-v3", "--tp", "8", "--pp", "16", "--gpu", "H200")[0] == 0
    assert len(calls) == 16
    calls.clear()
    assert run(capsys, "plan", "--preset", "qwen3-next-80b-a3b", "--gpu", "H100", "--tp", "4", "--pp", "2",
               "--pp-partition", "4,44")[0] == 0
    assert calls == [(0, (4, 44)), (1, (4, 44))]
