"""Tests `search/pins.py`: pins narrow the layout search, unusable pins are refused by flag, nothing-fits names the pin to drop."""

import time

import pytest

from costmodel.errors import InfeasibleError, InvalidPlanError, TimeLimitError, UnsupportedError
from costmodel.hardware.machine import load_machine
from costmodel.inputs.layout import Offload, Recompute
from costmodel.inputs.model_config import ModelConfig
from costmodel.inputs.train_config import TrainConfig
from search.layouts import NothingFitsError, SearchSpace, degree_splits, grid_search
from search.pins import LayoutPins, flag_of, pin_flag, pinned_failure, pinned_space, serving_splits

MODEL = ModelConfig(name="m", hidden_size=2048, num_layers=16, num_heads=16, num_kv_heads=4, ffn_size=5632, vocab_size=32000)
LLAMA3_8B = ModelConfig(name="llama3-8b", hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=8, ffn_size=14336,
                        vocab_size=128256)
TRAIN = TrainConfig(seq_len=2048, global_batch=64)
HW = load_machine("a100-80gb")


def _space(pins: LayoutPins, *, n_devices: int = 8, splits=None, model: ModelConfig = MODEL, train: TrainConfig = TRAIN) -> SearchSpace:
    where = f"mesh {splits}" if splits else f"{n_devices} devices"
    return pinned_space(model, train, SearchSpace(splits=splits, lowered_only=True), pins, n_devices=n_devices, where=where,
                        devices_per_node=8)


def test_every_pin_has_its_flag_and_prints_as_given():
    assert [flag_of(n) for n in LayoutPins.model_fields] == [
        "--dp", "--tp", "--pp", "--cp", "--ep", "--interleave", "--micro-batch", "--recompute", "--sequence-parallel", "--zero"]
    assert pin_flag("sequence_parallel", False) == "--sequence-parallel no" and pin_flag("recompute", Recompute.FULL) == "--recompute full"
    assert LayoutPins().flags == "" and LayoutPins().given == {}
    assert LayoutPins(zero_stage=0).given == {"zero_stage": 0}  # 0 is a pin, not "unset"


def test_without_pins_the_space_is_unchanged():
    space = SearchSpace()
    assert pinned_space(MODEL, TRAIN, space, LayoutPins(), n_devices=8, where="8 devices", devices_per_node=8) is space


@pytest.mark.parametrize("pins", [
    LayoutPins(zero_stage=2, micro_batch=2),
    LayoutPins(tp=2, sequence_parallel=False, recompute="selective"),
    LayoutPins(pp=2, interleave=2, dp=2),
    LayoutPins(cp=2, zero_stage=1),
])
def test_the_search_keeps_every_pin_and_chooses_the_rest(pins):
    result = grid_search(MODEL, TRAIN, HW, n_devices=8, space=_space(pins))
    for lay in (result.best.layout, *(e.layout for e in result.runners_up)):
        assert {name: getattr(lay, name) for name in pins.given} == pins.given


def test_a_pinned_search_costs_a_fraction_of_the_layouts():
    full = grid_search(MODEL, TRAIN, HW, n_devices=8, space=SearchSpace(lowered_only=True))
    pinned = grid_search(MODEL, TRAIN, HW, n_devices=8, space=_space(LayoutPins(zero_stage=1, micro_batch=2)))
    assert pinned.evaluated * 4 < full.evaluated and pinned.best.step_time_s >= full.best.step_time_s


def test_sequence_parallel_yes_keeps_only_tensor_parallel_layouts_outside_pipelines():
    result = grid_search(MODEL, TRAIN, HW, n_devices=8, space=_space(LayoutPins(sequence_parallel=True)))
    layouts = [result.best.layout, *(e.layout for e in result.runners_up)]
    assert all(lay.tp > 1 and lay.pp == 1 and lay.sequence_parallel for lay in layouts)
    assert result.pruned["sequence parallelism needs tp > 1"] > 0
    assert result.pruned["sequence parallelism inside pipeline stages is not lowered as planned yet"] > 0


