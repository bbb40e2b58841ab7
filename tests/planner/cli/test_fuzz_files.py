"""Fuzzing file contents: model configs, plan files and hardware profiles, through the real CLI.

Each generated file is written to disk and handed to `planner.cli.main` as a user would: the
run must end with a documented exit code, at most one line on stderr (``plan: error: ...``),
no traceback (any exception other than the CLI's own exit fails the test) and within its
``--time-limit-s`` plus a small grace. Documents are a valid base with up to four mutations
(a key set to a value of any JSON type, extreme or inconsistent; a number scaled by up
to 1e±300, keeping its type; a key removed; an unknown key added), or any JSON value, or text
that is not JSON at all, or brackets nested deep.

The default run keeps a fast subset; ``python -m pytest -m slow tests/planner/test_fuzz_files.py -s``
runs `SLOW_CASES` per kind and prints, per kind, the cases run, exit codes seen and the slowest case.
"""

import contextlib
import io
import json
import time
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from costmodel.hardware.catalog import CATALOG
from costmodel.inputs.layout import Layout
from costmodel.inputs.model_config import ModelConfig
from planner.api import layout_plan
from planner.cli.main import main

# 0 answered, 2 invalid input, 4 infeasible, 6 time limit; a hardware profile may also be valid but
# unsupported (5: no peak for the compute dtype); plan validate may also say 1 (a check out of
# tolerance) and 3 (a plan that cannot be lowered).
CONFIG_CODES, HARDWARE_CODES, PLAN_CODES = {0, 2, 4, 6}, {0, 2, 4, 5, 6}, {0, 1, 2, 3, 4, 5, 6}
GRACE_S = 5.0
SLOW_CASES = {"model config": 10_000, "hardware profile": 10_000, "plan file": 1_000}

LLAMA = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
         "hidden_act": "silu", "tie_word_embeddings": False, "attention_bias": False, "head_dim": 16}
MODEL_KEYS = [*LLAMA, "num_local_experts", "num_experts_per_tok", "num_experts", "moe_intermediate_size", "n_embd", "n_layer",
              "n_head", "n_inner", "activation_function", "layer_norm_epsilon", "torch_dtype"]
HARDWARE = json.loads(CATALOG["a100-80gb"].model_dump_json())
TINY = ModelConfig(name="tiny", hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, ffn_size=128, vocab_size=256)

SCALARS = st.one_of(
    st.integers(-3, 3), st.integers(1, 2**31), st.integers(2**31, 2**63), st.sampled_from([10**30, -(10**30), 2**31 - 1, 10**9]),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, -0.0, 1e-300, 1e300]),
    st.text(max_size=8), st.sampled_from(["4096", "true", "llama", "gpt2", "", "nan"]), st.none(), st.booleans(),
)
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                        st.dictionaries(st.text(max_size=6), inner, max_size=3)), max_leaves=6)


def _paths(doc, prefix=()):
    """Every key path of a nested JSON object (lists indexed), inner nodes included."""
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for key, value in items:
        yield (*prefix, key)
        yield from _paths(value, (*prefix, key))


def _mutate(doc, path, action, value):
    doc = json.loads(json.dumps(doc))
    *parents, last = path
    node = doc
    for key in parents:
        node = node[key]
    if action == "delete" and isinstance(node, dict):
        node.pop(last, None)
    elif action == "extra" and isinstance(node, dict):
        node[f"{last}_extra"] = value
    elif action == "scale":  # same type, extreme size: valid-looking files far from any real one
        old = node[last]
        if isinstance(old, float):
            node[last] = old * value
        elif isinstance(old, int) and not isinstance(old, bool):
            # Integer arithmetic: an int already scaled past float range must scale down without overflow.
            node[last] = old * int(value) if value >= 1 else old // int(1 / value) if value else 0
    else:
        node[last] = value
    return doc


