"""Graph rewrites over StableHLO, one pass per file (installed as ``hlofuse.passes``).

:data:`PASSES` below is the one place the built-in passes are registered, in the order the
default pipeline first runs them (``hlofuse.core.pipeline.PIPELINES`` says why each step is
where it is). A new pass is a file here and a line in this list. See README.md in this folder
for the invariants every pass keeps.
"""

from hlofuse.core.pipeline import register_pass
from hlofuse.passes.inline_calls import InlineCalls
from hlofuse.passes.canonicalize import Canonicalize
from hlofuse.passes.cse import CSE
from hlofuse.passes.constant_fold import ConstantFold
from hlofuse.passes.algebraic_simplify import AlgebraicSimplify
from hlofuse.passes.batchnorm_fold import BatchNormFold
from hlofuse.passes.layout_assignment import LayoutAssignment
from hlofuse.passes.row_gather_scatter import RowGatherScatter
from hlofuse.passes.quantize_matmul import QuantizeMatmul
from hlofuse.passes.split_reduce import SplitReduce
from hlofuse.passes.depthwise_conv_taps import DepthwiseConvTaps
from hlofuse.passes.sink_loop_generators import SinkLoopGenerators
from hlofuse.passes.attention.remat_loop import RematLoopAttention
from hlofuse.passes.propagate_shardings import PropagateShardings
from hlofuse.passes.attention.fuse import FuseAttention
from hlofuse.passes.fold_dot_repeats import FoldDotRepeats
from hlofuse.passes.dot_f32_accumulate import DotF32Accumulate
from hlofuse.passes.conv_winograd import ConvWinograd
from hlofuse.passes.conv1x1_to_dot import Conv1x1ToDot
from hlofuse.passes.flatten_dot_dims import FlattenDotDims
from hlofuse.passes.fuse_matmul_epilogue import FuseMatmulEpilogue
from hlofuse.passes.fuse_reduction import FuseReduction
from hlofuse.passes.fuse_horizontal import FuseHorizontal
from hlofuse.passes.fuse_elementwise import FuseElementwise
from hlofuse.passes.kernelize import Kernelize
from hlofuse.passes.symbol_dce import SymbolDCE
from hlofuse.passes.int8_dot_unsigned import Int8DotUnsigned
from hlofuse.passes.buffer_aliasing import BufferAliasing

#: every built-in pass, in the order the default pipeline first runs it
PASSES = (
    InlineCalls,
    Canonicalize,
    CSE,
    ConstantFold,
    AlgebraicSimplify,
    BatchNormFold,
    LayoutAssignment,
    RowGatherScatter,
    QuantizeMatmul,
    SplitReduce,
    DepthwiseConvTaps,
    SinkLoopGenerators,
    RematLoopAttention,
    PropagateShardings,
    FuseAttention,
    FoldDotRepeats,
    DotF32Accumulate,
    ConvWinograd,
    Conv1x1ToDot,
    FlattenDotDims,
    FuseMatmulEpilogue,
    FuseReduction,
    FuseHorizontal,
    FuseElementwise,
    Kernelize,
    SymbolDCE,
    Int8DotUnsigned,
    BufferAliasing,
)

for _p in PASSES:
    register_pass(_p)
del _p
