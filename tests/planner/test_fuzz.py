"""Fuzzing user input: configs, meshes, device counts and layouts either work or fail with a `PlannerError`.

The default run keeps a fast subset; ``python -m pytest -m slow`` runs 10 000 cases each.
"""

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from costmodel.errors import PlannerError
from costmodel.hardware.machine import load_machine
from costmodel.hardware.mesh import parse_mesh
from costmodel.inputs.layout import Layout
from costmodel.inputs.model_config import ModelConfig
from costmodel.inputs.train_config import TrainConfig
from costmodel.step.simulator import simulate
from planner.api import plan
from planner.config import from_hf_config

ADVERSARIAL = st.one_of(
    st.integers(-3, 3), st.integers(2**40, 2**62), st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=5),
    st.none(), st.booleans(), st.lists(st.integers(), max_size=2), st.sampled_from([8, 64, 128, 4096, 14336, 32000]),
)
KEYS = ["hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
        "vocab_size", "max_position_embeddings", "tie_word_embeddings", "num_local_experts", "num_experts_per_tok",
        "n_embd", "n_layer", "n_head", "n_inner", "moe_intermediate_size", "num_experts", "hidden_act", "rope_theta"]
CONFIGS = st.builds(
    lambda model_type, values: {"model_type": model_type, **values} if model_type else values,
    st.sampled_from([None, "llama", "gpt2", "mixtral", "qwen2_moe", "qwen3", "falcon", ""]),
    st.dictionaries(st.sampled_from(KEYS), ADVERSARIAL, max_size=len(KEYS)),
)
MESHES = st.one_of(st.text(max_size=12), st.lists(st.integers(-2, 70000), min_size=0, max_size=4).map(lambda xs: "x".join(map(str, xs))))
HW = load_machine("h100-sxm")


def _config_case(data):
    try:
        cfg = from_hf_config(data)
    except PlannerError as err:
        assert str(err) and "\n" not in str(err)
        return
    assert cfg.total_params > 0


def _mesh_case(text):
    try:
        mesh = parse_mesh(text)
    except PlannerError:
        return
    assert mesh.n_devices == math.prod(mesh.axis_sizes) > 0


def _layout_case(data):
    cfg_data, degrees, seq, batch = data
    try:
        cfg = from_hf_config(cfg_data)
        dp, tp, pp, mb = degrees
        train = TrainConfig(seq_len=seq, global_batch=batch)
        est = simulate(cfg, train, Layout(dp=dp, tp=tp, pp=pp, micro_batch=mb), HW)
    except PlannerError:
        return
    assert est.step_time_s > 0 and math.isfinite(est.step_time_s)


LLAMA_LIKE = st.fixed_dictionaries({
    "model_type": st.just("llama"), "hidden_size": st.sampled_from([64, 96, 128]), "intermediate_size": st.integers(1, 512),
    "num_hidden_layers": st.integers(1, 8), "num_attention_heads": st.sampled_from([1, 2, 3, 4, 8]),
    "num_key_value_heads": st.sampled_from([1, 2, 4]), "vocab_size": st.integers(1, 1000),
})
LAYOUT_CASES = st.tuples(LLAMA_LIKE, st.tuples(*[st.integers(1, 8)] * 4), st.integers(1, 4096), st.integers(1, 64))
TINY = ModelConfig(name="tiny", hidden_size=64, num_layers=4, num_heads=8, num_kv_heads=2, ffn_size=128, vocab_size=256)
PLAN_CASES = st.tuples(
    st.one_of(MESHES, st.integers(-2, 70000), st.sampled_from([1, 65536, 2**24, 2**24 + 1, 10**12])), st.integers(1, 4096),
)


def _plan_case(case):
    where, batch = case
    mesh, devices = (where, None) if isinstance(where, str) else (None, where)
    try:
        p = plan(TINY, mesh=mesh, devices=devices, seq_len=128, global_batch=batch, time_limit_s=2.0)
    except PlannerError as err:
        assert str(err) and "\n" not in str(err)
        return
    assert p.layout.n_devices == (parse_mesh(mesh).n_devices if mesh else devices) == math.prod(a.size for a in p.mesh)


FAST = settings(derandomize=True, database=None, deadline=None, max_examples=300, suppress_health_check=list(HealthCheck))
SLOW = settings(derandomize=True, database=None, deadline=None, max_examples=10_000, suppress_health_check=list(HealthCheck))


@FAST
@given(CONFIGS)
def test_configs_fast(data):
    _config_case(data)


@FAST
@given(MESHES)
def test_meshes_fast(text):
    _mesh_case(text)


@FAST
@given(LAYOUT_CASES)
def test_layouts_fast(data):
    _layout_case(data)


@settings(FAST, max_examples=100)  # a whole layout search per case
@given(PLAN_CASES)
def test_plans_fast(case):
    _plan_case(case)


@pytest.mark.slow
@SLOW
@given(CONFIGS)
def test_configs_10k(data):
    _config_case(data)


@pytest.mark.slow
@SLOW
@given(MESHES)
def test_meshes_10k(text):
    _mesh_case(text)


@pytest.mark.slow
@SLOW
@given(LAYOUT_CASES)
def test_layouts_10k(data):
    _layout_case(data)


@pytest.mark.slow
@SLOW
@given(PLAN_CASES)
def test_plans_10k(case):
    _plan_case(case)
