"""hlofuse: a StableHLO fusion framework for JAX.

Export StableHLO from a jitted function, rewrite it with Python passes (fusion, layout,
aliasing, cleanups), turn fused regions into Pallas kernels, and run the result through XLA.
"""

# jax first, before anything imports jaxlib (jaxlib.mlir): ``import jax`` sets the C++ log
# level default (TF_CPP_MIN_LOG_LEVEL=1, only if the user has not set it) before jaxlib's native
# libraries read it. Importing jaxlib.mlir first leaves it at INFO, and the first backend
# initialization then prints two "I... pjrt_client.cc" lines to stderr.
import jax as _jax  # noqa: F401  (import order matters; see above)

from hlofuse.api import optimize as optimize
from hlofuse.api import Optimized as Optimized
from hlofuse.jit import jit as jit
from hlofuse.filter import filter_jit as filter_jit
from hlofuse.nnx import nnx_jit as nnx_jit
from hlofuse.jit import Lowered as Lowered
from hlofuse.pipeline import PassManager as PassManager
from hlofuse.pipeline import PIPELINES as PIPELINES
from hlofuse.pipeline import PassFailure as PassFailure
from hlofuse.report import Report as Report
from hlofuse.ir import IRError as IRError
from hlofuse.report import HlofuseWarning as HlofuseWarning
from hlofuse.memory import MemoryLimitError as MemoryLimitError

__version__ = "0.1.0"
