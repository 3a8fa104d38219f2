"""Each capture key's graph memory: the model, its uncalibrated default, calibration files and the fit."""

from __future__ import annotations

import json

import pytest

from graphkv import Budget, FullAttentionSpec, Limits, ModelKV, SpecError, compile_plan
from graphkv.plan.graph_keys import GraphKey
from graphkv.plan.graph_pool import CALIBRATION_FORMAT, GraphPoolModel, fit_graph_pool

FULL = FullAttentionSpec(num_kv_heads=8, head_size=128)


def _keys(*sizes: int) -> list[GraphKey]:
    return [GraphKey(num_tokens=n, num_reqs=None, uniform=False) for n in sizes]


def _plan(**kwargs) -> object:
    model = ModelKV.from_specs("m", [(FULL, "flash_attn")], hidden_size=1024)
    return compile_plan(model, Limits(max_model_len=1024, max_num_seqs=4, max_num_batched_tokens=16,
                                      max_cudagraph_capture_size=16),  # mixed steps up to 16 tokens, not vLLM's 8
                        Budget.kv_bytes("1GiB"), **kwargs)


def test_the_first_key_reserves_the_workspace_every_key_pays_its_outputs_and_graph():
    """100 B per graph, 10 B outputs and 1000 B workspace per token over keys 16, 8, 1 (largest first)."""
    model = GraphPoolModel(per_graph_bytes=100.0, output_bytes_per_token=10.0, workspace_bytes_per_token=1000.0,
                           calibrated=True, source="test")
    got = [e.nbytes for e in model.estimate(_keys(16, 8, 1))]
    assert got == [100 + 160 + 16000, 100 + 80, 100 + 10]


def test_the_uncalibrated_default_is_said_so_and_follows_the_hidden_size():
    """hidden 1024, no calibration: 4 x 1024 x 2 B workspace and 1024 x 2 B outputs per token, marked UNCALIBRATED."""
    plan = _plan()
    keys = plan.ledger.graph_keys
    assert [k.num_tokens for k in keys] == [16, 8, 4, 4, 2, 2, 1, 1]
    assert keys[0].nbytes == 16 * 2048 + 16 * 8192 and keys[1].nbytes == 8 * 2048
    assert plan.ledger.graph_pool_bytes == sum(k.num_tokens for k in keys) * 2048 + 16 * 8192
    entry = plan.ledger.other_entries[-1]
    assert entry.name == "graph pool" and entry.reason.startswith("UNCALIBRATED estimate: 8 graphs")


def test_without_a_hidden_size_or_calibration_the_graph_pool_is_unknown():
    """No hidden_size: no estimate, and the reason says how to get one."""
    plan = compile_plan(ModelKV.from_specs("m", [(FULL, "flash_attn")]), Limits(max_model_len=1024),
                        Budget.kv_bytes("1GiB"))
    assert plan.ledger.graph_keys == () and "measure it with graphkv bench memory" in plan.ledger.entries[-1].reason


def test_a_calibration_file_round_trips_and_scales_per_token_terms_by_hidden_size(tmp_path):
    """Written and read back: the same coefficients; measured at hidden 512, a 1024 model doubles the per-token terms."""
    path = tmp_path / "cal.json"
    GraphPoolModel(per_graph_bytes=4096.0, output_bytes_per_token=3.0, workspace_bytes_per_token=50.0, calibrated=True,
                   source="fit", hidden_size=512).write(path, model="demo", device="H100")
    data = json.loads(path.read_text())
    assert data["format"] == CALIBRATION_FORMAT and data["device"] == "H100"
    model = GraphPoolModel.from_file(path)
    assert (model.per_graph_bytes, model.output_bytes_per_token, model.hidden_size) == (4096.0, 3.0, 512)
    assert model.calibrated and model.source == f"calibrated: {path} (demo, H100)"
    plan = _plan(graph_pool=model)
    assert plan.ledger.graph_keys[0].nbytes == 4096 + 16 * 6 + 16 * 100
    assert plan.ledger.entries[-1].reason.startswith("calibrated: 8 graphs")


@pytest.mark.parametrize("text, message", [
    ("{", "graph_calibration='{path}': is not valid JSON"),
    ('{"format": "other/1"}', "has format 'other/1', not 'graphkv.graph_calibration/1'"),
    ('{"format": "graphkv.graph_calibration/1", "per_graph_bytes": -1, "output_bytes_per_token": 1, '
     '"workspace_bytes_per_token": "x"}', "2 problems"),
])
def test_a_bad_calibration_file_names_the_file_and_the_field(tmp_path, text, message):
    """Bad JSON, another format, negative or non-numeric coefficients: SpecError naming what to fix."""
    path = tmp_path / "cal.json"
    path.write_text(text)
    with pytest.raises(SpecError, match="graphkv bench memory") as info:
        GraphPoolModel.from_file(path)
    assert message.replace("{path}", str(path)) in str(info.value)


def test_a_missing_calibration_file_is_a_spec_error(tmp_path):
    """A path that does not exist: SpecError, not FileNotFoundError."""
    with pytest.raises(SpecError, match="graph_calibration='.*none.json': no such file; pass the path of the "
                                        "graph_calibration.json"):
        GraphPoolModel.from_file(tmp_path / "none.json")


