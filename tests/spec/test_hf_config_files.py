"""model_from_hf_config on what a config.json holds: junk, duplicate keys and oversized values are refused or shown
safely (issue 22). Split from test_hf_config.py."""

from __future__ import annotations

import pytest

from graphkv import Budget, Limits
from graphkv.errors import SpecError
from graphkv.spec.hf_config import model_from_hf_config

from preset_configs import JUNK as _JUNK, preset_config as _cfg, state_of as _state


@pytest.mark.parametrize("preset", ["llama-3.1-8b", "gpt-oss-20b", "deepseek-v3"])
def test_junk_in_any_rope_parameter_gives_a_model_or_a_spec_error(preset):
    """Replacing any RoPE parameter (or adding a factor, type or original length) with junk never lets a TypeError
    or an OverflowError escape, and a model that reads keeps a length within the plausibility cap."""
    base = _cfg(preset)
    field = "rope_parameters" if "rope_parameters" in base else "rope_scaling"
    params = dict(base.get(field) or {"rope_type": "linear", "factor": 2.0})
    for key in {*params, "factor", "rope_type", "type", "original_max_position_embeddings"}:
        for junk in [*_JUNK, 10 ** 400, float("nan"), float("inf"), 1e300, 1e-300, ["linear"]]:
            try:
                model = model_from_hf_config({**base, field: {**params, key: junk}})
            except SpecError:
                continue
            assert 1 <= (model.max_position_embeddings or 1) <= 1 << 24


@pytest.mark.parametrize(("factor", "expected"), [(8, 8 * 4096), (1024, 1024 * 4096)])
def test_a_rope_factor_up_to_1024_scales_the_length(factor, expected):
    """Factors up to the plausibility cap of 1024 scale the length as vLLM does."""
    config = _cfg("llama-3.1-8b", max_position_embeddings=4096, rope_scaling={"rope_type": "linear", "factor": factor})
    assert model_from_hf_config(config).max_position_embeddings == expected


def test_a_rope_factor_beyond_1024_is_refused_even_where_the_type_does_not_scale_the_length():
    """A yarn factor does not scale the length (already counted), but 1e300 is still refused naming the field."""
    config = _cfg("llama-3.1-8b", rope_scaling={"rope_type": "yarn", "factor": 1e300,
                                                "original_max_position_embeddings": 4096})
    with pytest.raises(SpecError, match=r"^config\.rope_scaling\.factor=1e\+300: must be <= 1024"):
        model_from_hf_config(config)


def test_a_nested_rope_factor_is_named_with_its_layer_type():
    """A bad factor inside rope_parameters' per-layer-type objects names that layer type."""
    config = _cfg("gpt-oss-20b", rope_parameters={"full_attention": {"rope_type": "linear", "factor": "8"},
                                                  "sliding_attention": {"rope_type": "default"}})
    with pytest.raises(SpecError, match=r"^config\.rope_parameters\.full_attention\.factor='8'"):
        model_from_hf_config(config)


@pytest.mark.parametrize(("key_heads", "value_heads"), [(16, 32), (16, 48), (8, 8)])
def test_gated_delta_value_heads_that_are_a_multiple_of_key_heads_read(key_heads, value_heads):
    """Value heads equal to or a multiple of the key heads (Qwen3-Next 16/32, Qwen3.5 16/48) read."""
    config = _cfg("qwen3-next-80b-a3b", linear_num_key_heads=key_heads, linear_num_value_heads=value_heads)
    assert _state(model_from_hf_config(config)).shapes[1][0] == value_heads


def test_gated_delta_value_heads_below_the_key_heads_are_refused():
    """8 value heads for 16 key heads is not a whole number per key head: refused, suggesting 16."""
    with pytest.raises(SpecError, match=r"config\.linear_num_value_heads=8: must be a multiple of "
                                        r"linear_num_key_heads=16 .* such as 16"):
        model_from_hf_config(_cfg("qwen3-next-80b-a3b", linear_num_value_heads=8))


@pytest.mark.parametrize("nested", ["text_config", "llm_config", "language_config"])
@pytest.mark.parametrize("value", [[{"num_hidden_layers": 2}], "llama", 7])
def test_a_nested_decoder_config_that_is_not_an_object_is_one_problem_naming_it(nested, value):
    """text_config (llm_config, language_config) given as a list, a string or a number is refused naming it, not
    read as a config missing every field."""
    config = {"architectures": ["LlavaForConditionalGeneration"], "model_type": "llava", nested: value}
    with pytest.raises(SpecError) as info:
        model_from_hf_config(config)
    assert [p.field for p in info.value.problems] == [f"config.{nested}"]


