"""Graph rewrites over StableHLO, one pass per file (installed as ``hlofuse.passes``).

Importing this package registers every pass with :mod:`hlofuse.core.pipeline`. See README.md in
this folder for the invariants every pass keeps.
"""

from hlofuse.passes import canonicalize as canonicalize
from hlofuse.passes import cse as cse
from hlofuse.passes import symbol_dce as symbol_dce
from hlofuse.passes import inline_calls as inline_calls
from hlofuse.passes import sink_loop_generators as sink_loop_generators
from hlofuse.passes import remat_loop_attention as remat_loop_attention
from hlofuse.passes import fuse_elementwise as fuse_elementwise
from hlofuse.passes import fuse_attention as fuse_attention
from hlofuse.passes import fold_dot_repeats as fold_dot_repeats
from hlofuse.passes import fuse_reduction as fuse_reduction
from hlofuse.passes import conv_winograd as conv_winograd
from hlofuse.passes import conv1x1_to_dot as conv1x1_to_dot
from hlofuse.passes import flatten_dot_dims as flatten_dot_dims
from hlofuse.passes import fuse_matmul_epilogue as fuse_matmul_epilogue
from hlofuse.passes import fuse_horizontal as fuse_horizontal
from hlofuse.passes import kernelize as kernelize
from hlofuse.passes import constant_fold as constant_fold
from hlofuse.passes import algebraic_simplify as algebraic_simplify
from hlofuse.passes import batchnorm_fold as batchnorm_fold
from hlofuse.passes import quantize_matmul as quantize_matmul
from hlofuse.passes import layout_assignment as layout_assignment
from hlofuse.passes import buffer_aliasing as buffer_aliasing
from hlofuse.passes import propagate_shardings as propagate_shardings
from hlofuse.passes import row_gather_scatter as row_gather_scatter
from hlofuse.passes import dot_f32_accumulate as dot_f32_accumulate
from hlofuse.passes import int8_dot_unsigned as int8_dot_unsigned
from hlofuse.passes import split_reduce as split_reduce
from hlofuse.passes import depthwise_conv_taps as depthwise_conv_taps
