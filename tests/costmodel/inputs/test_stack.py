"""Tests `costmodel/inputs/stack.py`: presets are cited and distinct, overrides change one fact, options apply."""

import pytest

from costmodel.errors import InvalidConfigError
from costmodel.hardware.machine import load_machine
from costmodel.inputs.layout import Layout, Recompute, stack_recompute
from costmodel.inputs.model_config import ModelConfig
from costmodel.inputs.stack import FACTS, STACKS, SoftwareStack, TpOverlap, apply_options, get_stack, stack_with
from costmodel.inputs.train_config import TrainConfig
from costmodel.step.simulator import simulate

REQUIRED = ("jax", "maxtext", "megatron-lm-2021", "megatron-lm-2022", "megatron-core", "deepspeed", "megatron-deepspeed",
            "pytorch-fsdp1", "torchtitan", "torchtitan-compile")


def test_every_preset_the_issue_names_exists_and_cites_its_code():
    assert set(REQUIRED) <= set(STACKS)
    for name, stack in STACKS.items():
        assert stack.name == name and "@" in stack.citation or name == "jax", name


def test_presets_differ_from_each_other():
    facts = {name: tuple(getattr(s, k) for k in FACTS) for name, s in STACKS.items()}
    assert len(set(facts.values())) == len(facts)


def test_every_field_but_the_presets_name_and_citation_is_a_described_fact():
    assert FACTS == tuple(k for k in SoftwareStack.model_fields if k not in ("name", "citation"))
    for fact in FACTS:  # each description is also the help of the fact's `plan` flag
        description = SoftwareStack.model_fields[fact].description
        assert description and len(description) > 40 and description.endswith("."), fact


def test_megatron_eras_add_overlap_step_by_step():
    assert [STACKS[n].tp_overlap for n in ("megatron-lm-2021", "megatron-lm-2022", "megatron-core")] == [
        TpOverlap.NONE, TpOverlap.BACKWARD, TpOverlap.GEMM]
    assert not STACKS["megatron-lm-2021"].fused_grad_accumulation and STACKS["megatron-lm-2022"].fused_grad_accumulation


def test_override_changes_one_fact_and_renames():
    custom = stack_with("megatron-core", tp_overlap="none")
    assert custom.name == "custom" and custom.tp_overlap is TpOverlap.NONE
    assert custom.model_dump(exclude={"name", "tp_overlap"}) == STACKS["megatron-core"].model_dump(exclude={"name", "tp_overlap"})
    assert stack_with("megatron-core", tp_overlap="gemm") is STACKS["megatron-core"]  # the preset's own value changes nothing


def test_none_is_a_value_not_an_unset_flag():
    dropless = stack_with("jax", moe_capacity_factor=None)
    assert dropless.moe_capacity_factor is None and STACKS["jax"].moe_capacity_factor == 1.25 and dropless.name == "custom"
    with pytest.raises(InvalidConfigError, match="stack 'jax'"):
        stack_with("jax", no_such_fact=None)


def test_bad_names_and_values_say_what_to_use():
    with pytest.raises(InvalidConfigError, match="unknown software stack 'megatron'"):
        get_stack("megatron")
    with pytest.raises(InvalidConfigError, match="stack 'jax'"):
        stack_with("jax", tp_overlap="sometimes")
    with pytest.raises(InvalidConfigError, match="unknown stack option 'turbo'; fix: use one of: fused_rmsnorm"):
        apply_options(STACKS["torchtitan"], "fused_rmsnorm;turbo")
    with pytest.raises(InvalidConfigError, match="unknown stack option 'fused_rms_norm'; fix: did you mean 'fused_rmsnorm'?"):
        apply_options(STACKS["torchtitan"], "fused_rms_norm")
    with pytest.raises(InvalidConfigError, match="unknown software stack 'deepsped'; fix: did you mean 'deepspeed'"):
        get_stack("deepsped")


def test_options_apply_over_the_preset():
    assert not STACKS["torchtitan"].fused_norm and apply_options(STACKS["torchtitan"], "fused_rmsnorm").fused_norm
    assert apply_options(STACKS["torchtitan"], "") is STACKS["torchtitan"]


def test_selective_means_the_frameworks_own_selective_recompute():
    assert stack_recompute("selective", STACKS["megatron-lm-2022"]) is Recompute.SELECTIVE
    assert stack_recompute("selective", STACKS["torchtitan"]) is Recompute.SELECTIVE_OP
    assert stack_recompute("selective-layer", STACKS["torchtitan"]) is Recompute.SELECTIVE_LAYER


def test_stack_round_trips_through_json():
    for stack in STACKS.values():
        assert SoftwareStack.model_validate_json(stack.model_dump_json()) == stack


def test_torchtune_runs_fsdp2_as_torchtitan_with_the_loss_in_eight_pieces():
    tune, titan = STACKS["torchtune"], STACKS["torchtitan"]
    assert tune.cross_entropy_chunks == 8 and tune.fsdp_copy_out == titan.fsdp_copy_out and "torchtune" in tune.citation
    model = ModelConfig(name="m", hidden_size=2048, num_layers=8, num_heads=16, ffn_size=8192, vocab_size=128256)
    train, hw = TrainConfig(seq_len=4096, global_batch=8, workload="finetune-full"), load_machine("h100-sxm")
    mem = {s: simulate(model, train, Layout(dp=8, zero_stage=3, recompute="full", stack=STACKS[s]), hw).memory.temporary_bytes
           for s in ("torchtune", "torchtitan")}
    assert mem["torchtune"] < mem["torchtitan"]  # one piece's fp32 logits, not the whole sequence's
