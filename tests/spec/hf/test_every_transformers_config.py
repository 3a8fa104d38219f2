"""Every causal language model the installed transformers knows, through ``graphkv plan --hf-config``: each
reference config (``AutoConfig.for_model``, written as ``save_pretrained`` writes a checkpoint's config.json)
plans, or is refused in one line naming a field — never a traceback. The families graphkv lists must plan."""

from __future__ import annotations

import contextlib
import io
import logging
from pathlib import Path

import pytest

from graphkv.cli import main
from graphkv.spec.hf.families import FAMILIES

pytest.importorskip("transformers")


def _causal_lm_types() -> list[str]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


# Listed families whose transformers reference config is no model (transformers cannot build it either): refused,
# naming the field; their checkpoints' config.json files set it (tests/spec/test_hf_presets.py plans them).
UNBUILDABLE_REFERENCES = {
    "glm4_moe": "config.head_dim=<missing>",  # head_dim null, 4096 hidden over 96 heads (GLM-4.5: head_dim 128)
    "lfm2_moe": "config.layer_types=<missing>",  # layer_types null: LFM2-8B-A1B's config lists them
}


def _plan(model_type: str, tmp_path: Path, *flags: str) -> tuple[int, str, bool]:
    """``graphkv plan --hf-config`` on ``model_type``'s reference config: (exit code, stderr, is_encoder_decoder),
    or a skip where transformers cannot build that config without a download."""
    from transformers import AutoConfig

    logging.getLogger("transformers").setLevel(logging.ERROR)  # reference configs warn about their token ids
    try:
        config = AutoConfig.for_model(model_type)
    except Exception as e:  # noqa: BLE001 - transformers' own failure to build its reference config
        pytest.skip(f"AutoConfig.for_model({model_type!r}) fails in this transformers: {type(e).__name__}")
    path = tmp_path / "config.json"
    config.to_json_file(str(path), use_diff=False)
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = main(["plan", "--hf-config", str(path), *flags])
    return code, err.getvalue(), bool(getattr(config, "is_encoder_decoder", False))


@pytest.mark.slow
def test_every_causal_lm_config_plans_or_is_refused_naming_a_field(tmp_path):
    """196 model types in transformers 5.24: 161 plan, 34 are refused (encoder-decoders, layer types graphkv
    does not plan, fields a reference config leaves out, a default pool too small for 256 Mamba states) and one has
    no reference config; each refusal is one line naming a ``config.`` field or a flag. An encoder-decoder is refused naming ``is_encoder_decoder``."""
    planned, refused = [], {}
    for model_type in _causal_lm_types():
        directory = tmp_path / model_type
        directory.mkdir()
        try:
            code, err, encoder_decoder = _plan(model_type, directory)
        except pytest.skip.Exception:
            continue
        if code == 0:
            assert err == "", (model_type, err)
            planned.append(model_type)
            continue
        assert code == 2, (model_type, code, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("graphkv: error: "), (model_type, err)
        assert "config." in lines[0] or "--" in lines[0], (model_type, err)
        if encoder_decoder:
            assert "config.is_encoder_decoder=True" in lines[0], (model_type, err)
        refused[model_type] = lines[0]
    assert len(planned) >= 3 * len(refused), (len(planned), sorted(refused))


@pytest.mark.slow
def test_every_listed_family_plans_from_its_reference_config(tmp_path):
    """Every family ``graphkv models`` lists that transformers has as a causal LM plans from the reference config
    (at 16 sequences: a Mamba2 model's 256 states do not fit the default 20 GiB pool), except the two whose
    reference config transformers itself cannot build a model from, refused naming the field."""
    listed = sorted({f.model_type for f in FAMILIES} & set(_causal_lm_types()))
    assert len(listed) >= 40, listed
    failed = {}
    for model_type in listed:
        directory = tmp_path / model_type
        directory.mkdir()
        code, err, _ = _plan(model_type, directory, "--max-num-seqs", "16")
        expected = UNBUILDABLE_REFERENCES.get(model_type)
        if (code == 0) != (expected is None) or (expected is not None and expected not in err):
            failed[model_type] = (code, err.strip())
    assert not failed, failed
