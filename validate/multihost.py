"""Run a validation on several JAX processes that form one global device mesh.

A plan for a cluster spans hosts; the single-process checks cannot show that its mesh,
shardings and collectives also work when every host holds only its own devices.
``plan validate plan.json ... --processes 2`` starts two local Python processes; each calls
``jax.distributed.initialize`` with a coordinator on 127.0.0.1, sees its own emulated CPU
devices plus the other's (CPU collectives go through gloo), and runs the same check on the
global mesh; process 0's answer is the report. Processes run in their own session and are
all killed when one fails, when the time limit passes, or on Ctrl-C.

A target is any ``"module:function"`` taking a string and returning a (JSON) string:
`compile_plan_json` compiles the plan, `run_plan_steps` runs training steps and reports
the losses (`step_plan` is the same check in the calling process).

On a real cluster the same code path runs with one process per host, each seeing its own
accelerators, and the payload (here a `StepRequest`: ``StepRequest(plan=plan).model_dump_json()``)
in a file at the same path on every host:

    python -m validate.multihost --target validate.multihost:run_plan_steps \\
        --coordinator HOST0:1234 --num-processes N --process-id I --payload steps.json

where ``HOST0`` is host 0's address, 1234 a port free there, and ``I`` runs from 0 to N-1.
Leave out the three distributed flags where ``jax.distributed.initialize()`` finds them itself
(SLURM, Cloud TPU, Kubernetes with JAX's cluster detection). Process 0 prints the result
after the ``MULTIHOST-RESULT`` marker.

>>> payload = StepRequest(plan=plan, steps=2).model_dump_json()  # doctest: +SKIP
>>> run_processes("validate.multihost:run_plan_steps", payload, devices_per_process=4)  # doctest: +SKIP
'{"n_processes":2,"n_devices":8,"compile_s":...,"losses":[4.87...,4.82...],...}'
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
import traceback
from pathlib import Path

import jax
from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveInt

from costmodel.errors import InvalidPlanError, PlannerError
from planner.plan_schema import Plan
from planner.programs.xla_options import compile_options
from validate.compile_check import compile_plan
from validate.emulated import emulated_cpu_env
from validate.lowering import check_param_specs, initial_inputs, jitted_step
from validate.mesh_hooks import device_mesh

_RESULT = "MULTIHOST-RESULT "
_POLL_S = 0.05


class DistributedRunError(PlannerError):
    """A process of a multi-process run failed, outlived its time limit, or returned nothing."""


class StepRequest(BaseModel):
    """The payload of `run_plan_steps`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    plan: Plan = Field(description="The plan whose training step runs.")
    steps: PositiveInt = Field(3, description="Training steps to run.")
    seed: NonNegativeInt = Field(0, description="Seed of the parameters and of the random token batch.")


class StepRun(BaseModel):
    """Losses and times of a plan's training steps on its (global) mesh."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    n_processes: PositiveInt = Field(description="JAX processes the mesh spans.")
    n_devices: PositiveInt = Field(description="Devices in the plan's mesh.")
    compile_s: float = Field(description="Seconds to lower and compile the step.")
    losses: tuple[float, ...] = Field(description="Loss of each step, in order (the batch is the same every step).")
    step_wall_s: tuple[float, ...] = Field(description="Wall seconds of each step, until its loss reached the host.")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_processes(target: str, payload: str, *, n_processes: int = 2, devices_per_process: int, timeout_s: float = 300) -> str:
    """Call ``target`` ("module:function", taking and returning a string) with ``payload`` in
    ``n_processes`` local processes forming one distributed JAX runtime over 127.0.0.1, each
    with ``devices_per_process`` emulated CPU devices; return process 0's result. Raises
    `DistributedRunError` naming the first process to fail, or when ``timeout_s`` passes."""
    coordinator = f"127.0.0.1:{_free_port()}"
    # The coordinator binds every interface unless told otherwise; a local run stays on loopback.
    env = emulated_cpu_env(devices_per_process, JAX_COORDINATOR_BIND_ADDRESS=coordinator)
    with tempfile.TemporaryDirectory(prefix="multihost-") as tmp:
        payload_path = Path(tmp, "payload")
        payload_path.write_text(payload)
        procs: list[subprocess.Popen] = []
        try:
            for i in range(n_processes):
                cmd = [sys.executable, "-m", "validate.multihost", "--target", target, "--payload", str(payload_path),
                       "--coordinator", coordinator, "--num-processes", str(n_processes), "--process-id", str(i)]
                # Output goes to files: a pipe nobody reads while the run lasts would block a chatty process.
                with open(Path(tmp, f"out{i}"), "w") as out, open(Path(tmp, f"err{i}"), "w") as err:
                    procs.append(subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                                  start_new_session=True))
            _wait_all(procs, Path(tmp), timeout_s)
            results = [line for line in Path(tmp, "out0").read_text().splitlines() if line.startswith(_RESULT)]
        finally:
            for p in procs:  # the whole session: a target's own children die with it
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
    if not results:
        raise DistributedRunError(f"process 0 of {n_processes} finished without a result", fix=f"check that {target} returns a string")
    return results[-1].removeprefix(_RESULT)


def _wait_all(procs: list[subprocess.Popen], logs: Path, timeout_s: float) -> None:
    """Return when every process has exited with status 0; raise at the first failure or at the time limit."""
    deadline = time.monotonic() + timeout_s
    while True:
        codes = [p.poll() for p in procs]
        failed = [i for i, code in enumerate(codes) if code]
        if failed:
            lines = Path(logs, f"err{failed[0]}").read_text().strip().splitlines()
            cause = lines[-1][:300] if lines else f"exit status {codes[failed[0]]}"
            raise DistributedRunError(f"process {failed[0]} of {len(procs)} failed: {cause}",
                                      fix="run the same check with --processes 1 to see the whole error")
        if all(code == 0 for code in codes):
            return
        if time.monotonic() > deadline:
            raise DistributedRunError(f"the {len(procs)}-process run took over {timeout_s:.0f} s and was stopped",
                                      fix="validate a smaller plan, or raise the time limit")
        time.sleep(_POLL_S)


def validate_processes(n_processes: int, n_devices: int) -> int:
    """Emulated devices per process for ``n_devices`` over ``n_processes``.

    >>> validate_processes(2, 8)
    4
    >>> validate_processes(3, 8)
    Traceback (most recent call last):
    costmodel.errors.InvalidPlanError: 8 devices cannot be split over 3 processes; fix: use a process count that divides \
