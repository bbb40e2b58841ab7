"""`Record`: a frozen pydantic model whose JSON, derived fields included, reads back.

Derived values are ``computed_field``s, so they appear in JSON for readers; on the way
back in they are recomputed, not accepted, so a record survives
``model_validate_json(model_dump_json())`` unchanged with ``extra="forbid"``.

>>> from pydantic import computed_field
>>> class Pair(Record):
...     a: int
...     @computed_field
...     @property
...     def twice(self) -> int:
...         return 2 * self.a
>>> Pair.model_validate_json(Pair(a=2).model_dump_json())
Pair(a=2, twice=4)
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator


class Record(BaseModel):
    """Frozen, no unknown fields, computed fields ignored on input."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _drop_derived(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if k not in cls.model_computed_fields}
        return data
