"""Golden tests of the error catalog (docs/commands.md, "Exit codes"): every user-facing failure of the
``plan`` CLI prints exactly one line, ``plan: error: <cause>; fix: <fix>``, on stderr, exits
with its documented code, prints nothing on stdout and shows no traceback.

Each case runs the real CLI (`planner.cli.main`); ``{tmp}`` in a golden line stands for the
test's temporary directory. A message changed on purpose is changed here too.
"""

import json
import re
from pathlib import Path

import pytest

from costmodel.errors import InvalidConfigError
from planner.cli.main import main

TINY = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "vocab_size": 100}
LLAMA3_8B = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
             "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 8192}
FILES = {
    "bad.json": "{oops",
    "list.json": "[1, 2]",
    "native_extra.json": json.dumps({"name": "x", "num_layers": 2, "hidden_size": 64, "num_heads": 4, "ffn_size": 128,
                                     "vocab_size": 100, "bogus": 1}),
    "falcon.json": json.dumps({"model_type": "falcon"}),
    "no_type.json": json.dumps({"d_model": 64}),
    "missing_key.json": json.dumps({k: v for k, v in TINY.items() if k != "hidden_size"}),
    "heads.json": json.dumps(TINY | {"num_attention_heads": 3}),
    "kv_heads.json": json.dumps(TINY | {"num_key_value_heads": 3}),
    "negative.json": json.dumps(TINY | {"num_hidden_layers": -2}),
    "hidden_bool.json": json.dumps(TINY | {"hidden_size": True}),
    "new\nline.json": json.dumps(TINY | {"hidden_size": True}),
    "newline_key.json": json.dumps({"\n": 0}),
    "hidden_str.json": json.dumps(TINY | {"hidden_size": "4096"}),
    "bias_str.json": json.dumps(TINY | {"attention_bias": "false"}),
    "nested.json": "[" * 100_000 + "]" * 100_000,
    "huge.json": json.dumps(TINY | {"padding": "x" * 5 * 2**20}),
    "digits.json": '{"hidden_size": ' + "9" * 5000 + "}",
    "billion_layers.json": json.dumps(LLAMA3_8B | {"num_hidden_layers": 1_000_000_000}),
    "wide.json": json.dumps(TINY | {"hidden_size": 2**62}),
}
NATIVE_FIELDS = ("name, hidden_size, num_layers, num_heads, num_kv_heads, head_dim, ffn_size, vocab_size, vocab_multiple, "
                 "max_position_embeddings, norm, norm_eps, mlp, positions, rope_theta, tie_embeddings, qkv_bias, out_bias, mlp_bias, "
                 "num_experts, experts_per_token, moe_ffn_size, shared_expert_ffn_size, rope_scaling, sliding_window")
PRESETS = ("gpt2, gpt2-large, gpt2-medium, gpt2-xl, llama-65b, llama2-13b, llama2-70b, llama2-7b, llama3-405b, llama3-70b, llama3-8b, "
           "llama3.2-1b, megatron-gpt-1.7b, megatron-gpt-1008b, megatron-gpt-145.6b, megatron-gpt-175b, megatron-gpt-18.4b, "
           "megatron-gpt-1t, "
           "megatron-gpt-22b, megatron-gpt-3.6b, megatron-gpt-310.1b, megatron-gpt-39.1b, megatron-gpt-529.6b, megatron-gpt-530b, "
           "megatron-gpt-7.5b, megatron-gpt-76.1b, mixtral-8x7b")
HARDWARE = ("a100-40gb, a100-80gb, a100-pcie-server, a10g, a40, alvis-a100, alvis-a100fat, alvis-a40, alvis-t4, alvis-v100, b200, "
            "cpu, dgx-a100, dgx-b200, dgx-h100, gb200, gb200-nvl72, h100-95gb-hbm2e-lowtdp, h100-96gb-hbm2e-500w, "
            "h100-sxm, h200, l4, l40s, mi300x, mi325x, rtx-4090, rtx-a6000, t4, tpu-v4, tpu-v4-pod, tpu-v5e, tpu-v5p, tpu-v5p-pod, "
            "tpu-v6e, v100")
MESH_FIX = "e.g. --mesh 8x4 or --mesh data=8,tensor=4"

