"""Predict, then measure on a real GPU: one prepared command, ready before the machine is.

    python -m benchmarks.gpu_truth [--backend gpu|cpu] [--quick] [--out-dir benchmarks/data/gpu]
                                   [--time-budget-s 450] [--hardware PROFILE]

On one H100 or H200 (or the CPU at toy sizes, ``--backend cpu --quick``) it measures what the
cost model assumes and what it predicts, each case beside the cost model's own answer for it:

- `benchmarks.gpu_truth.micro`: GEMMs of 1B–70B layers under tensor parallelism 1–8 (bf16, and
  fp8 where the part has a float8 peak), causal GQA attention forward and backward at 2k–32k
  tokens (the reference program's blockwise kernel and cuDNN's fused one), HBM streaming, and
  the RMSNorm and SwiGLU kernels XLA fuses;
- `benchmarks.gpu_truth.steps`: full training steps of a ~1B model and a layer-reduced 8B at the
  layout the planner chooses for one device and two it would not, against the step simulator;
- `benchmarks.gpu_truth.serving`: decode steps (batch 1–64, 2k–8k context) and a prefill, against
  the serving model.

Cases run one kind after another in turn until ``--time-budget-s`` nears (the rest are listed
as skipped); a case that fails is recorded with its error and the run goes on. One CSV per run
goes into the out dir (`benchmarks.gpu_truth.report`); the table, the planner's choice's error
and the layouts' order measured vs predicted are printed. docs/gpu.md says when to run it and
`benchmarks/gpu_truth_carry.sh` how to bring it to a machine that cannot download.
"""