def test_printable_escapes_control_bidi_separator_and_surrogate_characters():
    """Control, bidi, line-separator and lone-surrogate characters become escapes; printable text is kept."""
    from graphkv.printable import printable

    assert printable("llama\x1b[31m") == "llama\\x1b[31m"
    assert printable("\u202eevil\u2066") == "\\u202eevil\\u2066"
    assert printable("a\nb\tc\rd\x7f\u2028\ud800\U000e0001") == "a\\nb\\tc\\rd\\x7f\\u2028\\ud800\\U000e0001"
    assert printable("Llama-3.1 café 日本 — ok") == "Llama-3.1 café 日本 — ok"


def test_error_messages_escape_what_a_config_wrote():
    """A model_type with an escape sequence, named in an error, is shown escaped on one line."""
    config = {"model_type": "llama\x1b[31m\u202e\n", "hidden_size": 4096, "num_attention_heads": 32}
    with pytest.raises(SpecError) as info:
        model_from_hf_config(config)
    message = str(info.value)
    assert "for llama\\x1b[31m\\u202e\\n configs" in message
    assert "\x1b" not in message and "\u202e" not in message
    assert info.value.problems[0].field == "config.num_hidden_layers"


def test_plan_report_escapes_the_model_name_and_notes():
    """The plan report shows a name and an architecture from the config with their control characters escaped."""
    from graphkv import Budget, Limits, compile_plan
    from graphkv.report import format_plan

    config = {**_cfg("llama-3.1-8b", num_hidden_layers=2), "_name_or_path": "evil\x1b]0;title\x07\ud800",
              "architectures": ["Llama\u202eForCausalLM"]}
    plan = compile_plan(model_from_hf_config(config), Limits(max_model_len=4096), Budget.kv_bytes("1GiB"))
    report = format_plan(plan, budget_text=None)
    assert report.splitlines()[0] == "graphkv plan: evil\\x1b]0;title\\x07\\ud800"
    assert "Llama\\u202eForCausalLM" in report
    assert all(line.isprintable() for line in report.splitlines())


@pytest.mark.parametrize(("text", "key", "values"), [
    ('{"num_hidden_layers": 32, "hidden_size": 4096, "num_hidden_layers": 40}', "num_hidden_layers", "32 and 40"),
    ('{"rope_scaling": {"factor": 4.0, "rope_type": "linear", "factor": 8.0}}', "rope_scaling.factor", "4.0 and 8.0"),
    ('{"text_config": {"rope_scaling": {"factor": 1, "factor": 2, "factor": 3}}}', "text_config.rope_scaling.factor",
     "1, 2 and 3"),
    ('{"a": [1, {"b": [{"c": 1}, {"c": 2, "c": 2}]}]}', "a[1].b[1].c", "2 and 2"),
    ('{"x": {"k": 1, "k": 2}, "x": 3}', "x", "{'k': 2} and 3"),  # the outer repeat hides the inner one
])
def test_a_key_given_twice_is_refused_at_any_depth_naming_its_path(tmp_path, text, key, values):
    """json keeps the last of two equal keys silently; read_json_file refuses the file naming the key's path and
    every value it was given."""
    from graphkv.inputs import read_json_file

    path = tmp_path / "config.json"
    path.write_text(text)
    with pytest.raises(SpecError) as info:
        read_json_file(str(path), field="--hf-config")
    problem = info.value.problems[0]
    assert problem.field == "--hf-config" and problem.value == str(path)
    assert problem.limit.startswith(f"gives {key} ") and f"(values {values})" in problem.limit
    assert problem.fix.startswith(f"delete all but one {key} from the file")


def test_equal_keys_in_different_objects_are_not_duplicates(tmp_path):
    """The same key in sibling or nested objects is not a repeat: the file reads as json.loads reads it."""
    import json

    from graphkv.inputs import read_json_file

    text = '{"factor": 1, "rope_scaling": {"factor": 2}, "layers": [{"factor": 3}, {"factor": 4}]}'
    path = tmp_path / "config.json"
    path.write_text(text)
    assert read_json_file(str(path), field="--hf-config") == json.loads(text)
