"""Read a `ModelConfig` from a preset name, a Hugging Face ``config.json`` or our own JSON.

Hugging Face configs are recognised by ``model_type`` (or, without one, by their keys):
Llama, Mistral, Qwen2, Qwen3 (dense), GPT-2, Mixtral, Qwen2-MoE and Qwen3-MoE. Keys a
Hugging Face config carries that do not change the shape (``torch_dtype``, ...) are
ignored; a file in our own format (the fields of `ModelConfig`) must have no unknown keys.
Values are typed strictly: a quoted number or a boolean where a size belongs is an error that
names the key as the file spells it. The coercions kept are the ones hub configs rely on: an
integer where a float belongs ("rope_theta": 10000) and null for "the default" ("head_dim": null).

A model's vocabulary is padded to a multiple of 128 (`ModelConfig.vocab_multiple`; our own
format may set it, 1 for none), so GPT-2's parameters count its 50304-row table:

>>> load_model("gpt2").total_params, load_model("gpt2").padded_vocab_size
(124475904, 50304)
>>> from_hf_config({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
...                 "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100}).num_kv_heads
4
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from costmodel.errors import InvalidConfigError, UnsupportedError, flag_error, read_user_file, unknown_name_error
from costmodel.inputs.model_config import ModelConfig, Positions
from costmodel.inputs.train_config import TrainConfig
from planner.presets import PRESETS

_LLAMA_LIKE = ("llama", "mistral", "qwen2", "qwen3")
_MOE = ("mixtral", "qwen2_moe", "qwen3_moe")
SUPPORTED_MODEL_TYPES = ("gpt2", *_LLAMA_LIKE, *_MOE)
_GATED_ACTIVATIONS = {"silu": "swiglu", "swish": "swiglu", "gelu": "geglu", "gelu_pytorch_tanh": "geglu"}


def load_model(name_or_path: str | Path) -> ModelConfig:
    """A preset by name, or the model described by a JSON file.

    Raises:
      InvalidConfigError: unknown preset, missing or unreadable file, malformed JSON,
        unknown architecture, or inconsistent dimensions; the message says which.
    """
    text = str(name_or_path)
    if text in PRESETS:
        return _validated(dict(PRESETS[text], name=text), source=text, keys={})
    path = Path(text)
    if not path.exists() and path.suffix != ".json" and "/" not in text:
        raise unknown_name_error("model", text, sorted(PRESETS), otherwise="a config.json path or ")
    try:
        data = json.loads(read_user_file(path, "model file"))
    except json.JSONDecodeError as err:
        raise InvalidConfigError(
            f"{text!r} is not valid JSON (line {err.lineno}, column {err.colno}: {err.msg})",
            fix="fix the JSON syntax",
        ) from err
    except ValueError as err:  # Python's limit on integer digits
        raise InvalidConfigError(f"{text!r} is not valid JSON ({err})", fix="fix the number in the config") from err
    if not isinstance(data, dict):
        raise InvalidConfigError(f"{text!r} holds a JSON {type(data).__name__}, not an object", fix="give a config object")
    return from_hf_config(data, name=path.stem if path.name != "config.json" else path.parent.name or "config")


def from_hf_config(data: dict[str, Any], *, name: str = "config") -> ModelConfig:
    """Translate a Hugging Face (or native) config dictionary into a `ModelConfig`."""
    model_type = data.get("model_type") or _guess_model_type(data)
    if not isinstance(model_type, str):
        raise InvalidConfigError(f"model_type={model_type!r} is not a string", fix=f"use one of: {', '.join(SUPPORTED_MODEL_TYPES)}")
    if model_type == "native":
        return _validated({"name": name, **data}, source=name, keys={})
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise InvalidConfigError(
            f"unknown architecture model_type={model_type!r}",
            fix=f"use one of: {', '.join(SUPPORTED_MODEL_TYPES)}",
        )
    fields = _gpt2_fields(data) if model_type == "gpt2" else _llama_fields(data, model_type)
    keys = _GPT2_KEYS if model_type == "gpt2" else _LLAMA_KEYS | (_MIXTRAL_KEYS if model_type == "mixtral" else {})
    return _validated({"name": name, **{k: v for k, v in fields.items() if v is not None}}, source=name, keys=keys)


def _guess_model_type(data: dict[str, Any]) -> str:
    if "n_embd" in data:
        return "gpt2"
    if "num_local_experts" in data:
        return "mixtral"
    if "hidden_size" in data and "num_hidden_layers" in data:
        return "llama"
    if "num_layers" in data:
        return "native"
    raise InvalidConfigError(
        "cannot tell the architecture: no model_type and no known size keys",
        fix='add "model_type" (e.g. "llama" or "gpt2") or use a preset',
    )


def _require(data: dict[str, Any], key: str) -> Any:
    if key not in data or data[key] is None:
        raise InvalidConfigError(f"config is missing {key!r}", fix=f"add {key!r} to the config")
    return data[key]


def _gpt2_fields(data: dict[str, Any]) -> dict[str, Any]:
    hidden = _require(data, "n_embd")
    activation = data.get("activation_function", "gelu_new")
    return {
        "hidden_size": hidden,
        "num_layers": _require(data, "n_layer"),
        "num_heads": _require(data, "n_head"),
        "ffn_size": data.get("n_inner") or (4 * hidden if isinstance(hidden, int) else None),
        "vocab_size": _require(data, "vocab_size"),
        "max_position_embeddings": data.get("n_positions", 1024),
        "norm": "layernorm",
        "norm_eps": data.get("layer_norm_epsilon", 1e-5),
        "mlp": "relu" if activation == "relu" else "gelu",
        "positions": "learned",
        "tie_embeddings": data.get("tie_word_embeddings", True),
        "qkv_bias": True,
        "out_bias": True,
        "mlp_bias": True,
    }


def _llama_fields(data: dict[str, Any], model_type: str) -> dict[str, Any]:
    activation = data.get("hidden_act", "silu")
    if not isinstance(activation, str) or activation not in _GATED_ACTIVATIONS:
        raise InvalidConfigError(
            f"hidden_act={activation!r} is not supported for model_type={model_type!r}",
            fix=f"use one of: {', '.join(_GATED_ACTIVATIONS)}",
        )
    attention_bias = data.get("attention_bias", model_type == "qwen2" or model_type == "qwen2_moe")
    fields: dict[str, Any] = {
        "hidden_size": _require(data, "hidden_size"),
        "num_layers": _require(data, "num_hidden_layers"),
        "num_heads": _require(data, "num_attention_heads"),
        "num_kv_heads": data.get("num_key_value_heads"),
        "head_dim": data.get("head_dim"),
        "ffn_size": _require(data, "intermediate_size"),
        "vocab_size": _require(data, "vocab_size"),
        "max_position_embeddings": data.get("max_position_embeddings"),
        "norm": "rmsnorm",
        "norm_eps": data.get("rms_norm_eps"),
        "mlp": _GATED_ACTIVATIONS[activation],
        "positions": "rope",
        "rope_theta": data.get("rope_theta"),
        "tie_embeddings": data.get("tie_word_embeddings", False),
        "qkv_bias": attention_bias,
        # Llama's attention_bias also covers o_proj; Qwen2 puts biases on q/k/v only.
        "out_bias": attention_bias if model_type in ("llama", "mistral", "qwen3") else False,
        "rope_scaling": _rope_scaling(data),
        "sliding_window": _sliding_window(data, model_type),
    }
    if model_type == "mixtral":
        fields.update(num_experts=_require(data, "num_local_experts"), experts_per_token=_require(data, "num_experts_per_tok"))
    elif model_type in ("qwen2_moe", "qwen3_moe"):
        fields.update(
            num_experts=_require(data, "num_experts"),
            experts_per_token=_require(data, "num_experts_per_tok"),
            moe_ffn_size=_require(data, "moe_intermediate_size"),
            shared_expert_ffn_size=data.get("shared_expert_intermediate_size", 0),
        )
    return fields


def _rope_scaling(data: dict[str, Any]) -> dict[str, Any] | None:
    """The config's ``rope_scaling`` as `RopeScaling`'s fields (None when it has none)."""
    scaling = data.get("rope_scaling")
    if scaling is None:
        return None
    if not isinstance(scaling, dict):
        raise InvalidConfigError(f"rope_scaling={_short(scaling)} is not an object", fix="give rope_scaling as a JSON object or null")
    original = scaling.get("original_max_position_embeddings", data.get("original_max_position_embeddings"))
    return {"kind": scaling.get("rope_type", scaling.get("type", "unknown")), "factor": scaling.get("factor"),
            "original_max_position_embeddings": original}


def _sliding_window(data: dict[str, Any], model_type: str) -> int | None:
    """Mistral's (and Mixtral's) ``sliding_window``; Qwen's only where ``use_sliding_window`` turns it on."""
    window = data.get("sliding_window")
    if model_type in ("mistral", "mixtral") or window is None:
        return window
    if not data.get("use_sliding_window", False):
        return None
    raise UnsupportedError(f"use_sliding_window with max_window_layers={data.get('max_window_layers')} mixes full and "
                           "sliding-window layers, which the cost model does not tell apart",
                           fix="set use_sliding_window to false to plan full attention in every layer")


