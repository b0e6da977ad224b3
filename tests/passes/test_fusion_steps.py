"""The three fusion steps, each on its own: predicates (pure), region formation (cycle-safe),
outlining (commit + cost-model marking), plus the cost model's numbers and decisions."""

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jaxlib.mlir import ir

from hlofuse.core import ir as hir
from hlofuse.core.ops import OpClass
from hlofuse.passes.fusion import cost
from hlofuse.kernels import support as S
from hlofuse.passes.fusion import predicates as P
from hlofuse.passes.fusion.outline import KIND_ATTR, XLA_ATTR
from hlofuse.passes.fusion.regions import BlockGraph, grow_region, merge_siblings
from hlofuse.core.pipeline import PassContext
from hlofuse.runtime.testing import ALL_KERNELS

F32 = np.float32


def module_of(fn, *shapes, dtype=F32):
    args = [jax.ShapeDtypeStruct(s, dtype) for s in shapes]
    text = jax.jit(fn).lower(*args).as_text()
    m = hir.parse(text)
    hir.inline_all_calls(m)
    hir.run_upstream_passes(m, "builtin.module(symbol-dce,cse)")
    return m, [o for o in hir.block_ops(hir.main_func(m).regions[0].blocks[0]) if o.name != "func.return"]


def first(ops, name, k=0):
    return [o for o in ops if o.name == name][k]


# -- step 1: predicates ------------------------------------------------------------------------

def test_role_table_is_data():
    assert P.ROLE_TABLE["reduction"][OpClass.REDUCTION] == P.Role.ANCHOR
    assert P.ROLE_TABLE["matmul_epilogue"][OpClass.DOT] == P.Role.ANCHOR
    assert P.ROLE_TABLE["matmul_epilogue"][OpClass.ELEMENTWISE] == P.Role.EPILOGUE
    assert OpClass.OPAQUE not in P.ROLE_TABLE["reduction"]


def test_reduction_anchor_rules():
    m, ops = module_of(lambda x: (x.sum(-1), x.max(0), jnp.argmax(x, -1)), (4, 8))
    reduces = [o for o in ops if o.name == "stablehlo.reduce"]
    assert P.reduction_anchor(reduces[0], "cpu") is None
    assert "not the last dim" in P.reduction_anchor(reduces[1], "cpu")
    assert "variadic" in P.reduction_anchor(reduces[2], "cpu")
    m2, ops2 = module_of(lambda x: x.sum(-1), (2, 32768))
    assert P.reduction_anchor(first(ops2, "stablehlo.reduce"), "cpu") is None
    from hlofuse.kernels import tiling
    n = tiling.max_tiled_row_elems("gpu")  # one limit: the predicate asks the tiling
    # rows longer than a gpu row block (16k) are walked in column tiles (kernels/row_tiled.py)
    assert 32768 > tiling.max_row_elems("gpu")
    assert P.reduction_anchor(first(ops2, "stablehlo.reduce"), "gpu") is None
    m3, ops3 = module_of(lambda x: x.sum(-1), (1, n))
    assert P.reduction_anchor(first(ops3, "stablehlo.reduce"), "gpu") is None
    m4, ops4 = module_of(lambda x: x.sum(-1), (1, 2 * n))
    assert "on-chip row limit" in P.reduction_anchor(first(ops4, "stablehlo.reduce"), "gpu")


def test_dot_layout_and_anchor():
    m, ops = module_of(lambda x, w: (x @ w, x @ w.T[:, :16].T.T), (2, 8, 16), (16, 16))
    d = first(ops, "stablehlo.dot_general")
    assert S.dot_layout(d) == {"nb": 0, "lhs_t": False, "rhs_t": False}
    assert P.dot_anchor(d, "tpu") is None
    m, ops = module_of(lambda q, k: jnp.einsum("bqd,bkd->bqk", q, k), (2, 8, 4), (2, 8, 4))
    assert S.dot_layout(first(ops, "stablehlo.dot_general")) == {"nb": 1, "lhs_t": False, "rhs_t": True}
    m, ops = module_of(lambda a, b: jnp.einsum("ijk,jkl->il", a, b), (3, 4, 5), (4, 5, 6))
    assert "not canonical" in P.dot_anchor(first(ops, "stablehlo.dot_general"), "gpu")


