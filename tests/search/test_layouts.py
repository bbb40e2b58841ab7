"""Tests `search/layouts.py`: candidate generation, pruning, the exhaustive optimum."""

import math
import re
from collections import Counter

import pytest

from costmodel.errors import InfeasibleError
from costmodel.hardware.machine import load_machine
from costmodel.inputs.layout import Layout, Offload, Recompute
from costmodel.inputs.model_config import ModelConfig
from costmodel.inputs.stack import stack_with
from costmodel.inputs.train_config import TrainConfig
from costmodel.step.simulator import simulate
from search.layouts import (
    EXPERT_LOWERING_RULE,
    INTRA_OP_PIPELINE_RULE,
    LOSS_PIECES,
    PIPELINE_MOE_TP_RULE,
    PIPELINE_ZERO3_TP_RULE,
    SP_PIPELINE_RULE,
    SP_TP_RULE,
    TIME_LIMIT_RULE,
    UNEVEN_RULE,
    ZERO_WIDTH_RULE,
    NothingFitsError,
    SearchSpace,
    candidate_layouts,
    degree_splits,
    divisors,
    grid_search,
)

MODEL = ModelConfig(name="m", hidden_size=2048, num_layers=16, num_heads=16, num_kv_heads=4, ffn_size=5632, vocab_size=32000)
TRAIN = TrainConfig(seq_len=2048, global_batch=64)
HW = load_machine("a100-80gb")


def test_degree_splits_cover_every_factorisation_once():
    splits = list(degree_splits(24, max_cp=2))
    assert all(math.prod(s) == 24 for s in splits) and len(splits) == len(set(splits))
    assert splits == sorted(splits) and (2, 4, 3, 1) in splits and (3, 2, 2, 2) in splits


def test_search_is_deterministic_and_returns_the_fastest_fitting_layout():
    space = SearchSpace(micro_batches=(1, 2), recompute=(Recompute.NONE, Recompute.FULL), zero_stages=(0, 1))
    a = grid_search(MODEL, TRAIN, HW, n_devices=8, space=space)
    b = grid_search(MODEL, TRAIN, HW, n_devices=8, space=space)
    assert a == b
    for other in a.runners_up:
        assert other.step_time_s >= a.best.step_time_s and other.fits
    assert simulate(MODEL, TRAIN, a.best.layout, HW).step_time_s == a.best.step_time_s
    assert a.pruned["ZeRO without data parallelism"] > 0


def test_fixed_splits_restrict_the_degrees():
    result = grid_search(MODEL, TRAIN, HW, n_devices=8, space=SearchSpace(splits=((2, 4, 1, 1),)))
    assert (result.best.layout.dp, result.best.layout.tp) == (2, 4)


def test_infeasible_reports_the_closest_layouts_with_numbers():
    huge = MODEL.model_copy(update={"num_layers": 400, "hidden_size": 8192, "num_heads": 64, "ffn_size": 28672})
    with pytest.raises(InfeasibleError, match=r"needs more than the 76.0 GiB \(80.0 usable − 4.0 reserved\) per device; "
                                                r"closest: .*; fix: use about \d+ devices") as err:
        grid_search(huge, TRAIN, HW, n_devices=2)
    needs = [float(x) for x in re.findall(r"needs ([\d.]+) GiB \(params\+grads\+optimizer [\d.]+, activations", str(err.value))]
    splits = re.findall(r"(dp\d+ tp\d+ pp\d+) mb", str(err.value))
    assert len(needs) == 3 and needs == sorted(needs) and min(needs) > 80 and len(set(splits)) == 3


def test_divisors_in_order():
    assert divisors(1) == [1] and divisors(36) == [1, 2, 3, 4, 6, 9, 12, 18, 36] and divisors(97) == [1, 97]
    assert divisors(2**24)[-2:] == [2**23, 2**24]


