"""Reference JAX transformer models and their training step.

The modules are imported by name (``planner.programs.params``, ``planner.programs.train_step``): importing this
package imports no JAX, so a command that only simulates (``plan simulate``) starts without it.
"""
