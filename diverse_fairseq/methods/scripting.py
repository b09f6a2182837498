"""TorchScript support for subclasses of fairseq modules.

fairseq exports models and scripts its ``SequenceGenerator`` with ``torch.jit.script``, which compiles each
module's ``forward`` and the methods it calls. TorchScript compiles neither ``super().forward(...)`` nor a call
of an unbound base-class method, so a subclass that overrides ``forward`` and falls back on the stock one
reaches it through :func:`inherited_as` (docs/fairseq-notes.md#torchscript).
"""

from types import FunctionType

__all__ = ["inherited_as"]


def inherited_as(function: FunctionType, name: str, cls: type) -> FunctionType:
    """The method ``function`` of a base class of ``cls``, as a method ``name`` that ``cls`` can call and
    TorchScript can compile: the same code, defaults and annotations under a name of its own (TorchScript
    compiles a method under its ``__name__``, and ``cls`` has its own ``forward``), with the base class's name
    bound to ``cls`` inside it (TorchScript resolves ``Base.static_method(...)`` only for the class it compiles).

    Usage, after the class body: ``Sub._stock_forward = inherited_as(Base.forward, "_stock_forward", Sub)``.
    """
    if not isinstance(function, FunctionType):
        raise TypeError(f"inherited_as needs a plain function (a method of a base class), got {function!r}")
    base = function.__qualname__.rsplit(".", 1)[0]
    if not any(klass.__qualname__ == base for klass in cls.__mro__[1:]):
        raise ValueError(f"{function.__qualname__} is not a method of a base class of {cls.__qualname__}")
    scope = {**function.__globals__, base: cls}
    renamed = FunctionType(function.__code__, scope, name, function.__defaults__, function.__closure__)
    renamed.__kwdefaults__ = function.__kwdefaults__
    renamed.__annotations__ = dict(function.__annotations__)
    renamed.__qualname__ = f"{cls.__qualname__}.{name}"
    renamed.__module__ = function.__module__
    renamed.__doc__ = function.__doc__
    return renamed