def test_prologue_and_epilogue_members():
    m, ops = module_of(lambda x, w, y: (x.astype(jnp.bfloat16) * 2 @ w.astype(jnp.bfloat16), x * y),
                       (4, 8), (8, 8), (4, 8))
    conv = first(ops, "stablehlo.convert")
    assert S.prologue_member(conv, "gpu") is None
    muls = [o for o in ops if o.name == "stablehlo.multiply"]
    by_scalar = [o for o in muls if any(S.is_scalar_operand(v) for v in o.operands)][0]
    by_tensor = [o for o in muls if not any(S.is_scalar_operand(v) for v in o.operands)][0]
    assert S.prologue_member(by_scalar, "gpu") is None
    assert "non-scalar" in S.prologue_member(by_tensor, "gpu")
    assert P.epilogue_member(by_tensor, "gpu") is None
    assert P.epilogue_member(first(ops, "stablehlo.dot_general"), "gpu") is not None


def test_view_classes_disambiguate_rows_equal_cols():
    # rows == cols == 8: a bias (col) and a per-row statistic (row) have the same shape (8,)
    m, ops = module_of(lambda x, b: (x - x.mean(-1, keepdims=True)) + b, (8, 8), (8,))
    cls = S.view_classes(ops, S.View(8, 8))
    entry = hir.main_func(m).regions[0].blocks[0]
    assert cls[entry.arguments[0]] == S.FULL
    assert cls[entry.arguments[1]] == S.COL
    assert cls[first(ops, "stablehlo.reduce").results[0]] == S.ROW


def test_view_classes_refuse_transposed_use():
    m, ops = module_of(lambda x, r: x - r[None, :], (8, 4), (4,))  # broadcast over rows: a col
    S.view_classes(ops, S.View(8, 4))
    m, ops = module_of(lambda x, r: x - r[:, None], (8, 4), (8,))  # per-row: a row
    cls = S.view_classes(ops, S.View(8, 4))
    assert cls[hir.main_func(m).regions[0].blocks[0].arguments[1]] == S.ROW
    m, ops = module_of(lambda x: x.T * 2.0, (8, 4))
    with pytest.raises(S.ClassError):
        S.view_classes(ops, S.View(4, 8))


# -- step 2: region formation ------------------------------------------------------------------

def test_grow_region_refuses_cycles():
    def fn(x, w):
        s = x.sum(-1, keepdims=True)
        t = jnp.tanh(x / s) @ w             # the dot is outside any reduction region
        return (s + t) * 2.0                 # reads the region (s) and the dot: a cycle
    m, ops = module_of(fn, (4, 8), (8, 8))
    g = BlockGraph(ops)
    anchor = first(ops, "stablehlo.reduce")
    admit = lambda c, members, d: None if c.name != "stablehlo.dot_general" else "dot"  # noqa: E731
    members, refused = grow_region(g, anchor, admit)
    assert first(ops, "stablehlo.tanh") in members
    add = first(ops, "stablehlo.add")
    assert add not in members and "cycle" in refused[add]
    assert g.is_convex(members)
    assert not g.is_convex(set(members) | {add})


