"""Reference JAX transformer models and their training step."""

from planner.programs.params import LogicalAxis as LogicalAxis
from planner.programs.params import abstract_params as abstract_params
from planner.programs.params import init_params as init_params
from planner.programs.params import param_logical_axes as param_logical_axes
from planner.programs.train_step import abstract_train_inputs as abstract_train_inputs
from planner.programs.train_step import make_train_step as make_train_step
from planner.programs.transformer import forward as forward
