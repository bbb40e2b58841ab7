"""Load one MaxText export with MaxText itself; run by `benchmarks.maxtext_export` in MaxText's venv.

    python benchmarks/maxtext_check.py MODEL_NAME EXPORT.json N_DEVICES

Imports nothing of ours (MaxText needs Python >= 3.12). Two checks, each printed on one
line: (1) MaxText's config loader (pydantic; it refuses unknown keys and bad values) accepts
the export as it is, DCN axes and ``num_slices`` included, for MaxText's own ``MODEL_NAME``
config on N emulated CPU devices; (2) its decoder knows the ``remat_policy`` (the loader
takes any string). Building MaxText's model shardings is not checked: its attention kernels
import ``jax.experimental.xla_metadata.must_fuse_call``, which jax 0.10.2 lacks.
"""

import json
import os
import sys
from pathlib import Path

model_name, export_path, n_devices = sys.argv[1], sys.argv[2], int(sys.argv[3])
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={n_devices}"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import maxtext  # noqa: E402
from maxtext.configs import pyconfig  # noqa: E402

export = json.loads(Path(export_path).read_text())
base_yml = str(Path(maxtext.__file__).parent / "configs" / "base.yml")
argv = ["train.py", base_yml, "run_name=planner-export-check", "skip_jax_distributed_system=true", f"model_name={model_name}"]

config = pyconfig.initialize(argv, **export)
print(f"ACCEPTED as exported: mesh_axes={list(config.mesh_axes)} ici={list(config.ici_parallelism)} "
      f"dcn={list(config.dcn_parallelism)} num_slices={config.num_slices} remat_policy={config.remat_policy} "
      f"global_batch={config.global_batch_size_to_train_on}")

# The loader takes any string; the decoder's get_remat_policy asserts on names it does not
# know. Read its source as text: importing the decoder pulls in MaxText's kernels.
decoder_source = (Path(maxtext.__file__).parent / "layers" / "nnx_decoders.py").read_text()
remat_source = decoder_source[decoder_source.index("def get_remat_policy"):]
if f'"{config.remat_policy}"' not in remat_source:
    sys.exit(f"REFUSED: remat_policy {config.remat_policy!r} is not one MaxText's decoder knows")
print(f"REMAT: {config.remat_policy!r} is handled by MaxText's NNXDecoder.get_remat_policy")
