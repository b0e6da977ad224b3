"""The core layer: what every other layer builds on, importing nothing of hlofuse above it.

IR helpers and the crash guard around the MLIR bindings (``ir``), the op table (``ops``), the
pass manager and its pipelines (``pipeline``), the report (``report``), targets and the chip
table (``target``, ``chips``, ``gpu_targets/``), the host CPU's features (``hostcpu``), the
settings (``config``) and every use of JAX's internals (``compat``).
"""
