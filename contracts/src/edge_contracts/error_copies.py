"""How an exception the project defines copies whole: :func:`whole_reduction`.

``copy.copy``, ``copy.deepcopy`` (and so pytest, ``concurrent.futures`` and asyncio's
re-raise paths) rebuild an exception from its ``__reduce__``. The built-in one calls
``type(error)(*error.args)``: that fails, or builds a different error, for a class whose
``__init__`` takes other arguments than its message, and it runs the constructor's checks
and derivations a second time. An exception class with such an ``__init__`` defines::

    def __reduce__(self) -> tuple[object, ...]:
        return whole_reduction(self)

and its subclasses inherit it. Standard library only: a worker imports it.
"""

from __future__ import annotations

__all__ = ["whole_reduction"]


def whole_reduction(error: BaseException) -> tuple[object, ...]:
    """``error``'s reduction: rebuilt from its ``args`` and attributes, ``__init__`` not run.

    The copy has ``error``'s type, ``args`` and every attribute of its ``__dict__`` (those
    a subclass or a caller added included; ``copy.deepcopy`` copies them deeply).
    """
    cls = type(error)
    return (cls.__new__, (cls, *error.args), error.__dict__)