# The Hugging Face key each ModelConfig field is read from, so an error names the key in the user's file.
_LLAMA_KEYS = {"num_layers": "num_hidden_layers", "num_heads": "num_attention_heads", "num_kv_heads": "num_key_value_heads",
               "ffn_size": "intermediate_size", "norm_eps": "rms_norm_eps", "tie_embeddings": "tie_word_embeddings",
               "qkv_bias": "attention_bias", "out_bias": "attention_bias", "num_experts": "num_experts",
               "experts_per_token": "num_experts_per_tok", "moe_ffn_size": "moe_intermediate_size",
               "shared_expert_ffn_size": "shared_expert_intermediate_size", "rope_scaling": "rope_scaling"}
_MIXTRAL_KEYS = {"num_experts": "num_local_experts"}
_GPT2_KEYS = {"hidden_size": "n_embd", "num_layers": "n_layer", "num_heads": "n_head", "ffn_size": "n_inner",
              "max_position_embeddings": "n_positions", "norm_eps": "layer_norm_epsilon", "tie_embeddings": "tie_word_embeddings"}


def _validated(fields: dict[str, Any], *, source: str, keys: dict[str, str]) -> ModelConfig:
    try:
        return ModelConfig(**fields)
    except ValidationError as err:
        # A wrong field leaves the fields derived from it (head_dim from hidden_size) unset: report the cause.
        first = min(err.errors(), key=lambda e: e["type"] == "missing")
        where = keys.get(str(first["loc"][0]), str(first["loc"][0])) if first["loc"] else "config"
        if first["type"] == "extra_forbidden":
            raise InvalidConfigError(f"{source}: unknown field {where!r}",
                                     fix=f"remove it; the known fields are {', '.join(ModelConfig.model_fields)}") from None
        value = first.get("input")
        got = "" if value is None or isinstance(value, dict) else f" (got {_short(value)})"
        fix = f"correct {where!r} in the model config"
        if isinstance(value, (str, bool)) and first["type"] in ("int_type", "float_type"):
            fix = f"write {where!r} as a JSON number ({'no quotes' if isinstance(value, str) else 'not true/false'})"
        raise InvalidConfigError(f"{source}: {where}: {first['msg']}{got}", fix=fix) from None