def test_time_limit_stops_the_search_and_keeps_the_best_so_far(monkeypatch):
    full = grid_search(MODEL, TRAIN, HW, n_devices=8)
    ticks = iter(range(10**9))  # a clock that advances one second per reading
    monkeypatch.setattr("search.layouts.time.perf_counter", lambda: float(next(ticks)))
    seen = []
    cut = grid_search(MODEL, TRAIN, HW, n_devices=8, time_limit_s=30, on_progress=lambda done, total: seen.append((done, total)))
    assert full.complete and not cut.complete and cut.evaluated < full.evaluated
    assert cut.best.fits and cut.best.step_time_s >= full.best.step_time_s
    total = seen[0][1]
    assert [d for d, _ in seen] == sorted(d for d, _ in seen) and seen[-1][0] <= total - cut.pruned[TIME_LIMIT_RULE]


def test_no_consistent_layout_names_the_rules():
    odd = MODEL.model_copy(update={"num_heads": 7, "num_kv_heads": 7, "head_dim": 128, "num_layers": 1})
    with pytest.raises(InfeasibleError, match="no layout .* is consistent"):
        grid_search(odd, TrainConfig(seq_len=2048, global_batch=3), HW, n_devices=2)


def test_lowered_only_drops_what_the_validator_does_not_lower_as_planned():
    moe = MODEL.model_copy(update={"num_experts": 4, "experts_per_token": 2})
    space = SearchSpace(splits=((2, 2, 2, 1), (4, 2, 1, 1)), lowered_only=True)
    for model, rule in ((MODEL, PIPELINE_ZERO3_TP_RULE), (moe, PIPELINE_MOE_TP_RULE)):
        pruned: Counter[str] = Counter()
        layouts = list(candidate_layouts(model, TRAIN, 8, space, pruned, devices_per_node=8))
        piped = [lay for lay in layouts if lay.pp > 1]
        assert pruned[rule] > 0 and layouts
        assert all(not lay.sequence_parallel and model.num_layers % (lay.pp * lay.interleave) == 0 for lay in piped)
        if not model.is_moe:  # 16 layers: 2 stages × 3 chunks do not divide, 2 × 2 and 2 × 4 do
            assert {lay.interleave for lay in piped} == {1, 2, 4} and pruned[UNEVEN_RULE] > 0
        assert all(lay.zero_stage < 3 and not model.is_moe for lay in piped)
    every = list(candidate_layouts(MODEL, TRAIN, 8, space.model_copy(update={"lowered_only": False}), Counter(), devices_per_node=8))
    assert any(lay.pp > 1 and lay.zero_stage == 3 for lay in every)


def test_intra_op_planners_get_no_pipelined_layouts():
    space = SearchSpace(splits=((2, 2, 2, 1), (4, 2, 1, 1)), lowered_only=True, intra_op=True)
    pruned: Counter[str] = Counter()
    layouts = list(candidate_layouts(MODEL, TRAIN, 8, space, pruned, devices_per_node=8))
    assert layouts and all(lay.pp == 1 for lay in layouts) and pruned[INTRA_OP_PIPELINE_RULE] > 0
    grid = list(candidate_layouts(MODEL, TRAIN, 8, space.model_copy(update={"intra_op": False}), Counter(), devices_per_node=8))
    assert any(lay.pp > 1 for lay in grid)


def test_sequence_parallelism_is_where_tp_allows_unless_the_space_pins_it():
    space = SearchSpace(splits=((2, 2, 2, 1), (4, 2, 1, 1), (8, 1, 1, 1)), lowered_only=True)
    default = list(candidate_layouts(MODEL, TRAIN, 8, space, Counter(), devices_per_node=8))
    assert all(lay.sequence_parallel == (lay.tp > 1 and lay.pp == 1) for lay in default)
    off = list(candidate_layouts(MODEL, TRAIN, 8, space.model_copy(update={"sequence_parallel": False}), Counter(), devices_per_node=8))
    assert len(off) == len(default) and not any(lay.sequence_parallel for lay in off)
    pruned: Counter[str] = Counter()
    on = list(candidate_layouts(MODEL, TRAIN, 8, space.model_copy(update={"sequence_parallel": True}), pruned, devices_per_node=8))
    assert on and all(lay.sequence_parallel for lay in on) and pruned[SP_TP_RULE] > 0 and pruned[SP_PIPELINE_RULE] > 0


