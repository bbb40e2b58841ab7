"""The collective model against published nccl-tests curves.

Every row of ``benchmarks/data/nccl_tests.csv`` (one message size of one published curve) is
predicted with the step simulator's alpha-beta model (`costmodel.step.collectives`) on the row's
part as its hardware profile describes it: the group of the row's ranks, ``gpus_per_node`` a
node, the profile's NVLink tier inside a node and its default cluster's network across nodes
(DGX-style InfiniBand, whatever the vendor ran; the vendors' own fabrics are not in the
catalog). The measured time is the row's out-of-place time, or where only bandwidth is published
``size / algbw`` (algbw = busbw / NCCL's bus factor: ``2(n−1)/n`` for all-reduce, ``(n−1)/n``
for all-gather and reduce-scatter). Nothing is fitted here. Each row is also predicted with NCCL's
own tuning model (`costmodel.step.nccl`: its latencies per algorithm and protocol, the fastest
pair chosen, or the row's algorithm where the run forced one), on the same links. Errors by source,
collective, ranks and message-size band (latency-bound under 1 MiB, bandwidth-bound from 64 MiB).

    python -m benchmarks.collectives_accuracy [--data PATH] [--out benchmarks/out/collectives_accuracy.csv]
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from benchmarks.output import print_table, write_csv
from costmodel.hardware.fabric import IntraNodeKind
from costmodel.hardware.machine import load_machine
from costmodel.hardware.registry import load_hardware
from costmodel.step.collectives import Collective, Group, collective_s
from costmodel.step.nccl import Choice, nccl_choice

DEFAULT_DATA = Path(__file__).resolve().parent / "data" / "nccl_tests.csv"
COLLECTIVES = {"all_reduce": Collective.ALL_REDUCE, "all_gather": Collective.ALL_GATHER, "reduce_scatter": Collective.REDUCE_SCATTER}
_MIB = 2**20
NVLS_LINKS = ("nvlink4", "nvlink5")


def bus_factor(collective: str, ranks: int) -> float:
    """nccl-tests' busbw / algbw for a collective on ``ranks`` (its PERFORMANCE.md).

    >>> bus_factor("all_reduce", 8), bus_factor("all_gather", 8)
    (1.75, 0.875)
    """
    return (2 if collective == "all_reduce" else 1) * (ranks - 1) / ranks


def measured_s(row: dict[str, str]) -> float | None:
    """The row's measured seconds: its time, or its size over the bandwidth it states; None without either."""
    if row["time_us"]:
        return float(row["time_us"]) * 1e-6
    size, ranks = float(row["size_bytes"]), int(row["gpus"])
    algbw = float(row["algbw_gb_per_s"] or 0) or float(row["busbw_gb_per_s"] or 0) / bus_factor(row["collective"], ranks)
    return size / (algbw * 1e9) if algbw > 0 else None