def documents(base, keys=()):
    """JSON text: ``base`` mutated up to four times, or any JSON value, or non-JSON text."""
    paths = sorted(set(_paths(base)) | {(k,) for k in keys}, key=str)
    mutation = st.one_of(
        st.tuples(st.sampled_from(paths), st.sampled_from(["set", "set", "delete", "extra"]), VALUES),
        st.tuples(st.sampled_from(paths), st.just("scale"), st.sampled_from([0, 1e-300, 1e-6, 1e-3, 3, 1e3, 1e6, 1e9, 1e300])),
    )

    def apply(mutations):
        doc = base
        for path, action, value in mutations:
            try:
                doc = _mutate(doc, path, action, value)
            except (KeyError, IndexError, TypeError):  # an earlier mutation removed or replaced the parent
                pass
        return json.dumps(doc)

    return st.one_of(
        st.lists(mutation, min_size=1, max_size=4).map(apply),
        VALUES.map(json.dumps),
        st.text(max_size=40),
        st.integers(1, 200_000).map(lambda n: "[" * n + "]" * n),
        st.integers(1, 2000).map(lambda n: '{"a":' * n + "1" + "}" * n),
    )


def run_cli(argv):
    """(exit code, stdout, stderr, wall seconds) of one in-process CLI run; other exceptions propagate."""
    out, err = io.StringIO(), io.StringIO()
    start = time.perf_counter()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exit_:  # argparse's usage errors
            code = exit_.code
    return code, out.getvalue(), err.getvalue(), time.perf_counter() - start


def check_run(path, text, argv, codes, limit_s, stats=None):
    path.write_text(text)
    code, _, err, wall_s = run_cli(argv)
    assert code in codes, (code, err, text[:300])
    assert "Traceback" not in err and err.count("\n") <= 1, err
    assert code in (0, 1) or err.startswith("plan: error: ") and "; fix: " in err, err  # 1: validate's checks, no error
    assert wall_s < limit_s + GRACE_S, (wall_s, text[:300])
    if stats is not None:
        stats["codes"][code] += 1
        if wall_s > stats["slowest"][0]:
            stats["slowest"] = (wall_s, text[:120])


def model_case(tmp, text, stats=None):
    path = tmp / "config.json"
    check_run(path, text, ["--model", str(path), "--mesh", "2x2", "--global-batch", "8", "--seq-len", "128",
                           "--time-limit-s", "2", "--json"], CONFIG_CODES, 2 * 2 + 60, stats)


def hardware_case(tmp, text, stats=None):
    path = tmp / "hw.json"
    check_run(path, text, ["simulate", "--model", "gpt2", "--hardware", str(path), "--devices", "4", "--tp", "2",
                           "--global-batch", "8", "--seq-len", "128", "--json", "--time-limit-s", "10"],
              HARDWARE_CODES, 10, stats)


def plan_case(tmp, text, stats=None):
    path = tmp / "plan.json"
    check_run(path, text, ["validate", str(path), "--compile-only", "--json", "--time-limit-s", "30"], PLAN_CODES, 30, stats)


@pytest.fixture(scope="module")
def plan_doc():
    plan = layout_plan(TINY, Layout(dp=2), hardware="a100-80gb", seq_len=64, global_batch=4)
    return json.loads(plan.model_dump_json())


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz_files")


FAST = settings(derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck))


@settings(FAST, max_examples=50)
@given(text=documents(LLAMA, MODEL_KEYS))
def test_model_config_files_fast(tmp, text):
    model_case(tmp, text)


@settings(FAST, max_examples=50)
@given(text=documents(HARDWARE))
def test_hardware_files_fast(tmp, text):
    hardware_case(tmp, text)


def test_plan_files_fast(tmp, plan_doc):
    # Mutations that still parse as a plan compile in a subprocess (seconds each): a few cases here.
    @settings(FAST, max_examples=10)
    @given(text=documents(plan_doc))
    def case(text):
        plan_case(tmp, text)

    case()


def _slow(kind, strategy, run_case, tmp):
    stats = {"codes": Counter(), "slowest": (0.0, "")}

    @settings(FAST, max_examples=SLOW_CASES[kind])
    @given(text=strategy)
    def case(text):
        run_case(tmp, text, stats)

    case()
    wall_s, text = stats["slowest"]
    print(f"\n{kind}: {sum(stats['codes'].values())} cases, exit codes {dict(sorted(stats['codes'].items()))}, "
          f"slowest {wall_s:.2f} s: {text!r}")


@pytest.mark.slow
def test_model_config_files_slow(tmp):
    _slow("model config", documents(LLAMA, MODEL_KEYS), model_case, tmp)


@pytest.mark.slow
def test_hardware_files_slow(tmp):
    _slow("hardware profile", documents(HARDWARE), hardware_case, tmp)


@pytest.mark.slow
def test_plan_files_slow(tmp, plan_doc):
    _slow("plan file", documents(plan_doc), plan_case, tmp)
