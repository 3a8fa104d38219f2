"""Which models graphkv.hf runs, and the one-line refusal for the others."""

import subprocess
import sys

import pytest
from transformers import AutoConfig, AutoModelForCausalLM

from graphkv import SpecError
from graphkv.hf import FAMILIES, generate
from graphkv.hf.tiny import TINY_CONFIGS


def test_every_supported_family_has_a_tiny_config() -> None:
    """The families graphkv.hf runs are exactly the ones the tests serve."""
    assert sorted(FAMILIES) == sorted(TINY_CONFIGS)


def test_an_unsupported_family_is_one_line_naming_what_is_missing() -> None:
    """A BLOOM model (ALiBi: its position bias is in the mask graphkv's masks replace) is refused: its model_type,
    the families that run, and what to do instead."""
    config = AutoConfig.for_model("bloom", n_layer=1, hidden_size=32, n_head=2, vocab_size=64)
    with pytest.raises(SpecError) as info:
        generate(AutoModelForCausalLM.from_config(config), [[1, 2]], max_new_tokens=1)
    message = str(info.value)
    assert message.startswith("model.config.model_type='bloom': graphkv.hf runs apertus, arcee, aria_text, bamba, beam")
    assert ", qwen2, qwen2_moe, qwen3, qwen3_moe, qwen3_next, seed_oss," in message
    assert "graphkv plan --hf-config" in message and "\n" not in message


def test_something_that_is_not_a_model_is_refused() -> None:
    """An object without a transformers config is refused naming its type."""
    with pytest.raises(SpecError, match=r"model='dict': is not a loaded transformers model"):
        generate({}, [[1]], max_new_tokens=1)


def test_import_without_transformers_names_the_extra() -> None:
    """With transformers hidden, `import graphkv.hf` fails with the extra to install."""
    code = "import sys; sys.modules['transformers'] = None\nimport graphkv.hf"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1].startswith(
        "graphkv.errors.MissingExtraError: graphkv.hf='transformers': needs the Python package 'transformers'")
    assert "pip install 'graphkv[hf]'" in proc.stderr