# (catalog entry, argv, exit code, golden stderr line)
CATALOG = [
    # files
    ("file missing", ["--model", "{tmp}/missing.json", "--mesh", "2"], 2,
     "cannot read model file '{tmp}/missing.json': it does not exist; fix: check the path"),
    ("file is a directory", ["--model", "{tmp}", "--mesh", "2"], 2,
     "cannot read model file '{tmp}': it is a directory; fix: give the path of a JSON file"),
    ("file not text", ["--model", "{tmp}/binary.json", "--mesh", "2"], 2,
     "cannot read model file '{tmp}/binary.json': 'utf-8' codec can't decode byte 0xff in position 0: invalid start byte; "
     "fix: check the file and its permissions"),
    ("malformed JSON", ["--model", "{tmp}/bad.json", "--mesh", "2"], 2,
     "'{tmp}/bad.json' is not valid JSON (line 1, column 2: Expecting property name enclosed in double quotes); "
     "fix: fix the JSON syntax"),
    ("JSON not an object", ["--model", "{tmp}/list.json", "--mesh", "2"], 2,
     "'{tmp}/list.json' holds a JSON list, not an object; fix: give a config object"),
    # model configs
    ("unknown field", ["--model", "{tmp}/native_extra.json", "--mesh", "2"], 2,
     f"native_extra: unknown field 'bogus'; fix: remove it; the known fields are {NATIVE_FIELDS}"),
    ("unknown architecture", ["--model", "{tmp}/falcon.json", "--mesh", "2"], 2,
     "unknown architecture model_type='falcon'; fix: use one of: gpt2, llama, mistral, qwen2, qwen3, mixtral, qwen2_moe, qwen3_moe"),
    ("architecture not recognisable", ["--model", "{tmp}/no_type.json", "--mesh", "2"], 2,
     "cannot tell the architecture: no model_type and no known size keys; "
     "fix: add \"model_type\" (e.g. \"llama\" or \"gpt2\") or use a preset"),
    ("required field missing", ["--model", "{tmp}/missing_key.json", "--mesh", "2"], 2,
     "config is missing 'hidden_size'; fix: add 'hidden_size' to the config"),
    ("heads do not divide hidden size", ["--model", "{tmp}/heads.json", "--mesh", "2"], 2,
     "num_attention_heads=3 does not divide hidden_size=64; fix: use a head count that divides hidden_size, or give head_dim explicitly"),
    ("kv heads do not divide heads", ["--model", "{tmp}/kv_heads.json", "--mesh", "2"], 2,
     "num_key_value_heads=3 does not divide num_attention_heads=4; fix: use a key/value head count that divides the query head count"),
    ("dimension not positive", ["--model", "{tmp}/negative.json", "--mesh", "2"], 2,
     "negative: num_hidden_layers: Input should be greater than 0 (got -2); fix: correct 'num_hidden_layers' in the model config"),
    ("boolean for a size", ["--model", "{tmp}/hidden_bool.json", "--mesh", "2"], 2,
     "hidden_bool: hidden_size: Input should be a valid integer (got True); fix: write 'hidden_size' as a JSON number (not true/false)"),
    ("string for a size", ["--model", "{tmp}/hidden_str.json", "--mesh", "2"], 2,
     "hidden_str: hidden_size: Input should be a valid integer (got '4096'); fix: write 'hidden_size' as a JSON number (no quotes)"),
    ("string for a boolean", ["--model", "{tmp}/bias_str.json", "--mesh", "2"], 2,
     "bias_str: attention_bias: Input should be a valid boolean (got 'false'); fix: correct 'attention_bias' in the model config"),
    ("deeply nested brackets", ["--model", "{tmp}/nested.json", "--mesh", "2"], 2,
     "model file '{tmp}/nested.json' nests brackets 100000 deep, more than 64; fix: give the model file itself; no valid one nests "
     "that deep"),
    ("plan file nested deep", ["validate", "{tmp}/nested.json"], 2,
     "plan file '{tmp}/nested.json' nests brackets 100000 deep, more than 64; fix: give the plan file itself; no valid one nests "
     "that deep"),
    ("hardware profile nested deep", ["simulate", "--model", "gpt2", "--hardware", "{tmp}/nested.json", "--devices", "2",
                                      "--global-batch", "8"], 2,
     "hardware profile '{tmp}/nested.json' nests brackets 100000 deep, more than 64; fix: give the hardware profile itself; no "
     "valid one nests that deep"),
    ("hardware profile with a newline in a key", ["simulate", "--model", "gpt2", "--hardware", "{tmp}/newline_key.json",
                                                  "--devices", "2", "--global-batch", "8"], 2,
     "{tmp}/newline_key.json: '\\n': Extra inputs are not permitted; fix: see docs/clusters.md 'Describing a cluster' "
     "(costmodel.hardware.profile.ClusterSpec)"),
    ("file name with a newline", ["--model", "{tmp}/new\nline.json", "--mesh", "2"], 2,
     "new\\nline: hidden_size: Input should be a valid integer (got True); fix: write 'hidden_size' as a JSON number (not true/false)"),
    ("file too large", ["--model", "{tmp}/huge.json", "--mesh", "2"], 2,
     "model file '{tmp}/huge.json' is larger than 4 MiB; fix: give the model file itself (a few kilobytes of JSON)"),
    ("integer too long for Python", ["--model", "{tmp}/digits.json", "--mesh", "2"], 2,
     "'{tmp}/digits.json' is not valid JSON (Exceeds the limit (4300 digits) for integer string conversion: value has 5000 digits; "
     "use sys.set_int_max_str_digits() to increase the limit); fix: fix the number in the config"),
    ("size no cluster could hold", ["--model", "{tmp}/billion_layers.json", "--mesh", "8x4"], 4,
     "billion_layers cannot fit on any cluster: its 2.18e+17 parameters' weights, gradients and optimizer state alone need 194 GiB "
     "per device even spread over 16,777,216 devices, more than the 75.7 GiB one h100-sxm leaves a plan; fix: check num_hidden_layers "
     "and the other sizes in the model config"),
    ("dimension beyond any accelerator", ["--model", "{tmp}/wide.json", "--mesh", "2"], 2,
     "wide: hidden_size: Input should be less than or equal to 2147483648 (got 4611686018427387904); "
     "fix: correct 'hidden_size' in the model config"),
    # names
    ("unknown preset", ["--model", "llama9", "--mesh", "2"], 2,
     f"unknown model 'llama9'; fix: did you mean 'llama3-8b', 'llama2-7b', 'llama-65b'? Otherwise use a config.json path "
     f"or one of: {PRESETS}"),
    ("unknown hardware", ["--model", "gpt2", "--mesh", "2", "--hardware", "h900"], 2,
     f"unknown hardware 'h900'; fix: did you mean 'h200'? Otherwise use a profile JSON path or one of: {HARDWARE}"),
    ("site with several node types", ["--model", "gpt2", "--mesh", "2", "--hardware", "alvis"], 2,
     "hardware 'alvis' has several node types; fix: name one: alvis-a100, alvis-a100fat, alvis-a40, alvis-t4, alvis-v100"),
    ("unknown planner", ["--model", "gpt2", "--mesh", "2", "--planner", "milp"], 2,
     "unknown planner 'milp'; fix: use one of grid, ilp, anneal, beam, random"),
    # flags
    ("usage error", ["--model", "gpt2", "--mesh", "2", "--format", "yaml"], 2,
     "argument --format: invalid choice: 'yaml' (choose from 'summary', 'json', 'specs', 'maxtext', 'megatron', 'deepspeed', "
     "'torchtitan', 'flax', 'markdown', 'html'); fix: see `plan layout --help`"),
    ("bad flag value", ["--model", "gpt2", "--mesh", "2", "--global-batch", "0"], 2,
     "argument --global-batch: '0' is not a positive whole number; fix: give a whole number of at least 1, e.g. 8"),
    ("sequence too long", ["--model", "gpt2", "--mesh", "2", "--seq-len", "4096"], 2,
     "seq_len=4096 exceeds gpt2's 1024 positions (max_position_embeddings); fix: use --seq-len 1024 or less"),
    ("time limit not positive", ["--model", "gpt2", "--mesh", "2", "--time-limit-s", "0"], 2,
     "argument --time-limit-s: '0' is not a finite positive number; fix: give a number above 0, e.g. 0.5 or 15e12"),
    ("output exists", ["--model", "gpt2", "--mesh", "2", "--out", "{tmp}/mine.json"], 2,
     "{tmp}/mine.json already exists; fix: choose another --out or add --force"),
    ("output is a directory", ["--model", "gpt2", "--mesh", "2", "--out", "{tmp}", "--force"], 2,
     "{tmp} is a directory; fix: give --out a file name, e.g. plan.json"),
    ("output directory missing", ["--model", "gpt2", "--mesh", "2", "--out", "{tmp}/no/plan.json"], 2,
     "cannot write {tmp}/no/plan.json: directory {tmp}/no does not exist; fix: create it or choose another --out"),
    # meshes and device counts
    ("malformed mesh", ["--model", "gpt2", "--mesh", "8y4"], 2, f"mesh '8y4': '8y4' is not a positive axis size; fix: {MESH_FIX}"),
    ("empty mesh", ["--model", "gpt2", "--mesh", ""], 2, f"mesh '': '' is not a positive axis size; fix: {MESH_FIX}"),
    ("zero axis size", ["--model", "gpt2", "--mesh", "0x4"], 2, f"mesh '0x4': '0' is not a positive axis size; fix: {MESH_FIX}"),
    ("bad axis name", ["--model", "gpt2", "--mesh", "1a=4"], 2, f"mesh axis name '1a' in '1a=4' is not an identifier; fix: {MESH_FIX}"),
    ("repeated axis name", ["--model", "gpt2", "--mesh", "data=2,data=4"], 2,
     f"mesh 'data=2,data=4' repeats an axis name; fix: name each axis once, {MESH_FIX}"),
    ("named axes out of device order", ["--model", "gpt2", "--mesh", "tensor=4,data=8"], 2,
     "mesh axes ('tensor', 'data') cannot carry parallelism in device order (tensor innermost, pipeline outermost); "
     "fix: order named axes as pipeline, data, context, expert, tensor (outer to inner)"),
    ("too many mesh axes", ["--model", "gpt2", "--mesh", "x".join(["1"] * 17)], 2,
     "mesh has 17 axes, more than the 16 this planner supports; fix: merge axes (an axis of size 1 carries nothing)"),
    ("no devices", ["--model", "gpt2", "--devices", "0"], 2,
     "argument --devices: '0' is not a positive whole number; fix: give a whole number of at least 1, e.g. 8"),
    ("too many devices", ["--model", "gpt2", "--mesh", "65536x65536"], 2,
     "4,294,967,296 devices exceed the 16,777,216 this planner supports; fix: plan one replica group and scale data parallelism by hand"),
    ("mesh carries no consistent layout", ["--model", "llama3-70b", "--mesh", "256x256", "--global-batch", "256"], 4,
     "no layout of llama3-70b on 65536 devices is consistent: ZeRO over a data-parallel degree that does not divide the model width "
     "is not lowered as planned yet (36), ZeRO without data parallelism (432), global_batch=N is not divisible by dp·micro_batch = N·N "
     "(12), interleaving needs pp > 1 and micro-batches divisible by pp (423), tensor parallel across nodes (60), uneven stages are not "
     "lowered as planned yet (189); fix: use a mesh or device count whose factors divide num_heads=64, num_layers=80 and global_batch=256"),
    # hand-written layouts
    ("layout does not match the device count", ["simulate", "--model", "llama3-8b", "--devices", "8", "--dp", "2",
                                                "--global-batch", "8"], 3,
     "tp·pp·dp·cp = 1·1·2·1 = 2 but --devices=8; fix: make the degrees multiply to the device count"),
    ("degrees do not divide the device count", ["simulate", "--model", "llama3-8b", "--devices", "8", "--tp", "3",
                                                "--global-batch", "8"], 3,
     "devices=8 is not divisible by tp·pp·cp = 3; fix: change --devices or the degrees"),
    ("optimizer step in backward with gradient accumulation", ["simulate", "--model", "gpt2", "--devices", "1", "--global-batch", "4",
                                                               "--micro-batch", "2", "--optimizer-in-backward"], 3,
     "the optimizer step in backward applies each gradient as it is formed, so it cannot accumulate 2 micro-batches; "
     "fix: give --micro-batch global_batch/dp (one micro-batch per step) or drop --optimizer-in-backward"),
    ("bf16 or 8-bit optimizer state over other weights", ["simulate", "--model", "gpt2", "--devices", "1", "--global-batch", "4",
                                                          "--precision", "fp16", "--optimizer-state", "8bit"], 2,
     "--optimizer-state 8bit keeps the weights in bf16, not in the float16 compute dtype; "
     "fix: use --precision bf16 or --optimizer-state fp32"),
    ("GPTQ kernel on weights not int4", ["simulate", "--model", "llama2-7b", "--devices", "1", "--workload", "decode",
                                         "--weight-kernel", "exllama"], 2,
     "--weight-kernel exllama runs int4 weights, not bf16; fix: add --frozen-dtype int4 or drop --weight-kernel"),
    ("GPTQ kernel on a part without an issue rate", ["simulate", "--model", "llama2-7b", "--devices", "1", "--hardware", "l40s",
                                                     "--precision", "fp16", "--workload", "decode", "--frozen-dtype", "int4",
                                                     "--weight-kernel", "autogptq-cuda-old"], 5,
     "the qkv kernel is bounded by CUDA-core instructions, and this part's profile gives no instruction issue rate; "
     "fix: use a100-80gb, h100-sxm or h200, or --weight-kernel fused"),
    # layout pins
    ("pinned degree the mesh cannot carry", ["--model", "llama3-8b", "--mesh", "data=8", "--tp", "3"], 3,
     "--tp 3: mesh data=8 can carry tp 1 only; fix: use --tp 1, or a --mesh whose axes can carry tp=3"),
    ("pinned micro-batch not dividing the replica's batch", ["--model", "llama3-8b", "--mesh", "data=8", "--global-batch", "64",
                                                             "--micro-batch", "3"], 3,
     "--micro-batch 3 does not divide the per-replica batch of 8 sequences (global batch 64 over dp=8); "
     "fix: use --micro-batch 1, 2, 4 or 8, or a --global-batch that is a multiple of 24"),
    ("pinned ZeRO without data parallelism", ["--model", "llama3-8b", "--mesh", "tensor=8", "--zero", "1"], 3,
     "--zero 1 shards state over data-parallel replicas, but mesh tensor=8 leaves dp=1; "
     "fix: use --zero 0, or leave devices for it (--dp > 1)"),
    ("pin a planner cannot honour", ["--model", "llama3-8b", "--mesh", "data=8", "--planner", "ilp", "--zero", "3"], 5,
     "--planner ilp cannot honour --zero 3: it shards each op over the mesh axes itself, with no degree, ZeRO stage, sequence "
     "parallelism or pipeline stage to pin (it honours --micro-batch and --recompute); "
     "fix: use --planner grid, which honours --zero 3, or drop --zero 3"),
    ("pinned training knob on a serving plan", ["--model", "llama3-8b", "--mesh", "8", "--workload", "decode", "--batch", "8",
                                                "--zero", "1"], 5,
     "--zero 1: a decode plan's layout search chooses only dp, tp and pp; fix: drop --zero 1 (serving honours --dp, --tp and --pp)"),
    # limits
    ("time limit before any fitting layout", ["--model", "gpt2", "--devices", "8", "--time-limit-s", "1e-9"], 6,
     "the time limit of 1e-09 s ran out before a layout of gpt2 on 8 devices that fits was found; "
     "fix: raise --time-limit-s, or give a --mesh (fewer layouts to cost)"),
    ("command past its time limit", ["simulate", "--model", "llama3-8b", "--devices", "8", "--global-batch", "8",
                                     "--time-limit-s", "1e-6"], 6,
     "plan simulate ran past its time limit of 1e-06 s with no answer; fix: raise --time-limit-s"),
    ("inspect past its time limit", ["inspect", "--model", "llama3-8b", "--time-limit-s", "1e-6"], 6,
     "plan inspect ran past its time limit of 1e-06 s with no answer; fix: raise --time-limit-s"),
    ("time limit not a number", ["inspect", "--model", "gpt2", "--time-limit-s", "nan"], 2,
     "argument --time-limit-s: 'nan' is not a finite positive number; fix: give a number above 0, e.g. 0.5 or 15e12"),
]


