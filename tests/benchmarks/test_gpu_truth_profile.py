"""Tests `benchmarks/gpu_truth/profile.py`: kernels sorted into categories, the device's timeline preferred, failures kept as rows."""

from benchmarks.gpu_truth.profile import COLUMNS, category, decode_groups, kernel_events, profile_rows, span_s, step_groups, summarize
from costmodel.step.estimate import StepEstimate


def _trace() -> dict:
    meta = [{"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/host:CPU"}},
            {"ph": "M", "pid": 2, "name": "process_name", "args": {"name": "/device:GPU:0"}}]
    host = [{"ph": "X", "pid": 1, "name": "thunk", "dur": 900.0, "args": {"hlo_op": "custom-call.1"}}]
    device = [{"ph": "X", "pid": 2, "name": "sm90_xmma_gemm_bf16", "ts": 0.0, "dur": 600.0, "args": {"hlo_op": "custom-call.1"}},
              {"ph": "X", "pid": 2, "name": "cudnn_fort_native_sdpa_sm90", "ts": 600.0, "dur": 200.0, "args": {"hlo_op": "custom-call.2"}},
              {"ph": "X", "pid": 2, "name": "loop_add_fusion", "ts": 800.0, "dur": 100.0, "args": {"hlo_op": "loop_add_fusion.3"}},
              {"ph": "X", "pid": 2, "name": "wrapped_transpose", "ts": 900.0, "dur": 50.0, "args": {"hlo_op": "wrapped_transpose"}},
              {"ph": "X", "pid": 2, "name": "input_reduce_fusion", "ts": 1000.0, "dur": 50.0, "args": {"hlo_op": "input_reduce_fusion.1"}}]
    return {"traceEvents": meta + host + device}


def test_kernels_fall_into_the_categories_the_simulator_terms_map_onto():
    assert category("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT", "custom-call.9") == "gemm"
    assert category("loop_dynamic_update_slice_fusion", "dynamic-update-slice.2") == "slice"
    assert category("add_reduce-precision_fusion", "x") == "elementwise"
    assert category("input_reduce_fusion", "input_reduce_fusion.3") == "reduction"


def test_the_device_timeline_is_read_not_the_host_s_launches():
    events = kernel_events(_trace())
    assert {e["pid"] for e in events} == {2} and len(events) == 5
    summary = summarize(events, steps=2)
    assert summary["gemm"]["measured_s"] == 300e-6 and summary["attention"]["kernels_per_step"] == 0.5
    assert summary["copy"]["top_kernels"] == "wrapped_transpose"
    assert abs(span_s(events, steps=2) - 525e-6) < 1e-12


def test_profile_rows_compare_the_sums_with_the_simulator_and_keep_a_failure_as_a_row(monkeypatch):
    breakdown = {"compute_s": 7e-4, "memory_bound_s": 2e-4, "recompute_s": 0.0, "bubble_s": 0.0, "exposed_comm_s": 0.0, "optimizer_s": 1e-4}
    estimate = StepEstimate.model_construct(breakdown=type("B", (), breakdown)())
    rows = profile_rows("m", 1.2e-3, step_groups(estimate), _trace, steps=1)
    by = {r["category"]: r for r in rows}
    assert tuple(rows[0]) == COLUMNS
    assert abs(by["gemm + attention"]["measured_s"] - 8e-4) < 1e-12 and by["gemm + attention"]["predicted_s"] == 7e-4
    assert abs(by["other kernels"]["measured_s"] - 2e-4) < 1e-12 and abs(by["other kernels"]["predicted_s"] - 3e-4) < 1e-12
    assert abs(by["idle"]["measured_s"] - 2e-4) < 1e-12

    def broken() -> dict:
        raise RuntimeError("no trace written")

    [failed] = profile_rows("m", 1.0, step_groups(estimate), broken)
    assert failed["error"] == "RuntimeError: no trace written" and failed["model"] == "m"


def test_a_decode_step_s_kernels_are_summed_against_its_time_per_output_token():
    estimate = StepEstimate.model_construct(time_per_output_token_s=1e-3)
    rows = {r["category"]: r for r in profile_rows("d", None, decode_groups(estimate), _trace, steps=1)}
    assert abs(rows["every kernel"]["measured_s"] - 1000e-6) < 1e-12 and rows["every kernel"]["predicted_s"] == 1e-3
    assert abs(rows["idle"]["measured_s"] - 50e-6) < 1e-12  # the span's gap between the transpose and the reduction