def row_group(row: dict[str, str]) -> Group:
    """The row's ranks as a group on its part's profile: its NVLink tier inside a node, its NIC across."""
    ranks, per_node = int(row["gpus"]), int(row["gpus_per_node"])
    machine = load_machine(row["hardware"], devices_per_node=per_node)
    return Group(n=ranks, n_nodes=max(1, ranks // per_node), intra=machine.intra, inter=machine.inter)


def predicted_s(row: dict[str, str], group: Group) -> float:
    """The simulator's seconds for the row's collective and size on its `row_group`."""
    return collective_s(COLLECTIVES[row["collective"]], float(row["size_bytes"]), group)


def switch_reduces(hardware: str) -> bool:
    """Whether the part's NVSwitch reduces in the switch (NVLS: NVLink 4 and later NVSwitch systems)."""
    intra = load_hardware(hardware).intra_node
    return intra.kind is IntraNodeKind.NVSWITCH and intra.link.name in NVLS_LINKS


def nccl_model(row: dict[str, str], group: Group) -> Choice | None:
    """NCCL's tuning model's choice and seconds for the row on its `row_group` (its forced algorithm,
    if any); None where the row's algorithm is not one the model has (CollNet/SHARP)."""
    forced = row["algorithm"] or None
    try:
        return nccl_choice(row["collective"], float(row["size_bytes"]), group, nvls=switch_reduces(row["hardware"]), algorithm=forced)
    except ValueError:
        return None


def size_band(size_bytes: float) -> str:
    """``latency`` under 1 MiB, ``bandwidth`` from 64 MiB, ``middle`` between."""
    return "latency" if size_bytes < _MIB else "bandwidth" if size_bytes >= 64 * _MIB else "middle"


def evaluate(rows: list[dict[str, str]]) -> list[dict[str, object]]:
    """One result per predictable row (a modelled collective and a measured time)."""
    out = []
    for row in rows:
        measured = measured_s(row)
        if row["collective"] not in COLLECTIVES or not measured or float(row["size_bytes"]) <= 0:
            continue
        group = row_group(row)
        predicted, nccl = predicted_s(row, group), nccl_model(row, group)
        out.append({"source": row["source"].split()[0], "hardware": row["hardware"], "collective": row["collective"],
                    "algorithm": row["algorithm"] or "nccl's choice", "ranks": group.n, "nodes": group.n_nodes,
                    "size_bytes": int(float(row["size_bytes"])),
                    "band": size_band(float(row["size_bytes"])), "measured_us": measured * 1e6, "predicted_us": predicted * 1e6,
                    "error_pct": 100 * (predicted - measured) / measured,
                    "nccl_choice": f"{nccl.algorithm}/{nccl.protocol}" if nccl else None,
                    "nccl_us": nccl.seconds * 1e6 if nccl else None,
                    "nccl_error_pct": 100 * (nccl.seconds - measured) / measured if nccl else None})
    return out


def summary(results: list[dict[str, object]]) -> list[dict[str, object]]:
    """Mean |error| and signed mean per source, part, collective, algorithm, ranks and size band, of
    the simulator's model and of NCCL's."""
    groups: dict[tuple, list[dict[str, object]]] = defaultdict(list)
    for r in results:
        groups[(r["source"], r["hardware"], r["collective"], r["algorithm"], r["ranks"], r["band"])].append(r)
    out = []
    for k, rows in sorted(groups.items(), key=lambda kv: tuple(map(str, kv[0]))):
        errors = [float(r["error_pct"]) for r in rows]
        nccl = [float(r["nccl_error_pct"]) for r in rows if r["nccl_error_pct"] is not None]
        out.append({"source": k[0], "hardware": k[1], "collective": k[2], "algorithm": k[3], "ranks": k[4], "band": k[5],
                    "points": len(rows), "mean_abs_err_pct": statistics.mean(map(abs, errors)),
                    "signed_mean_err_pct": statistics.mean(errors),
                    "nccl_mean_abs_err_pct": statistics.mean(map(abs, nccl)) if nccl else None,
                    "nccl_signed_mean_err_pct": statistics.mean(nccl) if nccl else None})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="published nccl-tests points CSV")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out/collectives_accuracy.csv"), help="where to write the CSV")
    args = parser.parse_args(argv)
    with args.data.open() as f:
        results = evaluate(list(csv.DictReader(f)))
    print_table(f"Collective model vs published nccl-tests, by curve and size band ({len(results)} points)", summary(results))
    for band in ("latency", "middle", "bandwidth"):
        errors = [abs(float(r["error_pct"])) for r in results if r["band"] == band]
        nccl = [abs(float(r["nccl_error_pct"])) for r in results if r["band"] == band and r["nccl_error_pct"] is not None]
        print(f"{band}-bound points: {len(errors)}, mean |error| {statistics.mean(errors):.1f} %; NCCL's model on "
              f"{len(nccl)} of them: {statistics.mean(nccl):.1f} %")
    write_csv(args.out, results)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
