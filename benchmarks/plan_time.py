"""Planning time, cold process (Python start, imports, tracing and search included).

    python -m benchmarks.plan_time [--repeats 3] [--out benchmarks/out/plan_time.csv]

Cases: llama3-70b on 8x4 H100s; llama3-405b on 16384 devices with the mesh chosen by the
planner; llama3-70b at 8 and 80 layers (a native JSON config) to show time does not grow
with depth. Prints the median of the repeats and writes a CSV.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.output import print_table, write_csv
from planner.config import load_model


def _time_cli(args: list[str], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "planner.cli", *args], check=True, capture_output=True, timeout=600)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out/plan_time.csv"))
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        configs = {}
        for layers in (8, 80):
            path = Path(tmp) / f"llama3-70b-{layers}l.json"
            path.write_text(load_model("llama3-70b").model_copy(update={"num_layers": layers}).model_dump_json())
            configs[layers] = str(path)
        cases = [
            ("llama3-70b, mesh 8x4", ["--model", "llama3-70b", "--mesh", "8x4", "--seq-len", "8192", "--global-batch", "512"]),
            ("llama3-405b, 16384 devices", ["--model", "llama3-405b", "--devices", "16384", "--seq-len", "8192",
                                            "--global-batch", "16384"]),
            ("llama3-70b 8 layers, 8x4", ["--model", configs[8], "--mesh", "8x4", "--seq-len", "8192", "--global-batch", "512"]),
            ("llama3-70b 80 layers, 8x4", ["--model", configs[80], "--mesh", "8x4", "--seq-len", "8192", "--global-batch", "512"]),
        ]
        rows = [{"case": name, "median_s": round(_time_cli(cli, args.repeats), 3)} for name, cli in cases]
    print_table(f"`plan` wall time, cold process, median of {args.repeats}", rows)
    print(f"80 / 8 layers: {rows[3]['median_s'] / rows[2]['median_s']:.2f}")
    write_csv(args.out, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
