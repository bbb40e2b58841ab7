#!/usr/bin/env bash
# Download the wheels the GPU machine lacks, for its Python 3.12 (x86_64 Linux), into .carry/
# (ignored by git), and print the one command that installs them there and runs the prepared
# measurement from the checkout (python -m benchmarks.gpu_truth --backend gpu). That machine has jax
# 0.11.x with its CUDA plugin, flax, optax, networkx, numpy, rich and matplotlib (so also
# python-dateutil and six), but not pydantic or ortools, and cannot download.
#
#   benchmarks/gpu_truth_carry.sh            download into .carry/ (about 45 MB), print the command
#   benchmarks/gpu_truth_carry.sh --dry-run  list the wheels pip would download, download nothing
#
# Versions are the ones this project is tested with; pandas is ortools' (cp_model imports it).
set -euo pipefail

cd "$(dirname "$0")/.."
CARRY=.carry
WHEELS=(
  "pydantic==2.13.4" "pydantic-core==2.46.4" "typing-extensions==4.15.0" "annotated-types==0.7.0" "typing-inspection==0.4.2"
  "ortools==9.15.6755" "protobuf==6.33.6" "absl-py==2.5.1" "immutabledict==4.3.1" "pandas==3.1.1"
)
TARGET=(--only-binary=:all: --python-version 3.12 --implementation cp --abi cp312
        --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64)
# Installed into a folder on PYTHONPATH with the machine's own python: on the first H100 run a bare
# `pip` belonged to another interpreter, and `python` then found no pydantic.
RUN="python -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $CARRY/*.whl && export PYTHONPATH=/tmp/site:\$PWD && python -m benchmarks.gpu_truth --backend gpu"

case "${1:-}" in
  --dry-run)
    report=$(mktemp)
    trap 'rm -rf "$report" "$report.target"' EXIT
    pip install --quiet --dry-run --ignore-installed --no-deps --target "$report.target" --report "$report" "${TARGET[@]}" "${WHEELS[@]}"
    python - "$report" <<'PY'
import json, sys
from urllib.parse import urlparse
for item in json.load(open(sys.argv[1]))["install"]:
    print(urlparse(item["download_info"]["url"]).path.rsplit("/", 1)[-1])
PY
    ;;
  "")
    mkdir -p "$CARRY"
    pip download --quiet --no-deps --dest "$CARRY" "${TARGET[@]}" "${WHEELS[@]}"
    ls -1 "$CARRY"
    du -sh "$CARRY"
    ;;
  *)
    echo "usage: $0 [--dry-run]" >&2
    exit 2
    ;;
esac
echo "On the GPU machine, from the repository root (with $CARRY/ carried along):"
echo "$RUN"