@pytest.mark.parametrize(("pins", "splits", "message"), [
    (LayoutPins(tp=3), ((8, 1, 1, 1),), r"^--tp 3: mesh \(\(8, 1, 1, 1\),\) can carry tp 1 only; "
                                        r"fix: use --tp 1, or a --mesh whose axes can carry tp=3$"),
    (LayoutPins(tp=3), None, r"^--tp 3: 8 devices can carry tp 1, 2, 4 or 8 only; fix: use --tp 1, 2, 4 or 8, or a device count "
                             r"that 3 divides$"),
    (LayoutPins(dp=8, tp=2), None, r"^--tp 2: 8 devices with --dp 8 can carry tp 1 only"),
    (LayoutPins(micro_batch=3), ((8, 1, 1, 1),), r"^--micro-batch 3 does not divide the per-replica batch of 8 sequences \(global "
                                                 r"batch 64 over dp=8\); fix: use --micro-batch 1, 2, 4 or 8, or a --global-batch "
                                                 r"that is a multiple of 24$"),
    (LayoutPins(zero_stage=1, tp=8), None, r"^--zero 1 shards state over data-parallel replicas, but 8 devices with --tp 8 leaves "
                                           r"dp=1; fix: use --zero 0, or leave devices for it \(--dp > 1\)$"),
    (LayoutPins(sequence_parallel=True, dp=8), None, r"^--sequence-parallel yes .* leaves tp=1; fix: use --sequence-parallel no"),
    (LayoutPins(interleave=2, pp=1), None, r"^--interleave 2 .* leaves pp=1; fix: use --interleave 1"),
    (LayoutPins(pp=8, interleave=4), None, r"^--pp 8 --interleave 4: m has 16 layers, fewer than the 32 pipeline chunks"),
])
def test_a_pin_nothing_can_carry_is_refused_with_its_flag_and_the_values_that_would_do(pins, splits, message):
    with pytest.raises(InvalidPlanError, match=message):
        _space(pins, splits=splits)


def test_a_tensor_parallel_degree_the_heads_or_a_node_cannot_take_is_refused():
    twelve = MODEL.model_copy(update={"num_heads": 12, "num_kv_heads": 12, "head_dim": 128})
    with pytest.raises(InvalidPlanError, match=r"^--tp 8 does not split m's 12 heads \(12 key/value heads\); fix: use a --tp that "
                                               r"divides 12 and divides or is a multiple of 12$"):
        _space(LayoutPins(tp=8), model=twelve)
    with pytest.raises(InvalidPlanError, match=r"^--tp 16 spans nodes: .* node of 8 devices; fix: use --tp 8 or less"):
        _space(LayoutPins(tp=16), n_devices=16)


def test_serving_takes_degree_pins_and_refuses_training_knobs():
    assert serving_splits(None, LayoutPins(), n_devices=8, where="8 devices", workload="decode") is None
    splits = serving_splits(None, LayoutPins(tp=4), n_devices=8, where="8 devices", workload="decode")
    assert splits and all(s[1] == 4 for s in splits) and set(splits) <= set(degree_splits(8))
    with pytest.raises(UnsupportedError, match=r"^--zero 1: a decode plan's layout search chooses only dp, tp and pp; "
                                               r"fix: drop --zero 1 \(serving honours --dp, --tp and --pp\)$"):
        serving_splits(None, LayoutPins(zero_stage=1), n_devices=8, where="8 devices", workload="decode")


