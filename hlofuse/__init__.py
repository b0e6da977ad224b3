"""hlofuse: a StableHLO fusion framework for JAX.

Export StableHLO from a jitted function, rewrite it with Python passes (fusion, layout,
aliasing, cleanups), turn fused regions into Pallas kernels, and run the result through XLA.
"""

import os as _os

# The public names, loaded on first use (PEP 562): ``import hlofuse`` alone imports no jax, so
# light users of the package (the ``hlofuse`` command's supervisor, hlofuse.cli.launch) start
# fast. Name -> the module that defines it; the order is the API reference's (docs/api.md).
# The first use of any of them imports all these modules, as ``import hlofuse`` did before:
# their imports register the built-in passes (hlofuse.passes), which hlofuse.optimize, a
# PassManager and the rest need.
_API = {
    "optimize": "hlofuse.runtime.api",
    "Optimized": "hlofuse.runtime.api",
    "jit": "hlofuse.frontend.jit",
    "filter_jit": "hlofuse.frontend.filter",
    "nnx_jit": "hlofuse.frontend.nnx",
    "Lowered": "hlofuse.frontend.jit",
    "PassManager": "hlofuse.core.pipeline",
    "PIPELINES": "hlofuse.core.pipeline",
    "PassFailure": "hlofuse.core.pipeline",
    "Report": "hlofuse.core.report",
    "IRError": "hlofuse.core.ir",
    "HlofuseWarning": "hlofuse.core.report",
    "MemoryLimitError": "hlofuse.runtime.memory",
}
__all__ = list(_API)

# jax first, before anything imports jaxlib (jaxlib.mlir): ``import jax`` sets the C++ log
# level default (TF_CPP_MIN_LOG_LEVEL=1, only if the user has not set it) before jaxlib's native
# libraries read it. Importing jaxlib.mlir first leaves it at INFO, and the first backend
# initialization then prints two "I... pjrt_client.cc" lines to stderr. The package no longer
# imports jax itself, yet a submodule may be imported first (``import hlofuse.core.ir``, the
# CLI's worker), so it sets the same default here, as ``import jax`` does (jax/__init__.py).
_os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")


def __getattr__(name: str):
    if name not in _API:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib
    importlib.import_module("jax")  # before jaxlib.mlir: see above
    for n, module in _API.items():  # all of them, once: later lookups do not come here
        globals()[n] = getattr(importlib.import_module(module), n)
    return globals()[name]


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__version__ = "0.1.0"

# -- modules that moved into the layer folders (hlofuse/core, runtime, frontend, cli) -----------
# Their old paths still import (``import hlofuse.testing``, ``python -m hlofuse.tools.demo``):
# the public modules silently, the others with a DeprecationWarning naming the new path.
# Not hlofuse.jit: importing a module of that name would set the package's attribute ``jit``,
# the function, to the module.
_MOVED = {
    "hlofuse.aot": "hlofuse.runtime.aot",
    "hlofuse.api": "hlofuse.runtime.api",
    "hlofuse.chips": "hlofuse.core.chips",
    "hlofuse.compat": "hlofuse.core.compat",
    "hlofuse.config": "hlofuse.core.config",
    "hlofuse.execute": "hlofuse.runtime.execute",
    "hlofuse.filter": "hlofuse.frontend.filter",
    "hlofuse.gpu_targets": "hlofuse.core.gpu_targets",
    "hlofuse.host_callbacks": "hlofuse.runtime.host_callbacks",
    "hlofuse.hostcpu": "hlofuse.core.hostcpu",
    "hlofuse.ir": "hlofuse.core.ir",
    "hlofuse.memory": "hlofuse.runtime.memory",
    "hlofuse.nnx": "hlofuse.frontend.nnx",
    "hlofuse.ops": "hlofuse.core.ops",
    "hlofuse.pipeline": "hlofuse.core.pipeline",
    "hlofuse.report": "hlofuse.core.report",
    "hlofuse.runtime": "hlofuse.runtime.program",
    "hlofuse.target": "hlofuse.core.target",
    "hlofuse.testing": "hlofuse.runtime.testing",
    "hlofuse.tools": "hlofuse.cli",
    "hlofuse.tools.argspec": "hlofuse.runtime.argspec",
    "hlofuse.tools.autotune": "hlofuse.runtime.autotune",
    "hlofuse.tools.cli": "hlofuse.cli.main",
    "hlofuse.tools.corpus": "hlofuse.cli.corpus",
    "hlofuse.tools.demo": "hlofuse.cli.demo",
    "hlofuse.tools.formats": "hlofuse.runtime.formats",
    "hlofuse.tools.html": "hlofuse.core.report_html",
    "hlofuse.tools.module_cache": "hlofuse.runtime.module_cache",
    "hlofuse.verify": "hlofuse.runtime.verify",
}
_PUBLIC = frozenset({"hlofuse.testing", "hlofuse.aot", "hlofuse.memory", "hlofuse.config",
                     "hlofuse.tools", "hlofuse.tools.demo", "hlofuse.tools.cli",
                     "hlofuse.tools.corpus"})


class _MovedModules:
    """A meta path finder and loader that answers an old module path with the moved module."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if name not in _MOVED:
            return None
        import importlib.machinery
        import importlib.util
        # a real module of that name wins (hlofuse.runtime, once a module, is the runtime layer
        # now): the public names load lazily, so this finder can see such a name first
        here = importlib.machinery.PathFinder.find_spec(name, path)
        if here is not None and here.has_location:
            return None
        real = importlib.util.find_spec(_MOVED[name])
        # the moved file's origin: ``python -m OLD.PATH`` runs it with its own __file__
        return importlib.util.spec_from_loader(name, _MovedModules, origin=real.origin)

    @staticmethod
    def create_module(spec):
        import importlib
        new = _MOVED[spec.name]
        if spec.name not in _PUBLIC:
            import warnings
            warnings.warn(f"{spec.name} moved to {new}", DeprecationWarning, stacklevel=3)
        return importlib.import_module(new)

    @staticmethod
    def exec_module(module):
        pass

    @staticmethod
    def get_code(name):   # python -m OLD.PATH
        import importlib.util
        spec = importlib.util.find_spec(_MOVED[name])
        return spec.loader.get_code(spec.name)


if not any(f is _MovedModules for f in __import__("sys").meta_path):
    __import__("sys").meta_path.insert(0, _MovedModules)
