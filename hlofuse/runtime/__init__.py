"""The runtime layer: from an exported module to something that runs, below the front ends.

Optimizing a module (``api.optimize``), building a function's program and re-injecting it
into jax (``program``), verification (``verify``), execution (``execute``), host callbacks,
tuning and its decisions (``autotune``), the module cache (``module_cache``), peak memory
(``memory``), compiling for chips without one (``aot``) and the numerical test helpers
(``testing``). It imports the core, the kernels and the passes, never the front ends or the
command line.
"""
