"""Model inputs the zoo builders share (numpy and jax only: no model library)."""

from __future__ import annotations

import numpy as np

import jax.numpy as jnp


def token_ids(rng, shape, vocab):
    """int32 token ids in ``[0, vocab)`` drawn from ``rng``."""
    return jnp.asarray(rng.integers(0, vocab, shape).astype(np.int32))


def padding_mask(batch, seq):
    """[B, S] bool: example b has its last b * S/4 positions padded (example 0 none)."""
    lengths = np.maximum(seq - (np.arange(batch) * seq) // 4, 1)
    return jnp.asarray(np.arange(seq)[None, :] < lengths[:, None])