def _random_block(rng, n):
    """A random DAG of ``n`` elementwise ops over two arguments, one of them a while loop
    whose body reads a value of the block (a use the block graph maps to the loop)."""
    vals, lines = ["%a", "%b"], []
    t = "tensor<4xf32>"
    for i in range(n):
        if i == n // 2:
            cap = vals[rng.integers(len(vals))]
            lines.append(f"%v{i}:2 = stablehlo.while(%it = %a, %k = {vals[-1]}) : {t}, {t}\n"
                         f"  cond {{\n    %c = stablehlo.constant dense<false> : tensor<i1>\n"
                         f"    stablehlo.return %c : tensor<i1>\n  }} do {{\n"
                         f"    %s = stablehlo.add %k, {cap} : {t}\n"
                         f"    stablehlo.return %it, %s : {t}, {t}\n  }}")
            vals.append(f"%v{i}#1")
            continue
        x, y = (vals[j] for j in rng.integers(len(vals), size=2))
        lines.append(f"%v{i} = stablehlo.{'add' if rng.random() < .5 else 'multiply'} {x}, {y} : {t}")
        vals.append(f"%v{i}")
    body = "\n".join(lines) + f"\nreturn {vals[-1]} : {t}"
    return f"func.func @main(%a: {t}, %b: {t}) -> {t} {{\n{body}\n}}"


def test_incremental_convexity_matches_the_full_check():
    """grow_region's one-op check (BlockGraph.stays_convex) decides as is_convex of the grown
    set on random DAGs (with a loop capturing a block value), so regions are unchanged."""
    rng = np.random.default_rng(0)
    checked = refused = 0
    for trial in range(25):
        m = hir.parse(_random_block(rng, 24))
        ops = [o for o in hir.block_ops(hir.main_func(m).regions[0].blocks[0]) if o.name != "func.return"]
        g = BlockGraph(ops)
        members = {ops[rng.integers(len(ops))]}
        for _ in range(40):
            c = ops[rng.integers(len(ops))]
            if c in members:
                continue
            want = g.is_convex(members | {c})
            assert g.stays_convex(members, c) == want
            checked += 1
            refused += not want
            if want:
                members.add(c)
    assert checked > 300 and refused > 50   # both outcomes were exercised


