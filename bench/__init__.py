"""hlofuse benchmarks: ``hlofuse.jit`` vs ``jax.jit``, side by side, on the platform present.

Run from the repository root::

    python -m bench                      # all workloads, >= 20 interleaved rounds each
    python -m bench --quick              # same workloads, fewer rounds (< 5 min on 2 CPU cores)
    python -m bench --models bert_s128,mlp_3x4096 --json out.json --markdown out.md --plot out.png

Layout: :mod:`bench.workloads` (every workload), :mod:`bench.runner` (the measurements),
:mod:`bench.png` (a dependency-free PNG bar chart), ``bench/__main__.py`` (the command line),
and three diagnostic scripts: :mod:`bench.first_call` (first-call time ratio on a BERT-base
layer, fresh processes), :mod:`bench.attribute` (which pass or kernel costs time: the module
with one pass disabled / one region rolled back, timed against the unrewritten module) and
:mod:`bench.xla_options` (XLA:CPU compiler-option variants per workload: the evidence behind
:mod:`hlofuse.runtime.autotune`). ``bench/attention_cpu.py`` belongs to the attention work.
"""