LLAMA3_8B = ModelConfig(name="llama3-8b", hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=8, ffn_size=14336,
                        vocab_size=128256)


def test_offload_only_when_nothing_fits_without_and_the_result_says_why():
    a100_40, train = load_machine("a100-40gb"), TrainConfig(seq_len=2048, global_batch=8)
    space = SearchSpace(micro_batches=(1, 2), recompute=(Recompute.FULL,), offload_when_nothing_fits=True)
    with pytest.raises(InfeasibleError, match="does not fit on 1× a100-40gb"):
        grid_search(LLAMA3_8B, train, a100_40, n_devices=1, space=space.model_copy(update={"offload_when_nothing_fits": False}))
    result = grid_search(LLAMA3_8B, train, a100_40, n_devices=1, space=space)
    assert result.best.layout.offload is Offload.OPTIMIZER and result.best.fits
    assert result.offload_reason == "nothing fits in 37.0 GiB per device (usable less the runtime reserve) without offloading"
    fits_anyway = grid_search(MODEL, TRAIN, HW, n_devices=8, space=space)
    assert fits_anyway.best.layout.offload is Offload.NONE and fits_anyway.offload_reason is None


def test_the_loss_goes_into_pieces_only_when_nothing_fits_whole_and_before_offloading():
    h100 = load_machine("h100-sxm")
    train = TrainConfig(seq_len=4096, global_batch=4).with_optimizer_state("bf16")
    space = SearchSpace(micro_batches=(1, 2, 4), recompute=(Recompute.FULL,), offload_when_nothing_fits=True,
                        loss_pieces_when_nothing_fits=True, lowered_only=True)
    result = grid_search(LLAMA3_8B, train, h100, n_devices=1, space=space)
    assert result.best.layout.stack.cross_entropy_chunks == LOSS_PIECES and result.best.fits
    assert result.best.layout.offload is Offload.NONE and result.offload_reason is None
    assert result.loss_pieces_reason.endswith("with the loss over whole sequences")
    fits_anyway = grid_search(MODEL, TRAIN, HW, n_devices=8, space=space)
    assert fits_anyway.best.layout.stack.cross_entropy_chunks == 1 and fits_anyway.loss_pieces_reason is None


def test_the_loss_in_pieces_goes_into_pipelines_too():
    pieces = SearchSpace(stack=Layout(stack=stack_with("jax", cross_entropy_chunks=8)), lowered_only=True)
    layouts = list(candidate_layouts(MODEL, TRAIN, n_devices=8, space=pieces, pruned=Counter(), devices_per_node=8))
    assert any(lay.pp > 1 for lay in layouts)


def test_a_fine_tuning_run_that_fits_nowhere_offloads_its_parameter_shards_and_says_why():
    # Llama 2 70B QLoRA on two 24 GB cards (Answer.AI's fsdp_qlora workstation): the nf4 weights alone are 17 GiB a card.
    llama2_70b = LLAMA3_8B.model_copy(update={"name": "llama2-70b", "hidden_size": 8192, "num_layers": 80, "num_heads": 64,
                                              "ffn_size": 28672, "vocab_size": 32000})
    qlora = TrainConfig(seq_len=2048, global_batch=4, workload={"kind": "finetune-lora", "lora": {"frozen_dtype": "nf4-dq"}})
    space = SearchSpace(splits=((2, 1, 1, 1),), micro_batches=(1, 2), recompute=(Recompute.FULL,), offload_when_nothing_fits=True,
                        stack=Layout(stack=stack_with("pytorch-fsdp1")))  # FSDP alone, as the workstation ran it
    # The saved activations go to the host first: with them there, the ZeRO-3 shards fit (21.3 GiB a card).
    first = grid_search(llama2_70b, qlora, load_machine("rtx-4090"), n_devices=2, space=space)
    assert first.best.layout.offload_activations and first.best.layout.offload is Offload.NONE and first.best.fits
    assert first.offload_reason.endswith("without offloading")
    # At 4096 tokens a sequence and rank 64 that is not enough: the parameters go to the host.
    qlora = TrainConfig(seq_len=4096, global_batch=4, workload={"kind": "finetune-lora", "lora": {"frozen_dtype": "nf4-dq", "rank": 64}})
    result = grid_search(llama2_70b, qlora, load_machine("rtx-4090"), n_devices=2, space=space)
    best = result.best
    assert best.layout.offload is Offload.PARAMS and best.layout.zero_stage == 3 and best.fits
    assert best.memory.params_bytes == 0 and best.memory.host.frozen_weights_bytes > 15 * 2**30
    assert result.offload_reason.endswith("without offloading")
    # Kept out of ZeRO 3 (a pin), the parameters cannot go to the host: the answer is that nothing fits.
    with pytest.raises(NothingFitsError):
        grid_search(llama2_70b, qlora, load_machine("rtx-4090"), n_devices=2, space=space.model_copy(update={"zero_stages": (1,)}))