@pytest.fixture
def tmp(tmp_path):
    for name, text in FILES.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "binary.json").write_bytes(b"\xff\xfe{}")
    (tmp_path / "mine.json").write_text("mine")
    return tmp_path


def _run(capsys, argv):
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(("entry", "argv", "code", "golden"), CATALOG, ids=[c[0] for c in CATALOG])
def test_catalogued_error_prints_its_golden_line(capsys, tmp, entry, argv, code, golden):
    try:
        got, out, err = _run(capsys, [a.replace("{tmp}", str(tmp)) for a in argv])
    except SystemExit as exit_:  # argparse exits by itself
        got, (out, err) = exit_.code, capsys.readouterr()
    assert (got, out) == (code, "")
    assert "Traceback" not in err and err.count("\n") == 1 and "; fix: " in err
    assert err == f"plan: error: {golden.replace('{tmp}', str(tmp))}\n"
    assert (tmp / "mine.json").read_text() == "mine"  # a user's file is never touched


def test_unreadable_file(capsys, tmp, monkeypatch):
    def denied(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "open", denied)
    code, _, err = _run(capsys, ["--model", str(tmp / "bad.json"), "--mesh", "2"])
    assert code == 2
    assert err == (f"plan: error: cannot read model file '{tmp}/bad.json': [Errno 13] Permission denied: '{tmp}/bad.json'; "
                   "fix: check the file and its permissions\n")


