"""Predicates for validating user arguments, shared by every module that checks them.

`True` is an `int` in Python; an argument such as `batch_size=True` is a
mistake, never a count, so both predicates refuse bools.
"""

from __future__ import annotations


def is_int(value) -> bool:
    """Whether `value` is a Python int and not a bool.

    Example:

    >>> is_int(3), is_int(True), is_int(3.0)
    (True, False, False)
    """
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value) -> bool:
    """Whether `value` is a Python int or float, not a bool and not NaN (which every comparison passes
    as False, so a range check would let it through).

    Example:

    >>> is_number(0.5), is_number(2), is_number(False), is_number("1"), is_number(float("nan"))
    (True, True, False, False, False)
    """
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value