def test_compile_refuses_a_graph_pool_that_is_not_a_model():
    """graph_pool must be a GraphPoolModel (e.g. from_file), named in the error."""
    with pytest.raises(SpecError, match="graph_pool='str': must be a GraphPoolModel or None"):
        _plan(graph_pool="cal.json")


def test_the_fit_takes_a_line_through_the_later_keys_and_the_first_peak_above_it_as_workspace():
    """Keys 16, 8, 4, 2, 1 keeping 1000 + 10 n B, the first 4000 B more (what its capture allocates once) and peaking
    300 B x 16 above that: 1000 B, 10 B and (4000 + 300 x 16) / 16 = 550 B per token; the first key's estimate is
    its measured peak, the others their kept bytes."""
    keys = _keys(16, 8, 4, 2, 1)
    kept = [1000 + 10 * k.num_tokens + (4000 if i == 0 else 0) for i, k in enumerate(keys)]
    fitted = fit_graph_pool(keys, kept, first_peak_bytes=kept[0] + 300 * 16, hidden_size=64, source="fit",
                            lazy_workspace_bytes=33_554_432)
    assert (fitted.per_graph_bytes, fitted.output_bytes_per_token, fitted.workspace_bytes_per_token) == (1000.0, 10.0,
                                                                                                            550.0)
    assert fitted.hidden_size == 64 and fitted.lazy_workspace_bytes == 33_554_432.0 and fitted.calibrated
    assert [e.nbytes for e in fitted.estimate(keys)] == [kept[0] + 300 * 16, *kept[1:]]


def test_the_fit_recovers_the_coefficients_of_exact_measurements():
    """What a known model keeps per key, and its first key's peak, fit back to it: 2048 B, 12 B, 300 B per token."""
    truth = GraphPoolModel(per_graph_bytes=2048.0, output_bytes_per_token=12.0, workspace_bytes_per_token=300.0,
                           calibrated=True, source="truth")
    keys = _keys(64, 32, 16, 8, 4, 2, 1)
    kept = [2048 + 12 * k.num_tokens for k in keys]
    fitted = fit_graph_pool(keys, kept, first_peak_bytes=truth.estimate(keys)[0].nbytes, hidden_size=None, source="fit")
    assert fitted.per_graph_bytes == pytest.approx(2048.0)
    assert fitted.output_bytes_per_token == pytest.approx(12.0)
    assert fitted.workspace_bytes_per_token == pytest.approx(300.0)
    assert fitted.lazy_workspace_bytes == 0.0


def test_the_fit_clamps_noise_below_zero_and_needs_one_value_per_key():
    """A falling line fits flat, a negative intercept through the origin, a peak below kept no workspace; a
    missing measurement is a SpecError."""
    flat = fit_graph_pool(_keys(8, 4, 2), [900, 1000, 1100], first_peak_bytes=8900, hidden_size=None, source="fit")
    assert (flat.per_graph_bytes, flat.output_bytes_per_token, flat.workspace_bytes_per_token) == (1050.0, 0.0,
                                                                                                    981.25)
    origin = fit_graph_pool(_keys(4, 2, 1), [400, 100, 0], first_peak_bytes=0, hidden_size=None, source="fit")
    assert origin.per_graph_bytes == 0.0 and origin.output_bytes_per_token == 40.0  # (2 x 100 + 1 x 0) / (4 + 1)
    assert origin.workspace_bytes_per_token == 0.0
    one_size = fit_graph_pool(_keys(4, 4), [100, 300], first_peak_bytes=100, hidden_size=None, source="fit")
    assert (one_size.per_graph_bytes, one_size.output_bytes_per_token) == (200.0, 0.0)
    with pytest.raises(SpecError, match="kept_bytes=1: needs one value per key \\(2\\)"):
        fit_graph_pool(_keys(8, 4), [1], first_peak_bytes=1, hidden_size=None, source="fit")


def test_lazy_workspace_bytes_round_trip_and_an_older_file_reads_them_as_0(tmp_path):
    """lazy_workspace_bytes is written and read back; a file written before it existed reads 0; a negative one is
    refused naming the field."""
    path = tmp_path / "cal.json"
    GraphPoolModel(per_graph_bytes=512.0, output_bytes_per_token=4.0, workspace_bytes_per_token=64.0, calibrated=True,
                   source="fit", lazy_workspace_bytes=33_685_504.0).write(path, model="demo", device="H100")
    assert json.loads(path.read_text())["lazy_workspace_bytes"] == 33_685_504.0
    assert GraphPoolModel.from_file(path).lazy_workspace_bytes == 33_685_504.0
    old = {"format": CALIBRATION_FORMAT, "per_graph_bytes": 512.0, "output_bytes_per_token": 4.0,
           "workspace_bytes_per_token": 64.0, "hidden_size": None, "source": "fit"}
    path.write_text(json.dumps(old))
    model = GraphPoolModel.from_file(path)
    assert model.lazy_workspace_bytes == 0.0 and model.workspace_bytes_per_token == 64.0
    path.write_text(json.dumps({**old, "lazy_workspace_bytes": -1}))
    with pytest.raises(SpecError, match="graph_calibration.lazy_workspace_bytes=-1: in .* must be a finite number"):
        GraphPoolModel.from_file(path)