the plan's device count
    """
    if n_processes < 1 or n_devices % n_processes:
        raise InvalidPlanError(f"{n_devices} devices cannot be split over {n_processes} processes",
                               fix="use a process count that divides the plan's device count")
    return n_devices // n_processes


def compile_plan_json(payload: str) -> str:
    """Target: compile the plan (JSON) on the global mesh; the `CompileReport` as JSON."""
    return compile_plan(Plan.model_validate_json(payload)).model_dump_json()


def step_plan(plan: Plan, *, steps: int = 3, seed: int = 0) -> StepRun:
    """Run the plan's jitted step (`validate.lowering.jitted_step`) ``steps`` times in this
    process, on ``jax.devices()``: the global devices under ``jax.distributed``, where every
    process must call it alike, from the same state whatever the process count
    (`validate.lowering.initial_inputs`). The model runs as the plan says (its dtypes included),
    compiled with the program's options for the devices' platform (`planner.programs.xla_options`)."""
    check_param_specs(plan)
    mesh = device_mesh(plan)
    params, opt_state, batch = initial_inputs(plan, mesh, seed=seed)
    start = time.perf_counter()
    options = compile_options(plan.layout, jax.devices()[0].platform)
    compiled = jitted_step(plan, mesh).lower(params, opt_state, batch).compile(options)
    compile_s = time.perf_counter() - start
    losses, step_wall_s = [], []
    for _ in range(steps):
        start = time.perf_counter()
        params, opt_state, metrics = compiled(params, opt_state, batch)
        losses.append(float(metrics["loss"].addressable_data(0)))  # replicated: each process holds the whole scalar
        step_wall_s.append(time.perf_counter() - start)
    return StepRun(n_processes=jax.process_count(), n_devices=mesh.size, compile_s=compile_s, losses=tuple(losses),
                   step_wall_s=tuple(step_wall_s))


def run_plan_steps(payload: str) -> str:
    """Target: `step_plan` for a `StepRequest` (JSON); the `StepRun` as JSON."""
    request = StepRequest.model_validate_json(payload)
    return step_plan(request.plan, steps=request.steps, seed=request.seed).model_dump_json()


def step_in_processes(plan: Plan, *, n_processes: int = 2, steps: int = 3, seed: int = 0, timeout_s: float = 300) -> StepRun:
    """`run_plan_steps` in ``n_processes`` local processes sharing the plan's devices (1 gives
    the single-process run to compare with)."""
    per_process = validate_processes(n_processes, plan.layout.n_devices)
    payload = StepRequest(plan=plan, steps=steps, seed=seed).model_dump_json()
    return StepRun.model_validate_json(run_processes("validate.multihost:run_plan_steps", payload, n_processes=n_processes,
                                                     devices_per_process=per_process, timeout_s=timeout_s))


def worker_main(argv: list[str] | None = None) -> None:
    """One process of a distributed run: initialize, call the target, print process 0's result, shut down."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True, help="module:function taking and returning a string")
    parser.add_argument("--payload", help="file holding the target's input (default: stdin)")
    parser.add_argument("--coordinator", help="host:port of process 0 (default: cluster auto-detection)")
    parser.add_argument("--num-processes", type=int)
    parser.add_argument("--process-id", type=int)
    args = parser.parse_args(argv)

    if args.coordinator:
        jax.distributed.initialize(coordinator_address=args.coordinator, num_processes=args.num_processes, process_id=args.process_id)
    else:
        jax.distributed.initialize()
    try:
        module, function = args.target.split(":")
        payload = Path(args.payload).read_text() if args.payload else sys.stdin.read()
        result = getattr(importlib.import_module(module), function)(payload)
    except BaseException:
        # No shutdown: its barrier would wait (30 s) for processes that are stuck waiting on this one.
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    if jax.process_index() == 0:
        print(_RESULT + result, flush=True)
    jax.distributed.shutdown()


if __name__ == "__main__":
    worker_main()
