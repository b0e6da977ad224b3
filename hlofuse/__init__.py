"""hlofuse: a StableHLO fusion framework for JAX.

Export StableHLO from a jitted function, rewrite it with Python passes (fusion, layout,
aliasing, cleanups), turn fused regions into Pallas kernels, and run the result through XLA.
"""

from hlofuse.api import optimize as optimize
from hlofuse.api import Optimized as Optimized
from hlofuse.jit import jit as jit
from hlofuse.jit import Lowered as Lowered
from hlofuse.pipeline import PassManager as PassManager
from hlofuse.pipeline import PIPELINES as PIPELINES
from hlofuse.pipeline import PassFailure as PassFailure
from hlofuse.report import Report as Report
from hlofuse.ir import IRError as IRError
from hlofuse.report import HlofuseWarning as HlofuseWarning

__version__ = "0.1.0"
