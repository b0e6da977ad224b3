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
