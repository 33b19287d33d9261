"""The knobs a contract may let the search turn (int, float, choice, bool) and the constraints between them
(the global batch kept fixed whatever the micro-batch).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    field_validator,
    model_validator,
)

from infrarsi.study.contract.base import StrictModel

KnobActionClass = Literal["launch_keys", "comm_env", "data_change"]


class _KnobBase(StrictModel):
    action_class: KnobActionClass = "launch_keys"
    """Apply-policy class of a change to this knob (see ``infrarsi.verdicts.policy``)."""


def _unique(values: list[Any]) -> list[Any]:
    if not values:
        raise ValueError("choices must not be empty")
    keyed = [(type(v), v) for v in values]
    if len(set(keyed)) != len(keyed):
        raise ValueError("choices must be unique")
    return values


class IntKnob(_KnobBase):
    """An integer launch key: either a list of ``choices`` or a range ``low``..``high`` (inclusive)."""

    type: Literal["int"]
    choices: list[StrictInt] | None = None
    """Allowed values (exclusive with ``low``/``high``)."""
    low: StrictInt | None = None
    """Smallest allowed value."""
    high: StrictInt | None = None
    """Largest allowed value."""

    @model_validator(mode="after")
    def _choices_or_range(self) -> IntKnob:
        _check_choices_or_range(self.choices, self.low, self.high)
        return self

    def problem(self, value: Any) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int):
            return f"expected an int, got {type(value).__name__} {value!r}"
        return _range_problem(value, self.choices, self.low, self.high)

    def values(self) -> list[int] | None:
        """Every allowed value (``None`` for an unbounded set, which validation does not allow anyway)."""
        if self.choices is not None:
            return list(self.choices)
        if self.low is None or self.high is None:
            return None
        return list(range(self.low, self.high + 1))


class FloatKnob(_KnobBase):
    """A real-valued launch key: ``choices`` or a range ``low``..``high``."""

    type: Literal["float"]
    choices: list[StrictFloat | StrictInt] | None = None
    """Allowed values (exclusive with ``low``/``high``)."""
    low: StrictFloat | StrictInt | None = None
    """Smallest allowed value."""
    high: StrictFloat | StrictInt | None = None
    """Largest allowed value."""
    log: bool = False
    """Search the range on a log scale (requires ``low > 0``)."""

    @model_validator(mode="after")
    def _choices_or_range(self) -> FloatKnob:
        _check_choices_or_range(self.choices, self.low, self.high)
        if self.log and (self.low is None or self.low <= 0):
            raise ValueError("log: true needs low > 0")
        return self

    def problem(self, value: Any) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"expected a number, got {type(value).__name__} {value!r}"
        return _range_problem(value, self.choices, self.low, self.high)


class ChoiceKnob(_KnobBase):
    """A categorical launch key (e.g. ``attention: [manual, sdpa]``)."""

    type: Literal["choice"]
    choices: list[StrictStr | StrictBool | StrictInt | StrictFloat]
    """Allowed values; all of one type."""

    @field_validator("choices")
    @classmethod
    def _same_type(cls, value: list[Any]) -> list[Any]:
        _unique(value)
        kinds = {type(v).__name__ for v in value}
        if len(kinds) > 1:
            raise ValueError(f"choices mix types {sorted(kinds)}")
        return value

    def problem(self, value: Any) -> str | None:
        if any(type(value) is type(c) and value == c for c in self.choices):
            return None
        return f"{value!r} is not one of {self.choices}"


class BoolKnob(_KnobBase):
    """An on/off launch key (e.g. ``compile``)."""

    type: Literal["bool"]

    def problem(self, value: Any) -> str | None:
        return None if isinstance(value, bool) else f"expected a bool, got {type(value).__name__} {value!r}"


Knob = Annotated[IntKnob | FloatKnob | ChoiceKnob | BoolKnob, Field(discriminator="type")]


def _check_choices_or_range(choices: list[Any] | None, low: Any, high: Any) -> None:
    if choices is not None:
        if low is not None or high is not None:
            raise ValueError("give either choices or low/high, not both")
        _unique(choices)
        return
    if low is None or high is None:
        raise ValueError("give choices, or both low and high")
    if low > high:
        raise ValueError(f"low ({low}) is greater than high ({high})")


def _range_problem(value: float, choices: list[Any] | None, low: Any, high: Any) -> str | None:
    if choices is not None:
        return None if value in choices else f"{value!r} is not one of {choices}"
    if not low <= value <= high:
        return f"{value!r} is outside [{low}, {high}]"
    return None


class GlobalBatchConstraint(StrictModel):
    """micro-batch × gradient-accumulation × data-parallel = ``size``, fixed by the contract.

    Data-parallel is either fixed (``data_parallel``) or follows the model-parallel knobs:
    ``devices / (tp·pp·…)``, the product of the ``parallel_keys`` values, which must then be whole, with
    micro-batch × data-parallel dividing ``size``."""

    size: int = Field(ge=1)
    """Global batch in sequences per optimiser step."""
    micro_batch_key: str
    """Launch key holding the micro-batch (a knob, or fixed in the launch file)."""
    data_parallel: int = Field(default=1, ge=1)
    """Data-parallel replicas."""
    size_key: str | None = None
    """Launch key holding the global batch in the launch file (e.g. ``run.global_batch_size``); when set,
    the golden file's value must equal ``size``."""
    accumulation_key: str | None = None
    """Launch key the derived accumulation steps are written to; ``null`` when the job derives them itself
    from the global batch. When set it must be an editable launch key."""

    devices: int | None = Field(default=None, ge=1)
    """Accelerators the job runs on, when data-parallel is derived: ``devices / product(parallel_keys)``.
    ``null`` (the default): data-parallel is the fixed ``data_parallel``."""
    parallel_keys: list[str] = []
    """Launch keys of the model-parallel sizes (tensor, pipeline…) whose product divides ``devices``; knobs, or
    values fixed in the launch file. Only with ``devices``."""

    @model_validator(mode="after")
    def _one_way_to_data_parallel(self) -> GlobalBatchConstraint:
        if self.parallel_keys and self.devices is None:
            raise ValueError("parallel_keys needs devices (data-parallel = devices / their product)")
        if self.devices is not None and self.data_parallel != 1:
            raise ValueError("give data_parallel (fixed) or devices (derived), not both")
        return self

    def data_parallel_for(self, values: Mapping[str, Any]) -> int | None:
        """Data-parallel replicas under ``values`` (launch key → value, the parallel keys at least); ``None``
        when the model-parallel sizes do not divide the devices."""
        if self.devices is None:
            return self.data_parallel
        model_parallel = 1
        for key in self.parallel_keys:
            value = values.get(key, 1)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                return None
            model_parallel *= value
        return self.devices // model_parallel if self.devices % model_parallel == 0 else None

    def problem(self, values: Mapping[str, Any]) -> str | None:
        """Why ``values`` (the micro-batch and parallel keys) break the constraint; ``None`` when they keep it."""
        dp = self.data_parallel_for(values)
        if dp is None:
            sizes = " x ".join(f"{k}={values.get(k, 1)!r}" for k in self.parallel_keys)
            return f"{sizes} does not divide {self.devices} devices"
        mb = values.get(self.micro_batch_key)
        if isinstance(mb, bool) or not isinstance(mb, int) or mb <= 0 or self.size % (mb * dp):
            return f"{self.micro_batch_key}: {mb!r} x data-parallel {dp} does not divide global batch {self.size}"
        return None

    def accumulation(self, micro_batch: int, data_parallel: int | None = None) -> int:
        return self.size // (micro_batch * (data_parallel or self.data_parallel))


class Constraints(StrictModel):
    """Relations between knobs that every candidate must keep."""

    global_batch: GlobalBatchConstraint | None = None
    """Keeps tokens per optimiser step fixed whatever the micro-batch."""
