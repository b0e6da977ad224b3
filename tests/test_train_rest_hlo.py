"""On cpu, hlofuse's rewrite of a pre-norm MLP training step (layernorm, GELU MLP, rmsnorm,
value and gradients) compiles to XLA's own program, instruction for instruction: the matmul
epilogue, layernorm and elementwise kernels are single-step StableHLO that XLA:CPU fuses as it
would the original ops, and the cpu policy keeps the rewrites that measured slower there
(row-gather-scatter, column reductions) off. So the step's time ratio to jax.jit is 1.0 up to
noise (``python -m bench.train_rest --workloads norm_mlp --compare-hlo`` at the bench size)."""

from __future__ import annotations

from bench.train_rest import compare_step_hlo, make


def test_norm_mlp_step_compiles_to_the_same_xla_instructions_as_jax_jit():
    loss, args = make("norm_mlp", norm_mlp_sizes=(256, 128, 512))
    got = compare_step_hlo(loss, args)
    assert got["kernels"] >= 5          # the rewrite fired: epilogues, norms, elementwise
    assert got["only_jax"] == {} and got["only_hlofuse"] == {}
