"""Reading non-tensor columns (strings, ids) of a TensorDict as plain Python lists."""

from __future__ import annotations

from typing import Any


def as_list(value: Any) -> list:
    """A column of non-tensor values as a list, whatever tensordict wrapped it in.

    ``td.get("answer")`` may give a ``NonTensorStack`` (iterating it yields ``NonTensorData``
    wrappers), a tensorclass field gives a plain list-like; this always returns the raw values.

    Example:
        >>> from tensordict import NonTensorStack, TensorDict
        >>> as_list(TensorDict({"q": NonTensorStack("a", "b")}, [2]).get("q"))
        ['a', 'b']
    """
    if hasattr(value, "tolist"):
        return list(value.tolist())
    if isinstance(value, str):
        return [value]
    return list(value)
