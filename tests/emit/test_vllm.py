"""`--emit vllm`: the vllm serve command that realizes a plan, each non-default value commented."""

from __future__ import annotations

import pytest

from graphkv.cli import main
from graphkv.emit.vllm import vllm_default_capture_sizes

GRID_8192 = [1, 2, 4, *range(8, 256, 8), *range(256, 8193, 16)]  # vLLM's grid up to 8192 tokens: 531 sizes


def emit(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[list[str], list[str]]:
    """(comment lines, command lines) of `graphkv plan ... --emit vllm`."""
    assert main(["plan", *argv, "--emit", "vllm"]) == 0
    lines = capsys.readouterr().out.splitlines()
    return [x for x in lines if x.startswith("#")], [x for x in lines if not x.startswith("#")]


def test_qwen3_next_64_users(capsys: pytest.CaptureFixture[str]) -> None:
    """Qwen3-Next at 20 GiB for 64 users: the lengths, the pinned pool, prefix caching off, the capture sizes."""
    notes, command = emit(capsys, "--preset", "qwen3-next-80b-a3b", "--kv-memory", "20GiB", "--concurrency", "64")
    pool = 1606 * 13369344
    assert command == [
        "vllm serve Qwen/Qwen3-Next-80B-A3B-Instruct \\",
        "  --tensor-parallel-size 1 \\",
        "  --max-model-len 11968 \\",
        "  --max-num-seqs 256 \\",
        "  --max-num-batched-tokens 8192 \\",
        f"  --kv-cache-memory-bytes {pool} \\",
        "  --no-enable-prefix-caching",  # capture sizes: the engine's own (up to min(2 x 256, 512) tokens), no flag
    ]
    assert notes[0] == "# vllm serve (vLLM 0.33 flags) realizing graphkv's plan for qwen3-next-80b-a3b"
    assert notes[1] == ("# --max-model-len 11968: the engine's default is max_position_embeddings=262144; graphkv: auto: "
                        "the largest length at which concurrency=64 requests of 25 pages each fit 1605 usable pages")
    assert any(n.startswith("# --no-enable-prefix-caching: the engine enables prefix caching by default") for n in notes)
    assert any(n.startswith(f"# --kv-cache-memory-bytes {pool}: the engine's default profiles memory") for n in notes)
    assert all("--block-size" not in line for line in command)  # 544 is the engine's own hybrid alignment too


def test_qwen3_next_explicit_block_size_and_align_mode(capsys: pytest.CaptureFixture[str]) -> None:
    """A block size the engine would not pick is emitted with why; align mode is the engine's default (no flag)."""
    # (align mode keeps 3 pages per gated-delta group and request: 64 sequences x 9 state pages fit 802 pages)
    notes, command = emit(capsys, "--preset", "qwen3-next-80b-a3b", "--block-size", "1088", "--mamba-cache-mode",
                          "align", "--max-num-seqs", "64")
    assert "  --block-size 1088 \\" in command
    assert "--no-enable-prefix-caching" not in " ".join(command)
    assert any(n.startswith("# --block-size 1088: without it the engine picks 576 tokens per page") for n in notes)


def gpt_oss_pages(length: int, *, window: int = 128, step_tokens: int = 8192, block: int = 16,
                  in_flight_steps: int = 2) -> int:
    """Worst-case pages of one gpt-oss request: full attention cdiv(L, 16) + sliding window
    cdiv(min(window - 1 + in_flight_steps x step_tokens, L), 16) + 1 (in_flight_steps is
    Limits.max_concurrent_batches, 2 by default as vLLM 0.33's async scheduling)."""
    return -(-length // block) + (-(-min(window - 1 + in_flight_steps * step_tokens, length) // block) + 1)


def test_gpt_oss_120b_for_32_users(capsys: pytest.CaptureFixture[str]) -> None:
    """gpt-oss-120b at 20 GiB for 32 users: the longest length by the sliding + full page formula."""
    num_blocks = (20 << 30) // (18 * 16 * 8 * 128 * 2)  # 18 layers per slot x 32 KiB pages
    usable = num_blocks - 1
    expected_len = max(n for n in range(16, 131073, 16) if 32 * gpt_oss_pages(n) <= usable)
    notes, command = emit(capsys, "--preset", "gpt-oss-120b", "--kv-memory", "20GiB", "--concurrency", "32",
                          "--max-num-seqs", "32", "--max-num-batched-tokens", "8192")
    assert num_blocks == 36408
    assert command == [
        "vllm serve openai/gpt-oss-120b \\",
        "  --tensor-parallel-size 1 \\",
        f"  --max-model-len {expected_len} \\",
        "  --max-num-seqs 32 \\",
        "  --max-num-batched-tokens 8192 \\",
        f"  --kv-cache-memory-bytes {num_blocks * 18 * 16 * 8 * 128 * 2}",  # capture sizes: the engine's own, 1..64
    ]
    assert not any("cudagraph" in n for n in notes)


def test_captures_beyond_the_engine_default_are_emitted(capsys: pytest.CaptureFixture[str]) -> None:
    """--max-cudagraph-capture-size 8192 captures every size of vLLM's grid up to 8192 tokens: the command lists
    them, and the note gives the engine's default (11 sizes up to 2 x 32) and the limit that was set."""
    notes, command = emit(capsys, "--preset", "gpt-oss-120b", "--kv-memory", "20GiB", "--max-num-seqs", "32",
                          "--max-num-batched-tokens", "8192", "--max-cudagraph-capture-size", "8192")
    assert command[-1] == "  --cudagraph-capture-sizes " + " ".join(map(str, GRID_8192))
    assert len(GRID_8192) == 531
    assert ("# --cudagraph-capture-sizes (531 sizes, 1..8192): the engine's default on Hopper is 11 sizes, 1..64 (up "
            "to min(2 x max_num_seqs, 512) tokens); the plan captures steps up to 8192 tokens "
            "(max_cudagraph_capture_size=8192), graph pool estimate in the plan's ledger") in notes


def test_gpt_oss_on_an_h100_uses_the_checkpoint_weights(capsys: pytest.CaptureFixture[str]) -> None:
    """With --gpu, the pool left after the preset's 65.25 GB of weights is pinned; the H100's own batch defaults
    (1024 sequences, 8192 tokens) get no comment."""
    notes, command = emit(capsys, "--preset", "gpt-oss-120b", "--gpu", "H100", "--max-num-seqs", "1024")
    assert "  --max-num-seqs 1024 \\" in command
    assert not any(n.startswith("# --max-num-seqs") for n in notes)
    pool = int(next(line.split()[1] for line in command if line.strip().startswith("--kv-cache-memory-bytes")))
    assert 0 < pool < int(81559 * (1 << 20) * 0.9) - 65_248_815_744


def test_vllm_default_capture_sizes_follow_the_engine() -> None:
    """vLLM on Hopper (commit 000fc94b): 1, 2, 4, every 8 below 256, every 16 up to min(2 x max_num_seqs x (1 + k),
    512), plus max_num_batched_tokens within it and the uniform decode steps n x (1 + k); never max_num_seqs."""
    assert vllm_default_capture_sizes(256, 8192) == (1, 2, 4, *range(8, 256, 8), *range(256, 513, 16))
    assert vllm_default_capture_sizes(4, 8192) == (1, 2, 4, 8)
    assert vllm_default_capture_sizes(32, 40) == (1, 2, 4, 8, 16, 24, 32, 40)
    assert vllm_default_capture_sizes(20, 8192) == (1, 2, 4, 8, 16, 24, 32, 40)
    assert vllm_default_capture_sizes(48, 8192, 2) == (1, 2, 3, 4, 6, 8, 12, *range(16, 256, 8), 256, 272, 288)


def test_mamba_cache_mode_all_is_emitted(capsys: pytest.CaptureFixture[str]) -> None:
    """A plan in mamba_cache_mode 'all' emits --mamba-cache-mode all (vLLM's CacheConfig.mamba_cache_mode, config/cache.py
    at 002f10e0, takes none / align / all; align is its default with prefix caching), where graphkv warned that vLLM had
    no such mode and emitted none, so the engine ran 'align' with another block size than the plan's."""
    notes, command = emit(capsys, "--preset", "qwen3-next-80b-a3b", "--mamba-cache-mode", "all", "--max-num-seqs", "64")
    assert "  --mamba-cache-mode all" in [line.removesuffix(" \\") for line in command]
    assert "--no-enable-prefix-caching" not in " ".join(command)
    assert any(n.startswith("# --mamba-cache-mode all: the engine's default with prefix caching is 'align'")
               for n in notes)
    assert not any("WARNING" in n for n in notes)