def _short(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def train_config(**fields: Any) -> TrainConfig:
    """A `TrainConfig` from command-line values; a bad value is reported by its flag.

    >>> train_config(seq_len=4096).seq_len
    4096
    """
    try:
        return TrainConfig(**fields)
    except ValidationError as err:
        raise flag_error(err) from None


def default_seq_len(model: ModelConfig) -> int:
    """2048, or fewer when the model's learned position table is shorter.

    >>> default_seq_len(load_model("gpt2")), default_seq_len(load_model("llama3-8b"))
    (1024, 2048)
    """
    return min(2048, model.max_position_embeddings) if model.positions == "learned" else 2048


def model_notes(model: ModelConfig, seq_len: int) -> tuple[str, ...]:
    """What a plan of ``model`` at ``seq_len`` assumes of the model's limits: positions served by its
    ``rope_scaling``, and sliding-window attention (costed as such; `plan validate` does not lower it).

    >>> model_notes(load_model("llama3-8b"), 4096)
    ()
    """
    notes = [note] if (note := positions_note(model, seq_len)) else []
    if model.sliding_window is not None and seq_len > model.sliding_window:
        notes.append(f"sliding-window attention: each query meets the last {model.sliding_window} of {seq_len} keys, costed as "
                     "s·w − w²/2 score pairs by fused attention (a materialized score matrix is masked, not smaller); "
                     "plan validate does not lower it (the reference program attends the whole causal sequence)")
    return tuple(notes)


def positions_note(model: ModelConfig, seq_len: int) -> str | None:
    """Refuse a sequence beyond the positions ``model`` serves (`ModelConfig.max_seq_len`) in one line
    with the nearest fix; the note to print when its ``rope_scaling`` serves it (None otherwise).

    >>> positions_note(load_model("llama3-8b"), 100000)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    costmodel.errors.InvalidConfigError: seq_len=100000 exceeds llama3-8b's 8192 positions (...); fix: use --seq-len 8192 or less, ...
    """
    if seq_len <= model.max_position_embeddings:
        return None
    if seq_len > model.max_seq_len:
        scaled = f", {model.max_seq_len} with its rope_scaling" if model.max_seq_len > model.max_position_embeddings else ""
        extend = "" if model.positions is Positions.LEARNED else f", or a config whose rope_scaling serves {seq_len} tokens"
        raise InvalidConfigError(f"seq_len={seq_len} exceeds {model.name}'s {model.max_position_embeddings} positions "
                                 f"(max_position_embeddings{scaled})", fix=f"use --seq-len {model.max_seq_len} or less{extend}")
    scaling = model.rope_scaling
    return (f"seq_len {seq_len} is beyond the {model.max_position_embeddings} trained positions: served by rope_scaling "
            f"{scaling.kind} ×{scaling.factor:g} (up to {model.max_seq_len}); the step costs the same")