def test_unwritable_output(capsys, tmp, monkeypatch):
    def denied(src, dst):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr("planner.cli.commands.plan_cmd.os.replace", denied)
    code, _, err = _run(capsys, ["--model", "gpt2", "--mesh", "2", "--out", str(tmp / "new.json")])
    assert code == 2 and not (tmp / "new.json").exists()
    assert err == f"plan: error: cannot write {tmp}/new.json: Permission denied; fix: check the directory's permissions and free space\n"


def test_memory_infeasible_lists_the_closest_layouts_with_bytes(capsys):
    code, out, err = _run(capsys, ["--model", "llama3-405b", "--mesh", "2x4", "--hardware", "a100-80gb"])
    assert code == 4 and out == "" and err.count("\n") == 1
    # The numbers move with the memory model (costmodel), the sentence does not: digits are masked past the head.
    head, closest, fix = err.split("; closest: ")[0], *err.split("; closest: ")[1].split("; fix: ")
    assert head == ("plan: error: llama3-405b does not fit on 8× a100-80gb: every layout needs more than the 76.0 GiB "
                    "(80.0 usable − 4.0 reserved) per device")
    one = "dpN tpN ppN mbN full recompute ZeRO N needs N GiB (params+grads+optimizer N, activations+temporaries N)"
    # The planner also tried the optimizer state, then every ZeRO-3 shard, on the host (an A100 node has 2 TB):
    # neither fits; the last tried is named.
    closest, offloaded = closest.split("; offloading the parameters, closest: ")
    assert re.sub(r"\d+(\.\d+)?", "N", closest) == f"{one}; {one}; {one}"
    on_host = f"{one} and N GiB of host against its N"
    assert re.sub(r"\d+(\.\d+)?", "N", offloaded) == f"{on_host}; {on_host}"  # the ZeRO-3 splits only
    assert re.fullmatch(r"use about \d+ devices or hardware with more memory\n", fix)
    needs = [float(x) for x in re.findall(r"needs ([\d.]+) GiB", closest)]
    assert len(needs) == 3 and needs == sorted(needs) and needs[0] > 80  # three distinct splits, closest first, each over 80 GiB
    # Offloaded, the device holds only gathered units and activations; the host lacks room for every shard.
    host = [(float(need), float(cap)) for need, cap in re.findall(r"and ([\d.]+) GiB of host against its ([\d.]+)", offloaded)]
    assert all(need > cap for need, cap in host)


