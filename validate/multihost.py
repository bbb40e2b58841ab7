"""Run a validation on several JAX processes that form one global device mesh.

``plan validate plan.json --compile-only --processes 2`` starts two local Python processes;
each calls ``jax.distributed.initialize`` with a coordinator on 127.0.0.1, sees its own
emulated CPU devices plus the other's (CPU collectives go through gloo), and runs the same
check on the global mesh; process 0's answer is the report. Processes are started in their
own session and always killed on failure or timeout.

On a real cluster the same code path runs with one process per host:

    python -m validate.multihost --target validate.multihost:compile_plan_json \\
        --coordinator HOST0:1234 --num-processes N --process-id I < plan.json

(or leave out the three distributed flags where ``jax.distributed.initialize()`` finds them
itself: SLURM, Cloud TPU, Kubernetes with JAX's cluster detection).

>>> run_processes("json:dumps", "[]", n_processes=1, devices_per_process=1, timeout_s=120)  # doctest: +SKIP
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

from costmodel.errors import InvalidPlanError, PlannerError

_RESULT = "MULTIHOST-RESULT "


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_processes(target: str, payload: str, *, n_processes: int = 2, devices_per_process: int, timeout_s: float = 300) -> str:
    """Call ``target`` ("module:function", taking and returning a string) in ``n_processes``
    processes forming one distributed JAX runtime on loopback; return process 0's result."""
    port = _free_port()
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices_per_process}", JAX_PLATFORMS="cpu")
    with tempfile.TemporaryDirectory() as tmp:
        payload_path = os.path.join(tmp, "payload")
        with open(payload_path, "w") as f:
            f.write(payload)
        procs = []
        try:
            for i in range(n_processes):
                cmd = [sys.executable, "-m", "validate.multihost", "--target", target, "--payload", payload_path,
                       "--coordinator", f"127.0.0.1:{port}", "--num-processes", str(n_processes), "--process-id", str(i)]
                procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                              start_new_session=True))
            return _collect(procs, timeout_s)
        finally:
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def _collect(procs: list[subprocess.Popen], timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    outputs: dict[int, tuple[str, str]] = {}
    while len(outputs) < len(procs):
        for i, p in enumerate(procs):
            if i not in outputs and p.poll() is not None:
                outputs[i] = p.communicate()
                if p.returncode != 0:
                    lines = outputs[i][1].strip().splitlines()
                    raise PlannerError(f"process {i} of {len(procs)} failed: {lines[-1][:300] if lines else f'exit code {p.returncode}'}",
                                       fix="run it with --debug, or the same check with --processes 1")
        if time.monotonic() > deadline:
            raise PlannerError(f"the {len(procs)}-process run took over {timeout_s:.0f} s and was stopped",
                               fix="validate a smaller plan, or raise the timeout")
        time.sleep(0.05)
    result = [line for line in outputs[0][0].splitlines() if line.startswith(_RESULT)]
    if not result:
        raise PlannerError("process 0 finished without a result", fix="check that the target returns a string")
    return result[-1].removeprefix(_RESULT)


def compile_plan_json(payload: str) -> str:
    """Target: compile the plan (JSON) on the global mesh; the `CompileReport` as JSON."""
    from planner.schema import Plan
    from validate.compile_check import compile_plan

    return compile_plan(Plan.model_validate_json(payload)).model_dump_json()


def worker_main(argv: list[str] | None = None) -> None:
    """One process of the distributed run: initialize, call the target, print its result, shut down."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True, help="module:function taking and returning a string")
    parser.add_argument("--payload", help="file holding the target's input (default: stdin)")
    parser.add_argument("--coordinator", help="host:port of process 0 (default: cluster auto-detection)")
    parser.add_argument("--num-processes", type=int)
    parser.add_argument("--process-id", type=int)
    args = parser.parse_args(argv)
    import jax

    if args.coordinator:
        jax.distributed.initialize(coordinator_address=args.coordinator, num_processes=args.num_processes, process_id=args.process_id)
    else:
        jax.distributed.initialize()
    try:
        module, function = args.target.split(":")
        payload = open(args.payload).read() if args.payload else sys.stdin.read()
        result = getattr(importlib.import_module(module), function)(payload)
        if jax.process_index() == 0:
            print(_RESULT + result, flush=True)
    finally:
        jax.distributed.shutdown()


def validate_processes(n_processes: int, n_devices: int) -> int:
    """Emulated devices per process for ``n_devices`` over ``n_processes``; raises when they do not divide."""
    if n_processes < 1 or n_devices % n_processes:
        raise InvalidPlanError(f"{n_devices} devices cannot be split over {n_processes} processes",
                               fix="use a process count that divides the plan's device count")
    return n_devices // n_processes


if __name__ == "__main__":
    worker_main()
