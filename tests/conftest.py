"""Shared pytest setup: deterministic seeds, CPU platform."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np
import pytest


@pytest.fixture
def rng():
    return np.random.default_rng(0)

os.environ.setdefault("HLOFUSE_AUTOTUNE", "0")  # no timing-based tuning inside unit tests
os.environ.setdefault("HLOFUSE_MODULE_CACHE", "0")  # no optimized modules from earlier runs
# elementwise regions are the suite's smallest kernels (kernelize, verify, jit front end); on cpu
# the cost model leaves them to XLA by default, so ask for them (tests of that rule unset this)
os.environ.setdefault("HLOFUSE_CPU_ELEMENTWISE_KERNELS", "1")
# first calls build hlofuse's module in place, so every test's first call runs it (tiered
# first calls, XLA's code while the module builds in the background, have tests/test_tiered.py)
os.environ.setdefault("HLOFUSE_TIERED", "0")