def test_growing_a_long_chain_checks_convexity_in_linear_work():
    """Growing over a chain of n ops visits O(n) neighbours in the convexity checks, not
    O(n^2) (the full check walked every member's users for every candidate)."""
    n = 120
    t = "tensor<4xf32>"
    lines = [f"%v{i} = stablehlo.{'tanh' if i % 2 else 'negate'} {'%a' if i == 0 else f'%v{i - 1}'} : {t}"
             for i in range(n)]
    m = hir.parse(f"func.func @main(%a: {t}) -> {t} {{\n" + "\n".join(lines)
                  + f"\nreturn %v{n - 1} : {t}\n}}")
    ops = [o for o in hir.block_ops(hir.main_func(m).regions[0].blocks[0]) if o.name != "func.return"]
    g = BlockGraph(ops)
    calls, inside = [], []
    users, preds, stays = g.users, g.preds, g.stays_convex

    def counted(fn):
        return lambda op: (calls.append(op) if inside else None) or fn(op)
    g.users, g.preds = counted(users), counted(preds)

    def check(*a):
        inside.append(1)
        try:
            return stays(*a)
        finally:
            inside.pop()
    g.stays_convex = check
    members, refused = grow_region(g, ops[n // 2], lambda c, members, d: None)
    assert len(members) == n and not refused
    assert 0 < len(calls) < 8 * n, len(calls)   # the full check: > n * n / 4


def test_merge_siblings_needs_shared_input_and_no_path():
    m, ops = module_of(lambda x, y: (jnp.exp(x), jnp.sin(x), jnp.cos(y), jnp.tanh(jnp.exp(x))), (4, 8), (4, 8))
    g = BlockGraph(ops)
    groups = [[o] for o in ops if o.name in ("stablehlo.exponential", "stablehlo.sine", "stablehlo.cosine",
                                             "stablehlo.tanh")]
    merged = merge_siblings(g, groups, key=lambda grp: S.domain_shape(grp[0]))
    names = [sorted(o.name for o in grp) for grp in merged]
    assert names == [["stablehlo.exponential", "stablehlo.sine"]]   # cos reads y only; tanh reads exp


# -- step 3: outlining -------------------------------------------------------------------------

def test_commit_region_outlines_and_marks_cost_model_refusals():
    from hlofuse.passes.fusion.commit import commit_region
    m, ops = module_of(lambda x: jax.nn.softmax(x, -1), (4, 8))
    members = [o for o in ops if o.name != "stablehlo.constant"]
    ctx = PassContext(target="cpu")
    region, decision = commit_region(m, ctx, "reduction", members,
                                     decision_for=lambda c: cost.Decision(False, "cost model: test"))
    hir.verify(m)
    fns = [f for f in hir.funcs(m) if KIND_ATTR in f.attributes]
    assert len(fns) == 1
    assert ir.StringAttr(fns[0].attributes[XLA_ATTR]).value == "cost model: test"
    assert region.reason == "cost model: test" and not decision.fuse
    assert region.bytes_unfused > region.bytes_fused > 0
    main_ops = [o.name for o in hir.block_ops(hir.main_func(m).regions[0].blocks[0])]
    assert main_ops.count("func.call") == 1 and "stablehlo.reduce" not in main_ops


def test_commit_region_erases_dead_members_instead_of_outlining_them():
    """A rewrite can leave ops no one reads (flatten-dot-dims' sunk reshapes left the row
    statistics of a scanned attention's softmax unread): a region of them has no outputs.
    It is dead code: not outlined, nothing recorded, its region-free ops erased (it once
    failed the pass, and the whole backward program ran unoptimized)."""
    from hlofuse.passes.fusion.commit import DEAD, commit_region
    m = hir.parse("""
module {
  func.func public @main(%a: tensor<4x8xf32>) -> tensor<4x8xf32> {
    %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %0 = stablehlo.exponential %a : tensor<4x8xf32>
    %1 = stablehlo.reduce(%0 init: %cst) applies stablehlo.add across dimensions = [1] : (tensor<4x8xf32>, tensor<f32>) -> tensor<4xf32>
    %2 = stablehlo.tanh %a : tensor<4x8xf32>
    %3 = stablehlo.negate %2 : tensor<4x8xf32>
    %4 = stablehlo.sine %a : tensor<4x8xf32>
    return %4 : tensor<4x8xf32>
  }
}""")
    ops = hir.block_ops(hir.main_func(m).regions[0].blocks[0])
    ctx = PassContext(target="cpu")
    for names in [("stablehlo.exponential", "stablehlo.reduce"),
                  ("stablehlo.tanh", "stablehlo.negate")]:
        members = [o for o in hir.block_ops(hir.main_func(m).regions[0].blocks[0])
                   if o.name in names]
        region, decision = commit_region(m, ctx, "reduction", members,
                                         decision_for=lambda c: cost.Decision(True))
        hir.verify(m)
        assert region is None and not decision.fuse and decision.reason == DEAD
    assert not ctx.report.regions
    main_ops = [o.name for o in hir.block_ops(hir.main_func(m).regions[0].blocks[0])]
    assert "func.call" not in main_ops
    assert "stablehlo.tanh" not in main_ops and "stablehlo.negate" not in main_ops  # erased
    assert "stablehlo.reduce" in main_ops and "stablehlo.sine" in main_ops


# -- cost model --------------------------------------------------------------------------------

def test_region_cost_folds_broadcasts_and_counts_dot_flops():
    m, ops = module_of(lambda x, w, b: jax.nn.relu(x @ w + b), (16, 32), (32, 64), (64,))
    c = cost.region_cost(ops, [], [])
    assert c.flops >= 2 * 16 * 64 * 32
    # unfused: dot (x, w, out) + add (out, b, out) + max (out, out): bias read at its own size
    n = 4
    assert c.bytes_unfused == n * (16 * 32 + 32 * 64 + 16 * 64) + n * (16 * 64 + 64 + 16 * 64) + n * (2 * 16 * 64)


def test_decide_per_target():
    c = cost.RegionCost(bytes_unfused=10_000_000, bytes_fused=2_000_000, flops=1000, kernels_unfused=5)
    assert cost.decide("reduction", c, "gpu").fuse
    assert cost.decide("reduction", c, "cpu", grid_steps=1).fuse
    assert "grid steps" in cost.decide("reduction", c, "cpu", grid_steps=3).reason
    assert "bare dot" in cost.decide("matmul_epilogue", c, "gpu", fused_ops=0).reason
    c.working_set_bytes = 10 * 1024 * 1024
    assert "on-chip budget" in cost.decide("reduction", c, "gpu").reason
    assert cost.decide("reduction", c, "tpu").fuse          # 16 MiB scoped VMEM
    slow = cost.RegionCost(bytes_unfused=100, bytes_fused=1000, flops=0, kernels_unfused=1)
    assert "modeled slower" in cost.decide("reduction", slow, "gpu").reason


def test_remat_choice():
    m, ops = module_of(lambda x, y: (x + y, x * 2.0, x.astype(jnp.bfloat16),
                                     jax.lax.optimization_barrier(x * 3.0)), (64, 64), (64, 64))
    add = first(ops, "stablehlo.add")
    mul = first(ops, "stablehlo.multiply")
    conv = first(ops, "stablehlo.convert")
    barrier = first(ops, "stablehlo.optimization_barrier")
    assert cost.remat_choice(add, [mul], "gpu")[0] == "materialize"     # reads 2x what it writes
    assert cost.remat_choice(mul, [add], "gpu")[0] == "recompute"       # reads what it writes
    assert cost.remat_choice(conv, [add], "gpu")[0] == "materialize"    # f32 -> bf16 halves bytes
    # an opaque consumer cannot absorb the op: recomputing would run it twice
    assert cost.remat_choice(mul, [barrier], "gpu")[0] == "materialize"


def _xla_ops(compiled) -> dict:
    import collections
    import re
    out = collections.Counter()
    for line in compiled.as_text().splitlines():
        m = re.search(r"= (\S+?)\[.*?\]\S* (\w+)\(", line)
        if m and m.group(2) not in ("parameter", "bitcast"):
            kind = re.search(r"kind=(k\w+)", line)
            out[(m.group(1), m.group(2), kind.group(1) if kind else "")] += 1
    return out


def test_cpu_kernels_leave_xla_program_unchanged():
    """The CPU cost model's premise (CPU_RULES): a one-grid-step kernel vanishes into XLA's
    program -- the compiled HLO has the same (dtype, opcode, fusion kind) multiset."""
    import hlofuse
    from tests.fusion_util import FULL_PIPE
    r = np.random.default_rng(0)
    x = r.standard_normal((4, 16, 64)).astype(F32)
    w = (r.standard_normal((64, 96)) * 0.1).astype(F32)
    b = r.standard_normal(96).astype(F32)

    def ln(x):
        m = x.mean(-1, keepdims=True)
        return (x - m) * jax.lax.rsqrt(((x - m) ** 2).mean(-1, keepdims=True) + 1e-5)
    cases = [
        (ln, (x,), "reduction"),
        (lambda x, w, b: jax.nn.gelu(x @ w + b), (x, w, b), "matmul_epilogue"),
        (lambda x, w, b: jax.nn.relu(x.astype(jnp.bfloat16) @ w.astype(jnp.bfloat16) + b.astype(jnp.bfloat16)),
         (x, w, b), "matmul_epilogue"),
        (lambda x, w, b: (x @ w + b, jnp.tanh(x @ (w * 2.0))), (x, w, b), "horizontal"),
    ]
    for fn, args, kind in cases:
        h = hlofuse.jit(fn, target="cpu", pipeline=FULL_PIPE)
        assert any(k.kind == kind for k in h.report(*args).kernels)
        assert _xla_ops(h.lower(*args).compile()) == _xla_ops(jax.jit(fn).lower(*args).compile()), kind


def test_fusion_engine_is_idempotent():
    """A second run of the fusion passes over their own output changes nothing and reports
    no region (fused, merged or left to XLA regions are all recognized as done)."""
    import hlofuse
    from tests.fusion_util import FULL_PIPE
    r = np.random.default_rng(1)
    x = r.standard_normal((2, 8, 32)).astype(F32)
    ws = [(r.standard_normal((32, 32)) * 0.1).astype(F32) for _ in range(3)]

    def fn(x, a, b, c):
        q, k = x @ a, x @ b                       # bare sibling dots -> horizontal
        h = jax.nn.softmax(q * k, axis=-1)        # reduction
        return jax.nn.relu(h @ c + x), (x * x).sum(0)   # matmul epilogue; a reduce left to XLA
    for target in ("cpu", "gpu"):
        first = hlofuse.jit(fn, target=target, pipeline=FULL_PIPE,
                            options=ALL_KERNELS).lower(x, *ws)
        assert {k.kind for k in first.report.kernels} >= {"horizontal", "reduction", "matmul_epilogue"}
        again = hlofuse.optimize(first.as_text(), target=target, pipeline=FULL_PIPE,
                                 options=ALL_KERNELS)
        assert again.text == first.as_text() and again.report.regions == []


def test_cycle_check_horizon_matches_the_unbounded_search():
    """Partition._path_outside stops at a program-order horizon (only merged groups can jump
    back). On random DAGs with random merges, every answer must equal a search without the
    bound, and the merges it allows must leave the graph of groups acyclic."""
    from hlofuse.passes.fusion.regions import Partition

    class Graph:  # BlockGraph's interface over ints: index and users
        def __init__(self, n, edges):
            self.index = {i: i for i in range(n)}
            self._u = {i: sorted({b for a, b in edges if a == i}) for i in range(n)}

        def users(self, op):
            return self._u[op]

    def unbounded(part, src, dst):
        src_ops, dst_ops = set(part.members[src]), set(part.members[dst])
        # a direct edge src -> dst is no cycle: the path needs a node outside both
        stack = [u for o in src_ops for u in part.users(o) if u not in src_ops | dst_ops]
        seen = set()
        while stack:
            op = stack.pop()
            if op in dst_ops:
                return True
            if op in seen:
                continue
            seen.add(op)
            g = part.group[op]
            for n in part.members[g]:
                seen.add(n)
                stack += [u for u in part.users(n) if u not in src_ops]
        return False

    rng = np.random.default_rng(0)
    checked = refused = 0
    for trial in range(60):
        n = int(rng.integers(8, 40))
        edges = {(a, b) for a in range(n) for b in range(a + 1, min(n, a + 6)) if rng.random() < 0.35}
        part = Partition(Graph(n, edges))
        for i in range(n):
            part.add(i)
        for _ in range(3 * n):
            ga, gb = (int(x) for x in rng.integers(0, n, 2))
            ga, gb = part.group[ga], part.group[gb]
            if ga == gb:
                continue
            for a, b in ((ga, gb), (gb, ga)):
                assert part._path_outside(a, b) == unbounded(part, a, b)
                checked += 1
            if part.creates_cycle(ga, gb):
                refused += 1
            else:
                part.merge(ga, gb)
        # the groups form a DAG: order them by a DFS over group edges
        gedges = {(part.group[a], part.group[b]) for a, b in edges if part.group[a] != part.group[b]}
        state = {}

        def visit(g):
            state[g] = 1
            for a, b in gedges:
                if a == g:
                    assert state.get(b) != 1, "merged groups form a cycle"
                    if b not in state:
                        visit(b)
            state[g] = 2

        for g in list(part.members):
            if g not in state:
                visit(g)
    assert checked > 1000 and refused > 50
