"""One Triton kernel, two ways to run it: compiled for GPU tensors, interpreted for CPU tensors.

``@triton.jit`` picks how a kernel runs once, when Triton is imported: compiled, unless the
``TRITON_INTERPRET=1`` environment variable was set before, in which case every launch runs in
Triton's interpreter. One process often holds both kinds of tensors (the tests on a GPU machine;
a user checking the GPU path on a CPU with ``kernels="triton"`` next to a CUDA run), so a
process-wide switch either hands CPU tensors to a compiled kernel (``ValueError: Pointer
argument ... cannot be accessed from Triton (cpu tensor?)``) or interprets CUDA tensors.

:func:`device_kernel` replaces ``@triton.jit``: the kernel is launched the same way
(``kernel[grid](*args, **meta)``) and each launch picks by where its first tensor argument is,
whatever ``TRITON_INTERPRET`` says:

- a CUDA (any non-CPU) tensor: the compiled kernel (``JITFunction(fn)``, built on first use);
  the per-launch cost over a plain ``@triton.jit`` kernel is one device check and one attribute
  read (nothing is allocated, nothing else is inspected);
- a CPU tensor: Triton's interpreter (``InterpretedFunction``, built on first use), which runs
  every program of the grid one after another as numpy code. It is a correctness check of the
  exact GPU code path (same kernel source, same masks, same launchers), not a fast path: a launch
  takes milliseconds to seconds (:mod:`graphkv.runtime.ops.torch_ops` is the fast CPU path).

Tensor arguments on different devices raise :class:`~graphkv.errors.SpecError` naming the kernel,
each argument's device and the fix (on the compiled path checked only when the launch fails, so
that a launch that works pays nothing for it; two different CUDA devices are not told apart).

``@triton.jit`` functions called from a kernel body — helpers of one's own, and many of
``triton.language``'s (``tl.zeros``, ``tl.sum``, ``tl.max``, ...) — can only be called by the
compiler; under ``TRITON_INTERPRET=1`` Triton builds them interpreted at import instead. For the
duration of an interpreted launch, calling a ``JITFunction`` runs an interpreted copy of it, so
helpers work without the environment variable; helpers stay ``@triton.jit`` (the compiler only
inlines ``JITFunction`` globals). Afterwards every attribute of ``JITFunction`` and of the
``triton.language`` modules and classes is as before (a nested interpreted call leaves Triton's
builtin patches behind, which would break every later compile in the process; only the names the
interpreter adds to a module's globals for its cached rewrites stay), so CPU and CUDA launches
can alternate in one process. As with Triton's own interpreter, an interpreted launch must not
overlap a compile in another thread.

Example::

    @device_kernel
    def _double_kernel(x_ptr, N, TILE: tl.constexpr):  # x_ptr: [N] float32
        i = tl.program_id(0) * TILE + tl.arange(0, TILE)
        tl.store(x_ptr + i, 2 * tl.load(x_ptr + i, mask=i < N), mask=i < N)

    _double_kernel[(triton.cdiv(n, 64),)](x, n, TILE=64)  # x on cuda: compiled; on cpu: interpreted
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import sys
import types
from typing import Any, Callable, Iterator

import torch
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction, KernelInterface

from graphkv.errors import GraphkvError, Problem, SpecError
from graphkv.versions import release

__all__ = ["DeviceKernel", "device_kernel"]

_MISSING = object()  # an attribute absent before a launch


class DeviceKernel(KernelInterface):
    """A Triton kernel launched compiled on GPU tensors and in Triton's interpreter on CPU tensors.

    Built by :func:`device_kernel`; launched like a ``JITFunction``: ``kernel[grid](*args,
    **meta)``. ``fn`` is the undecorated Python function (the kernel source). The compiled and
    interpreted forms are built on first use and kept on the object (:attr:`compiled`,
    :attr:`interpreted`).
    """

    def __init__(self, fn: Callable[..., Any], *, do_not_specialize: tuple[str, ...] = ()) -> None:
        self.fn = fn
        self.arg_names: tuple[str, ...] = tuple(inspect.signature(fn).parameters)
        assert set(do_not_specialize) <= set(self.arg_names), (fn.__name__, do_not_specialize)
        self.do_not_specialize = do_not_specialize
        self._compiled: KernelInterface | None = None
        self._interpreted: InterpretedFunction | None = None
        # Python function of each @triton.jit helper called while interpreting -> its interpreted copy.
        self._interpreted_helpers: dict[Callable[..., Any], InterpretedFunction] = {}

    @property
    def __name__(self) -> str:
        return self.fn.__name__

    def __repr__(self) -> str:
        return f"DeviceKernel({self.fn.__module__}.{self.fn.__qualname__})"

    @property
    def compiled(self) -> KernelInterface:
        """What runs GPU tensors, built on first use: the compiled kernel (``JITFunction(fn)``, what
        ``@triton.jit`` builds without ``TRITON_INTERPRET``; its ``do_not_specialize`` integers
        compile one kernel whatever their value). Only when ``TRITON_INTERPRET=1`` was
        set before Triton was imported is it :attr:`interpreted`: Triton then builds
        ``triton.language`` itself for its interpreter, so no kernel can compile in that process
        and GPU tensors are interpreted (copied to the host and back) as ``@triton.jit`` would."""
        if self._compiled is None:
            self._compiled = (self.interpreted if _language_is_interpreted()
                              else JITFunction(self.fn, do_not_specialize=list(self.do_not_specialize)))
        return self._compiled

    @property
    def interpreted(self) -> InterpretedFunction:
        """The kernel in Triton's interpreter, built on first use. It runs with a copy of the
        kernel's module globals (the interpreter adds its own names to the globals it runs in),
        so the kernel's module is left as it is."""
        if self._interpreted is None:
            fn = self.fn
            copy = types.FunctionType(fn.__code__, dict(fn.__globals__), fn.__name__, fn.__defaults__,
                                      fn.__closure__)
            copy.__kwdefaults__, copy.__annotations__ = fn.__kwdefaults__, dict(fn.__annotations__)
            copy.__module__, copy.__qualname__, copy.__doc__ = fn.__module__, fn.__qualname__, fn.__doc__
            self._interpreted = InterpretedFunction(copy)
        return self._interpreted

    def run(self, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
        """Launch over ``grid`` (what ``kernel[grid](*args, **kwargs)`` calls): compiled when the
        first tensor argument is not on the CPU (or there is none, e.g. a ``warmup`` with dtype
        placeholders), on that tensor's device (made current for the launch when it is not), interpreted
        when it is on the CPU. Raises :class:`SpecError` when the tensor
        arguments are on different devices."""
        first = _first_tensor(args, kwargs)
        if first is None or not first.is_cpu:
            compiled = self._compiled
            if compiled is None:
                compiled = self.compiled
            try:
                if first is not None and first.is_cuda and first.get_device() != torch.cuda.current_device():
                    # Triton launches on the current device: a pool on cuda:1 while cuda:0 is current would
                    # hand device-1 pointers to a device-0 launch
                    with torch.cuda.device(first.device):
                        return compiled.run(*args, grid=grid, warmup=warmup, **kwargs)
                return compiled.run(*args, grid=grid, warmup=warmup, **kwargs)
            except Exception as error:
                # Only a failed launch pays for the scan: a CPU tensor among CUDA ones fails here.
                self._check_one_device(args, kwargs, cause=error)
                raise
        self._check_one_device(args, kwargs)
        interpreted = self.interpreted
        try:
            with _jit_functions_interpreted(self._interpreted_helpers):
                return interpreted.run(*args, grid=grid, warmup=warmup, **kwargs)
        except Exception as error:
            _refuse_old_interpreter_with_new_numpy(self.__name__, error)
            raise

    def _check_one_device(self, args: tuple, kwargs: dict, cause: BaseException | None = None) -> None:
        """Raise :class:`SpecError` (from ``cause``) unless every tensor argument is on one device."""
        named = [*zip(self.arg_names, args), *kwargs.items()]
        devices = {name: str(t.device) for name, t in named if isinstance(t, torch.Tensor)}
        if len(set(devices.values())) <= 1:
            return
        first_name, first_device = next(iter(devices.items()))
        others = [name for name, device in devices.items() if device != first_device]
        raise SpecError(Problem(
            field=f"{self.__name__} devices", value=devices,
            limit="every tensor argument of one launch must be on one device (CPU tensors run in Triton's "
                  "interpreter, CUDA tensors in the compiled kernel)",
            fix=f"move {', '.join(others)} to {first_device} (where {first_name} is), or all of them to one "
                f"device")) from cause


def device_kernel(fn: Callable[..., Any] | None = None, *,
                  do_not_specialize: tuple[str, ...] = ()) -> Any:
    """Decorate a Triton kernel like ``@triton.jit``; launches on CPU tensors run in Triton's
    interpreter and launches on CUDA tensors run compiled, independent of ``TRITON_INTERPRET``
    (see :class:`DeviceKernel`). Helpers it calls stay ``@triton.jit``.

    ``do_not_specialize``: integer arguments Triton must not specialise on (it compiles a kernel
    apart for a value of 1 and for multiples of 16): for a kernel launched outside a captured graph
    with a per-step count, so that a count seen for the first time mid-serving compiles nothing.
    ``@device_kernel(do_not_specialize=("NUM_ENTRIES",))`` returns the decorator.

    >>> @device_kernel
    ... def _fill_kernel(out_ptr, VALUE: tl.constexpr):  # out_ptr: [1] int32
    ...     tl.store(out_ptr, VALUE)
    >>> _fill_kernel[(1,)](torch.zeros(1, dtype=torch.int32), VALUE=7)
    """
    if fn is None:
        return lambda f: DeviceKernel(f, do_not_specialize=do_not_specialize)
    return DeviceKernel(fn, do_not_specialize=do_not_specialize)


_OLD_INTERPRETER_ERROR = "only 0-dimensional arrays can be converted to Python scalars"


def _refuse_old_interpreter_with_new_numpy(kernel: str, error: Exception) -> None:
    """Raise :class:`GraphkvError` (from ``error``) when an interpreted launch failed because the installed Triton's
    interpreter and numpy do not work together: Triton 3.6's interpreter turns a scalar argument into a one-element
    array and reads it back with ``int()`` (a loop bound, ``range(0, n, TILE)``), which numpy 2.4 refuses (earlier
    numpy only warned; Triton 3.9 squeezes the array first). Only that message with numpy 2.4 or later and a Triton
    before 3.9; anything else: return (the caller re-raises the error as it is)."""
    import numpy
    import triton

    if (_OLD_INTERPRETER_ERROR not in str(error) or release(numpy.__version__) < (2, 4)
            or release(triton.__version__) >= (3, 9)):
        return
    raise GraphkvError(Problem(
        field="numpy", value=numpy.__version__,
        limit=f"Triton {triton.__version__}'s interpreter (how {kernel} runs on CPU tensors) reads scalar arguments "
              f"with int() of a one-element array, which numpy 2.4 and later refuse",
        fix="pip install 'numpy<2.4', or a newer Triton (3.9 works), or kernels='torch' on a CPU")) from error


def _first_tensor(args: tuple, kwargs: dict) -> torch.Tensor | None:
    """The first tensor among the positional, then the keyword arguments (usually ``args[0]``)."""
    for arg in args:
        if isinstance(arg, torch.Tensor):
            return arg
    for arg in kwargs.values():
        if isinstance(arg, torch.Tensor):
            return arg
    return None


def _language_is_interpreted() -> bool:
    """Whether ``triton.language`` was built for the interpreter (``TRITON_INTERPRET=1`` at import)."""
    return isinstance(getattr(tl, "zeros", None), InterpretedFunction)


@contextlib.contextmanager
def _jit_functions_interpreted(helpers: dict) -> Iterator[None]:
    """For one interpreted launch: calling a ``JITFunction`` (``tl.zeros(...)``, ``x.sum()``, a
    helper of one's own) runs its interpreted copy (kept in ``helpers`` by Python function; a
    ``JITFunction`` hashes its source), then ``JITFunction`` and every ``triton.language`` module
    and class get back exactly the attributes they had."""

    def call(jit_fn: JITFunction, *args: Any, **kwargs: Any) -> Any:
        interpreted = helpers.get(jit_fn.fn)
        if interpreted is None:
            interpreted = helpers[jit_fn.fn] = InterpretedFunction(jit_fn.fn)
        return interpreted(*args, **kwargs)

    def bind(jit_fn: JITFunction, instance: Any, owner: type | None = None) -> Any:
        # ``x.sum()``: tl.tensor's member functions are the JITFunctions themselves.
        return jit_fn if instance is None else functools.partial(call, jit_fn, instance)

    saved = [(obj, dict(vars(obj))) for obj in (JITFunction, *_language_objects())]
    try:
        JITFunction.__call__ = call
        JITFunction.__get__ = bind
        yield
    finally:
        for obj, before in saved:
            _restore_attributes(obj, before)


def _language_objects() -> list[Any]:
    """The loaded ``triton.language`` modules and the classes they define: what the interpreter
    patches while it runs (and, after a nested interpreted call, leaves patched)."""
    modules = [m for name, m in list(sys.modules.items())
               if m is not None and (name == "triton.language" or name.startswith("triton.language."))]
    seen = {id(m) for m in modules}
    objects: list[Any] = list(modules)
    for module in modules:
        for value in list(vars(module).values()):
            if isinstance(value, type) and id(value) not in seen \
                    and getattr(value, "__module__", "").startswith("triton.language"):
                seen.add(id(value))
                objects.append(value)
    return objects


def _restore_attributes(obj: Any, before: dict) -> None:
    """Put back every attribute of ``obj`` that differs from ``before``; on a class also remove the
    ones added since (names added to a module stay: they are globals the interpreter added for the
    cached rewrites of that module's functions)."""
    now = vars(obj)
    if isinstance(obj, type):
        for name in [n for n in now if n not in before]:
            delattr(obj, name)
    for name, value in before.items():
        if now.get(name, _MISSING) is not value:
            setattr(obj, name, value)
