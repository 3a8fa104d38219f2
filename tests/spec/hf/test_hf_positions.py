"""The model's longest context, read from a config by vLLM 0.33's rules (``_get_and_verify_max_len``)."""

from __future__ import annotations

import pytest

from graphkv import ModelKV, SpecError

BASE = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 2, "hidden_size": 512,
        "num_attention_heads": 8, "num_key_value_heads": 2}


def cap(**fields) -> tuple[int, str]:
    """The cap and the reader's note for BASE with ``fields``."""
    model = ModelKV.from_hf_config({**BASE, **fields})
    return model.max_position_embeddings, model.notes[0]


def test_max_position_embeddings_alone_is_the_cap_without_a_note():
    """One max_position_embeddings field is the cap as written, and the notes say nothing more."""
    value, note = cap(max_position_embeddings=8192)
    assert value == 8192 and "maximum length" not in note and "RoPE" not in note


def test_the_smallest_length_field_wins():
    """With several length fields the smallest is the cap, and the note names it."""
    value, note = cap(max_position_embeddings=8192, seq_length=4096, n_positions=16384)
    assert value == 4096 and "maximum length from seq_length: 4096 (vLLM's rule)" in note


def test_model_max_length_replaces_the_others():
    """model_max_length, when set, replaces max_position_embeddings even when larger (Command-R: 8192 / 131072)."""
    value, note = cap(max_position_embeddings=8192, model_max_length=131072)
    assert value == 131072 and "maximum length from model_max_length" in note


def test_a_config_without_length_fields_is_taken_to_allow_2048():
    """No length field at all: 2048 tokens, as vLLM assumes, and the notes say so."""
    value, note = cap()
    assert value == 2048 and "2048 assumed, as vLLM does" in note


@pytest.mark.parametrize(("rope", "expected"), [
    ({"rope_type": "linear", "factor": 4.0}, 4 * 4096),
    ({"type": "dynamic", "factor": 2.0}, 2 * 4096),  # an older config's rope_scaling, "type" instead of "rope_type"
    ({"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192}, 4096),
    ({"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096}, 4096),
    ({"rope_type": "longrope", "factor": 32.0}, 4096),
    ({"rope_type": "default", "rope_theta": 10000.0}, 4096),
    ({"full_attention": {"rope_type": "linear", "factor": 2.0}, "sliding_attention": {"rope_type": "default"}},
     2 * 4096),  # one dict per layer type
])
@pytest.mark.parametrize("field", ["rope_parameters", "rope_scaling"])
def test_a_rope_factor_scales_the_length_unless_its_type_already_counts_it(rope, expected, field):
    """A RoPE scaling factor multiplies the length, except for llama3 / yarn / longrope (already scaled)."""
    value, note = cap(max_position_embeddings=4096, **{field: rope})
    assert value == expected
    assert ("RoPE scaling factor" in note) == (expected != 4096)


def test_gemma3_lengths_are_not_scaled_again():
    """Gemma 3 writes its length scaled already: a linear factor 8 leaves 131072 as it is."""
    model = ModelKV.from_hf_config({"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
                                    "num_hidden_layers": 2, "hidden_size": 512, "num_attention_heads": 8,
                                    "num_key_value_heads": 4, "head_dim": 64, "sliding_window": 512,
                                    "layer_types": ["sliding_attention", "full_attention"],
                                    "max_position_embeddings": 131072,
                                    "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 8.0},
                                                        "sliding_attention": {"rope_type": "default"}}})
    assert model.max_position_embeddings == 131072


@pytest.mark.parametrize("factor", ["4", -2.0, float("nan"), True])
def test_a_bad_rope_factor_is_one_problem_naming_the_field(factor):
    """A RoPE factor that is not a positive number is refused naming rope_parameters.factor."""
    with pytest.raises(SpecError) as info:
        cap(max_position_embeddings=4096, rope_parameters={"rope_type": "linear", "factor": factor})
    assert str(info.value).startswith("config.rope_parameters.factor=") and "must be a positive number" in str(info.value)


def test_a_pure_mamba_config_plans_at_2048_tokens_by_default():
    """transformers' Mamba2 reference config has no length field: the plan's auto length is vLLM's 2048."""
    pytest.importorskip("transformers", reason="the reference config comes from transformers")
    from transformers_types import reference_config

    import graphkv
    from graphkv import Budget, Limits

    model = ModelKV.from_hf_config(reference_config("mamba2").to_dict())
    plan = graphkv.compile(model, Limits(max_num_seqs=16), Budget.kv_bytes("4GiB"))
    assert plan.max_model_len == 2048
    assert any("2048 assumed" in note for note in plan.notes)


def test_an_unknown_rope_type_is_refused_not_scaled():
    """rope_type "bogus" with factor 4 multiplied the length by 4; now it is refused naming the known types."""
    with pytest.raises(SpecError, match=r"^config.rope_scaling.rope_type='bogus': is not a RoPE type vLLM or "
                                        r"transformers knows \(default, linear, dynamic, .*\); copy "
                                        r"rope_scaling.rope_type from the model's config.json, or set it to 'default'"):
        cap(max_position_embeddings=8192, rope_scaling={"rope_type": "bogus", "factor": 4})
    assert cap(max_position_embeddings=8192, rope_scaling={"type": "dynamic", "factor": 4})[0] == 32768


def test_every_rope_type_transformers_knows_is_known():
    """graphkv's list holds every key of transformers' ROPE_INIT_FUNCTIONS (a new one would be refused)."""
    rope_utils = pytest.importorskip("transformers.modeling_rope_utils",
                                     reason="transformers is optional; its RoPE types are checked where installed")
    from graphkv.spec.hf.positions import ROPE_TYPES

    assert set(rope_utils.ROPE_INIT_FUNCTIONS) <= set(ROPE_TYPES)
