"""The built-in hardware profiles by name, and `load_hardware`: a name or a user's JSON file → `ClusterSpec`.

>>> load_hardware("a100-80gb").devices_per_node
8
>>> "dgx-h100" in list_hardware()
True
"""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from costmodel.errors import InvalidConfigError, first_problem, read_user_file, unknown_name_error
from costmodel.hardware.clusters import HARDWARE
from costmodel.hardware.profile import ClusterSpec, DeviceSpec


def list_hardware() -> list[str]:
    """Names of the built-in profiles: part names (``h100-sxm``) and cluster presets (``dgx-h100``)."""
    return sorted(HARDWARE)


def known_devices() -> dict[str, DeviceSpec]:
    """The built-in devices by name, for a cluster file's ``"device": "h100-sxm"``."""
    return {cluster.device.name: cluster.device for cluster in HARDWARE.values()}


def load_hardware(name_or_path: str, *, devices_per_node: int | None = None) -> ClusterSpec:
    """A built-in profile by name, or a `ClusterSpec` JSON file; ``devices_per_node`` overrides
    (see `ClusterSpec.with_devices_per_node`).

    Raises:
      InvalidConfigError: unknown name (the known ones are listed; for a prefix such as
        ``alvis``, the presets it begins), missing file, or a
        file that is not a valid profile (the first problem named by its field).
    """
    known = HARDWARE
    if name_or_path in known:
        cluster = known[name_or_path]
    else:
        path = Path(name_or_path)
        family = [name for name in list_hardware() if name.startswith(f"{name_or_path}-")]
        if family and not path.is_file():  # e.g. 'alvis': a site with several node types
            raise InvalidConfigError(f"hardware {name_or_path!r} has several node types", fix=f"name one: {', '.join(family)}")
        if not path.is_file():
            raise unknown_name_error("hardware", name_or_path, list_hardware(), otherwise="a profile JSON path or ")
        try:
            cluster = ClusterSpec.model_validate_json(read_user_file(path, "hardware profile"),
                                                    context={"devices": known_devices()})
        except ValidationError as err:
            where, msg, _ = first_problem(err)
            raise InvalidConfigError(f"{name_or_path}: {where or 'profile'}: {msg}",
                                     fix="see docs/clusters.md 'Describing a cluster' (costmodel.hardware.profile.ClusterSpec)") from None
    return cluster if devices_per_node is None else cluster.with_devices_per_node(devices_per_node)