def test_debug_shows_the_traceback_instead():
    with pytest.raises(InvalidConfigError, match="unknown model 'llama9'"):
        main(["--debug", "--model", "llama9", "--mesh", "2"])


def test_nothing_fitting_under_pins_names_the_pin_to_drop_and_the_best_unpinned_layout(capsys):
    code, out, err = _run(capsys, ["--model", "llama3-8b", "--mesh", "data=8", "--global-batch", "64", "--zero", "0",
                                   "--micro-batch", "2", "--offload", "none"])
    assert code == 4 and out == "" and err.count("\n") == 1
    assert re.fullmatch(r"plan: error: llama3-8b under --micro-batch 2 --zero 0 does not fit on 8× h100-sxm: every pinned layout "
                        r"needs more than the 75\.7 GiB \(79\.6 usable − 4\.0 reserved\) per device; closest: dp8 tp1 pp1 mb2 .*; "
                        r"fix: drop --zero 0 \(dp8 tp1 pp1 mb2 \S+ recompute ZeRO [123] at [\d.]+ GiB, [\d.]+ s fits\); without pins "
                        r"the best layout is dp8 tp1 pp1 mb\d \S+ recompute ZeRO \d at [\d.]+ GiB, [\d.]+ s, or let the optimizer "
                        r"state go to the host \(--offload optimizer\)\n", err)