def test_nothing_fitting_under_pins_names_the_pin_to_drop_and_the_best_unpinned_layout():
    train = TrainConfig(seq_len=2048, global_batch=64)
    unpinned = SearchSpace(splits=((8, 1, 1, 1),), lowered_only=True)
    pins = LayoutPins(zero_stage=0, micro_batch=2)
    space = pinned_space(LLAMA3_8B, train, unpinned, pins, n_devices=8, where="mesh data=8", devices_per_node=8)
    with pytest.raises(NothingFitsError) as raised:
        grid_search(LLAMA3_8B, train, HW, n_devices=8, space=space)
    err = pinned_failure(raised.value, LLAMA3_8B, train, HW, n_devices=8, unpinned=unpinned, pins=pins, where="mesh data=8",
                         time_limit_s=20)
    text = str(err)
    assert isinstance(err, NothingFitsError) and "\n" not in text
    assert text.startswith("llama3-8b under --micro-batch 2 --zero 0 does not fit on 8× a100-80gb: every pinned layout needs more "
                           "than the 76.0 GiB (80.0 usable − 4.0 reserved) per device; closest: dp8 tp1 pp1 mb2 ")
    # Releasing the ZeRO stage alone lets a layout fit; releasing the micro-batch alone does not (ZeRO 0 state is 120 GiB).
    assert "fix: drop --zero 0 (dp8 tp1 pp1 mb2 " in text and "drop --micro-batch" not in text
    assert "; without pins the best layout is dp8 tp1 pp1 mb" in text


def test_pinned_failure_passes_through_unpinned_errors_and_time_limits():
    err = InfeasibleError("no layout", fix="more devices")
    kwargs = {"n_devices": 8, "unpinned": SearchSpace(), "where": "8 devices", "time_limit_s": 1.0}
    assert pinned_failure(err, MODEL, TRAIN, HW, pins=LayoutPins(), **kwargs) is err
    limit = TimeLimitError("ran out", fix="raise --time-limit-s")
    assert pinned_failure(limit, MODEL, TRAIN, HW, pins=LayoutPins(tp=2), **kwargs) is limit
    named = pinned_failure(err, MODEL, TRAIN, HW, pins=LayoutPins(tp=2), **kwargs)
    assert str(named) == "no layout (pinned: --tp 2); fix: relax --tp 2, or more devices"


def test_pinned_70b_on_32_devices_plans_well_under_a_second():
    llama70 = ModelConfig(name="llama3-70b", hidden_size=8192, num_layers=80, num_heads=64, num_kv_heads=8, ffn_size=28672,
                          vocab_size=128256)
    train, h100 = TrainConfig(seq_len=2048, global_batch=512), load_machine("h100-sxm")
    start = time.perf_counter()
    space = pinned_space(llama70, train, SearchSpace(lowered_only=True, offload_when_nothing_fits=True), LayoutPins(tp=8, zero_stage=1),
                         n_devices=32, where="32 devices", devices_per_node=8)
    best = grid_search(llama70, train, h100, n_devices=32, space=space).best
    assert time.perf_counter() - start < 1.0
    assert (best.layout.tp, best.layout.zero_stage, best.layout.offload) == (8, 1, Offload.NONE)


def test_an_expert_pin_fixes_the_degree_and_is_refused_where_no_expert_axis_or_expert_carries_it():
    moe = MODEL.model_copy(update={"num_experts": 8, "experts_per_token": 2})
    space = pinned_space(moe, TRAIN, SearchSpace(), LayoutPins(ep=4), n_devices=8, where="8 devices", devices_per_node=8)
    assert space.expert_degrees == (4,)
    with pytest.raises(InvalidPlanError, match="has no experts"):
        pinned_space(MODEL, TRAIN, SearchSpace(), LayoutPins(ep=2), n_devices=8, where="8 devices", devices_per_node=8)
    with pytest.raises(InvalidPlanError, match="does not split"):
        pinned_space(moe, TRAIN, SearchSpace(), LayoutPins(ep=3), n_devices=8, where="8 devices", devices_per_node=8)
    with pytest.raises(InvalidPlanError, match="expert axes of 2"):
        pinned_space(moe, TRAIN, SearchSpace(expert_degrees=(2,)), LayoutPins(ep=4), n_devices=8, where="mesh", devices_per_node=8)
