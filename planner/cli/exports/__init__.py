"""Exports of a `Plan` for the stacks users launch with, one module each, and stack-neutral ones.

``plan --format F`` prints them (`planner.cli.commands.plan_cmd.FORMATS`); the names and
values each stack accepts are read from its source into ``planner/cli/export_schemas/``.
"""

from planner.cli.exports.deepspeed import to_deepspeed
from planner.cli.exports.maxtext import maxtext_degrees, to_maxtext
from planner.cli.exports.megatron import megatron_command_line, to_megatron
from planner.cli.exports.summaries import flax_logical_rules, markdown_report
from planner.cli.exports.torchtitan import to_torchtitan, to_torchtitan_toml

__all__ = ["flax_logical_rules", "markdown_report", "maxtext_degrees", "megatron_command_line", "to_deepspeed", "to_maxtext",
           "to_megatron", "to_torchtitan", "to_torchtitan_toml"]
