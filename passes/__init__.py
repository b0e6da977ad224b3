"""Graph rewrites over StableHLO, one pass per file (installed as ``hlofuse.passes``).

Importing this package registers every pass with :mod:`hlofuse.pipeline`. See README.md in
this folder for the invariants every pass keeps.
"""

from hlofuse.passes import canonicalize as canonicalize
from hlofuse.passes import cse as cse
from hlofuse.passes import symbol_dce as symbol_dce
from hlofuse.passes import inline_calls as inline_calls
from hlofuse.passes import fuse_elementwise as fuse_elementwise
from hlofuse.passes import kernelize as kernelize