def test_no_offload_where_the_cluster_describes_no_host():
    a40 = load_machine("a40")
    space = SearchSpace(micro_batches=(1,), recompute=(Recompute.FULL,), offload_when_nothing_fits=True)
    with pytest.raises(InfeasibleError, match="does not fit"):
        grid_search(LLAMA3_8B, TrainConfig(seq_len=2048, global_batch=8), a40, n_devices=1, space=space)


def test_when_offloading_does_not_fit_either_the_answer_says_what_the_host_lacks():
    a100_40 = load_machine("a100-40gb")
    small_host = a100_40.model_copy(update={"host": a100_40.host.model_copy(update={"memory_bytes_per_node": 64 * 2**30})})
    space = SearchSpace(micro_batches=(1,), recompute=(Recompute.FULL,), offload_when_nothing_fits=True)
    with pytest.raises(InfeasibleError) as err:
        grid_search(LLAMA3_8B, TrainConfig(seq_len=2048, global_batch=8), small_host, n_devices=1, space=space)
    assert isinstance(err.value, NothingFitsError) and err.value.closest[0].layout.offload is Offload.OPTIMIZER
    offloaded = err.value.cause.split("; offloading the optimizer state, closest: ")[1]
    assert re.fullmatch(r"dp1 tp1 pp1 mb1 full recompute ZeRO 0 needs [\d.]+ GiB \(.*\) and 1\d\d\.\d GiB of host against its 64",
                        offloaded)


def test_expert_parallelism_is_searched_for_moe_models_only_and_kept_out_of_pipelines():
    moe = MODEL.model_copy(update={"num_experts": 4, "experts_per_token": 2})
    space = SearchSpace(splits=((8, 1, 1, 1), (4, 1, 2, 1)), lowered_only=True)
    pruned: Counter[str] = Counter()
    layouts = list(candidate_layouts(moe, TRAIN, 8, space, pruned, devices_per_node=8))
    assert {lay.ep for lay in layouts if lay.pp == 1} == {1, 2, 4} and all(lay.ep == 1 for lay in layouts if lay.pp > 1)
    assert pruned[EXPERT_LOWERING_RULE] > 0
    assert {lay.ep for lay in candidate_layouts(MODEL, TRAIN, 8, space, Counter(), devices_per_node=8)} == {1}
    fixed = space.model_copy(update={"expert_degrees": (2,)})  # a mesh's expert axis fixes the degree
    assert {lay.ep for lay in candidate_layouts(moe, TRAIN, 8, fixed, Counter(), devices_per_node=8)} == {2}


def test_zero_needs_a_data_parallel_degree_the_model_width_divides_where_only_lowered_layouts_go():
    # 2048 wide on 24 data-parallel devices: no weight dimension takes ZeRO's shards, so the validator would keep them whole.
    space = SearchSpace(splits=((24, 1, 1, 1),), lowered_only=True)
    pruned: Counter[str] = Counter()
    layouts = list(candidate_layouts(MODEL, TrainConfig(seq_len=2048, global_batch=48), 24, space, pruned, devices_per_node=8))
    assert layouts and all(lay.zero_stage == 0 for lay in layouts) and pruned[ZERO_WIDTH_RULE] > 0
