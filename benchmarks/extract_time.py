"""Graph extraction time: llama3-70b's training step at 8 and 80 layers, cold and warm.

    python -m benchmarks.extract_time [--repeats 5] [--out benchmarks/out/extract_time.csv]

Prints a table and writes a CSV. "cold" is the first extraction in this process (JAX's
tracing caches empty); "warm" the median of the repeats after it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from benchmarks.output import print_table, write_csv
from costmodel.inputs.train_config import TrainConfig
from planner.config import load_model
from planner.inspect import inspect_model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out/extract_time.csv"))
    args = parser.parse_args(argv)
    base, train = load_model("llama3-70b"), TrainConfig(seq_len=8192, global_batch=512)
    rows = []
    for layers in (80, 8):
        model = base.model_copy(update={"num_layers": layers})
        start = time.perf_counter()
        report = inspect_model(model, train)
        cold_s = time.perf_counter() - start
        warm = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            inspect_model(model, train)
            warm.append(time.perf_counter() - start)
        rows.append({"model": f"llama3-70b ({layers} layers)", "ops": report.ops, "cold_s": round(cold_s, 3),
                     "warm_median_s": round(statistics.median(warm), 3), "warm_max_s": round(max(warm), 3)})
    print_table("OpGraph extraction of a full training step (trace + graph build)", rows)
    cold, warm = rows[0]["cold_s"] / rows[1]["cold_s"], rows[0]["warm_median_s"] / rows[1]["warm_median_s"]
    print(f"80-layer / 8-layer: cold {cold:.2f}, warm {warm:.2f}")
    write_csv(args.out, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
