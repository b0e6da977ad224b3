"""The front ends users call: ``hlofuse.jit`` (``jit``), ``hlofuse.filter_jit`` (``filter``)
and ``hlofuse.nnx_jit`` (``nnx``). They import the runtime and the layers below it."""
