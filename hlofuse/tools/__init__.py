"""Tools around the framework: the ``hlofuse`` command line and what it is made of.

=============  ================================================================================
``formats``    StableHLO files: format detection, load, serialize, atomic writes, ``.npz`` I/O,
               report files
``argspec``    argument types: the ``f32[8,128]`` parser, ``main``'s signature, shape refinement,
               inputs that fit, running a loaded file
``html``       the HTML page of a :class:`~hlofuse.report.Report`
``autotune``   XLA:CPU option timing for ``hlofuse.jit`` (with the foreign-load probe)
``cli``        ``hlofuse optimize|run|check|report|export`` and its crash supervisor
``demo``       ``python -m hlofuse.tools.demo``
``corpus``     the StableHLO peer-corpus hook (``hlofuse.tools.corpus:corpus_transform``)
=============  ================================================================================

The framework (``hlofuse.api``, ``hlofuse.jit``, the passes and kernels) never imports ``cli``,
``demo`` or ``corpus``; ``formats``, ``argspec``, ``html`` and ``autotune`` sit beside the front
end (``hlofuse.api`` writes its dump files with :func:`formats.atomic_write` and optimizes loaded
files with :func:`hlofuse.api.optimize_loaded`; ``hlofuse.jit`` asks ``autotune`` for XLA
options). None of them imports the root package ``hlofuse``.
"""
