"""Running a StableHLO module: compile it with XLA on a backend and run ``@main`` on numpy inputs.

The one way hlofuse executes a module outside ``jax.jit``: verification (:mod:`hlofuse.runtime.verify`),
the fuzz oracle, the command line (``hlofuse run``/``check``/``optimize --verify``, through
:func:`hlofuse.runtime.argspec.execute`) and the tests all come here. ::

    outs = run_module(module, [x, y], target="cpu")

Modules with Python host callbacks are refused before compiling: their callback pointers belong
to the process that traced them, and calling a stale one segfaults.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

import jax
import jax.extend as jex
from jaxlib.mlir import ir

from hlofuse.core import ir as hir
from hlofuse.core.target import Target

__all__ = ["backend_for", "compile_module", "run_compiled", "run_module"]

def backend_for(target: Target | str):
    """The XLA client that runs ``target`` in this process, or None when it is absent."""
    try:
        return jex.backend.get_backend(Target.of(target).backend)
    except RuntimeError:   # "Unknown backend": not in this process
        return None


#: XLA's debug options that make a compile compute every op at its declared type: with
#: ``xla_allow_excess_precision`` (XLA's default) a pair of converts f32 -> bf16 -> f32 may be
#: dropped, so an op computed in f32 and rounded to bf16 feeds the next one unrounded
EXACT_PRECISION = {"xla_allow_excess_precision": False}


def compile_module(module, backend, *, source: str = "verify", exact: bool = False):
    """Compile ``module`` (``ir.Module``, text or bytecode) for the first device of ``backend``.

    ``exact``: compile with :data:`EXACT_PRECISION` (each op's result rounded to its type, as
    the module says), instead of the options every ``jax.jit`` compile gets.
    Returns ``(executable, device)``; raises whatever XLA raises. An ``ir.Module`` with host
    callbacks raises :class:`hlofuse.core.ir.IRError` naming ``source``.
    """
    if isinstance(module, ir.Module):
        hir.check_no_host_callbacks(module, source=source)  # a stale callback pointer segfaults
    payload = hir.to_bytecode(module) if isinstance(module, ir.Module) else module
    dev = backend.local_devices()[0]
    exe = backend.compile_and_load(payload, [dev], jex.backend.get_compile_options(
        num_replicas=1, num_partitions=1,
        env_options_overrides=dict(EXACT_PRECISION) if exact else None))
    return exe, dev


def run_compiled(exe, device, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Run a compiled ``@main`` once on ``device``; returns the flat outputs as numpy arrays."""
    with jax.ensure_compile_time_eval():  # we may be called while JAX traces (grad, vmap)
        args = [jax.device_put(np.asarray(x), device) for x in inputs]
    res = exe.execute_sharded(args)
    return [np.asarray(a[0]) for a in res.disassemble_into_single_device_arrays()]


def run_module(module, inputs: Sequence[np.ndarray], *, target: str = "cpu",
               backend=None, exact: bool = False) -> list[np.ndarray]:
    """Compile ``module`` (``ir.Module``, text or bytecode) with XLA and run ``@main`` once.

    Args:
      module: the module to run.
      inputs: one array per argument of ``@main``.
      target: 'cpu', 'gpu' or 'tpu'; the backend that runs it (ignored when ``backend`` is given).
      backend: an XLA client to use instead.
      exact: compile with :data:`EXACT_PRECISION` (see :func:`compile_module`).

    Raises whatever XLA raises (compile or runtime errors); callers decide what it means.
    """
    be = backend or backend_for(target)
    if be is None:
        raise RuntimeError(f"no {target} device in this process")
    exe, dev = compile_module(module, be, exact=exact)
    return run_compiled(exe, dev, inputs)
