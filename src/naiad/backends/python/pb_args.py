"""pb_utils' argument conversions: what Triton's pybind11 bindings accept for each C++ type.

Upstream's entry points are C++ functions bound with pybind11 (python_backend `pb_stub.cc`), so
an argument is accepted when pybind11 can convert it to the declared C++ type, not when it has the
Python type a docstring names. Models rely on that: Triton's `examples/bls/sync_model.py` passes a
`bytes` element of a BYTES tensor as `model_name`. These helpers convert the same way:

| C++ type              | accepted (pybind11 with conversions on)                                 |
|-----------------------|-------------------------------------------------------------------------|
| `std::string`         | str (numpy.str_ too), bytes / bytearray (numpy.bytes_ too) as UTF-8     |
| integers              | int, bool, anything with `__index__` (numpy integers); never float, str |
| `bool`                | bool, numpy.bool_, anything with `__bool__` (ints, numpy numbers); not str, None |
| `double`              | float, int, bool, numpy numbers (`__float__` / `__index__`); not str    |
| `std::vector<T>`      | any sequence (list, tuple, numpy array) but not str / bytes itself      |

Only the standard library: pb_utils' modules also run under a model's own environment.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Mapping
from typing import Any


def as_str(value: Any, where: str) -> str:
    """`std::string`: a str, or bytes decoded as UTF-8 (pybind11 copies bytes into the string)."""
    if isinstance(value, str):
        return str(value)  # numpy.str_ and other subclasses become plain str (msgspec, json)
    if isinstance(value, bytes | bytearray):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            raise TypeError(f"{where} must be str or UTF-8 bytes, got bytes that are not UTF-8: {value!r}") from None
    raise TypeError(f"{where} must be str or bytes, got {type(value)}")


def as_int(value: Any, where: str, *, bits: int = 64, signed: bool = True) -> int:
    """A C++ integer of `bits` bits: int, bool or any integer with `__index__` (numpy integers),
    in range; a float or a str is refused, as pybind11 refuses them."""
    if value is None or isinstance(value, float | str | bytes):
        raise TypeError(f"{where} must be int, got {type(value)}")
    try:
        number = operator.index(value)
    except TypeError:
        raise TypeError(f"{where} must be int, got {type(value)}") from None
    low, high = (-(2 ** (bits - 1)), 2 ** (bits - 1)) if signed else (0, 2**bits)
    if not low <= number < high:
        kind = "a signed" if signed else "an unsigned"
        raise TypeError(f"{where} must be {kind} {bits}-bit integer, got {number}")
    return number


def as_bool(value: Any, where: str) -> bool:
    """C++ `bool`: True/False, numpy.bool_, or a number (its truth); a str, a list or None is
    refused (pybind11 asks `__bool__` of numbers only)."""
    if isinstance(value, bool):
        return value
    if value is None or isinstance(value, str | bytes | bytearray) or not hasattr(type(value), "__bool__"):
        raise TypeError(f"{where} must be bool, got {type(value)}")
    return bool(value)


def as_float(value: Any, where: str) -> float:
    """C++ `double`: a float, an int, a bool or a numpy number; a str is refused (Python's float()
    would parse it, pybind11 does not)."""
    if value is None or isinstance(value, str | bytes | bytearray):
        raise TypeError(f"{where} must be a number, got {type(value)}")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{where} must be a number, got {type(value)}") from None


def as_list(value: Any, where: str) -> list[Any]:
    """`std::vector<...>`: the items of any sequence or other iterable (list, tuple, numpy
    array, generator); a str, bytes or a dict is refused, as pybind11 refuses them."""
    if type(value) is list:  # most calls, answered before the slower checks against abstract classes
        return list(value)
    if value is None or isinstance(value, str | bytes | bytearray | Mapping) or not isinstance(value, Iterable):
        raise TypeError(f"{where} must be a list, got {type(value)}")
    return list(value)


def as_str_list(value: Any, where: str) -> list[str]:
    """`std::vector<std::string>`: a sequence of str or bytes (a numpy array of strings too)."""
    return [as_str(item, f"{where} items") for item in as_list(value, where)]
