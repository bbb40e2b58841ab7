"""Parse and validate Megatron argument lists with Megatron-LM's own ``arguments.py``; run by
`benchmarks.export_check` in a Python >= 3.12 venv with torch (Megatron-LM's ``requires-python``).

    python benchmarks/megatron_check.py MEGATRON_LM_DIR WORLD_SIZE CASES.json

Imports nothing of ours. ``MEGATRON_LM_DIR`` holds Megatron-LM's ``megatron/`` package (the
commit the data file cites); ``CASES.json`` maps a case name to a ``pretrain_gpt.py`` argument
list. For each case prints one JSON line ``{"case", "accepted", "said"}``: accepted when
``parse_args(ignore_unknown_args=False)`` and then ``validate_args`` both pass; ``said`` is
Megatron's error, or the data-parallel size and virtual pipeline stages it derived.

The environment is what a Megatron launch sets: ``RANK`` 0 and ``WORLD_SIZE`` (torchrun's),
``CUDA_DEVICE_MAX_CONNECTIONS=1`` (exported by ``examples/llama/train_llama3_8b_h100_fp8.sh``;
``validate_args`` requires it under tensor or context parallelism). One stub: without a GPU,
``get_device_arch_version`` (device 0's CUDA compute capability) answers 9, the H100's, the
hardware the plans are made for. transformer_engine and apex are absent; Megatron falls back itself.
"""

import contextlib
import io
import json
import os
import sys
from pathlib import Path

megatron_dir, world_size, cases_path = sys.argv[1], sys.argv[2], sys.argv[3]
os.environ.update(RANK="0", WORLD_SIZE=world_size, CUDA_DEVICE_MAX_CONNECTIONS="1")
sys.path.insert(0, megatron_dir)

import megatron.training.arguments as megatron_arguments  # noqa: E402

H100_COMPUTE_CAPABILITY_MAJOR = 9
megatron_arguments.get_device_arch_version = lambda: H100_COMPUTE_CAPABILITY_MAJOR


def check(argv: list[str]) -> tuple[bool, str]:
    """(accepted, what Megatron said) for one argument list."""
    sys.argv = ["pretrain_gpt.py", *argv]
    said = io.StringIO()
    try:
        # Megatron prints every argument and its warnings; keep them out of the JSON lines.
        with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
            args = megatron_arguments.parse_args(ignore_unknown_args=False)
            megatron_arguments.validate_args(args)
    except SystemExit:
        return False, (said.getvalue().strip().splitlines() or ["exited"])[-1]
    except (AssertionError, ValueError, RuntimeError) as err:
        return False, f"{type(err).__name__}: {err}"
    return True, f"dp{args.data_parallel_size} vpp{args.virtual_pipeline_model_parallel_size or 1}"


for case, argv in json.loads(Path(cases_path).read_text()).items():
    accepted, said = check(argv)
    print(json.dumps({"case": case, "accepted": accepted, "said": said[:200]}), flush=True)
