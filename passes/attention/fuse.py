"""``fuse-attention``: recognize attention in StableHLO and outline it for a flash kernel.

Rewrites: every subgraph of the form

    s = dot_general(Q, K)                   # QKᵀ, any head layout, with or without transposes
    x = chain(s, side values)               # scale (×, ÷), additive bias/mask, select masks
                                            # (iota+compare causal, tril, -inf or finite fill),
                                            # converts, transposes, unit reshapes, clamps, ...
    p = exp(x - max(x)) / sum(exp(...))     # softmax over the key dim (jax.nn.softmax or by hand)
    o = dot_general(p, V)                   # P·V (converts/transposes of p allowed)

becomes ``func.func private @hlofuse_attention_N`` (``hlofuse.kind = "attention"``) plus one
call; ``kernelize`` then turns it into a flash (online-softmax) kernel from
:mod:`hlofuse.kernels.attention`. The match is recorded on the function as pure data (an
:class:`~hlofuse.kernels.attention.AttentionSpec` in the ``hlofuse.attention`` attribute): the
kernel reads it back and never matches again. K/V heads repeated with ``jnp.repeat`` or broadcast from one
head with ``jnp.broadcast_to`` (GQA/MQA) are taken into the region so the kernel reads the
unshared K/V; multi-query attention written with K/V without a head dim and
``jax.nn.dot_product_attention``'s XLA implementation (5-D grouped layout) match natively.

How: the match is anchored at the P·V ``dot_general``. Its probability operand is walked back to
the softmax; the softmax input ``x`` is walked back to the unique full-size ``dot_general`` that
feeds it (QKᵀ). Every dim of every value in between gets a *label* (a batch dim, a query-row
dim, the key dim, or none for unit dims) so layouts, transposes and broadcasts are understood
structurally, never by op order or names. Side values (masks, biases, iotas) are pulled into the
region while they are cheap generators used only inside it, so the region's inputs are the
small pre-broadcast tensors, never a materialized ``[B, H, Sq, Sk]`` mask. A side value read in
several layouts (a ``[B, S]`` padding mask broadcast along the query rows and along the key,
``mask[:, None, :, None] * mask[:, None, None, :]``) is a region input once per layout (the call
passes it twice). A cheap side chain shared with other code (one mask broadcast for every
layer, as CSE leaves it) is copied into each region that reads it, when its leaves are no more
bytes than its result (statistic ``side_chains_rematerialized``).

Training steps (``hlofuse.jit(jax.value_and_grad(loss))``; cpu loops, Triton, Mosaic): when the forward is refused
only because the backward ``jax.grad`` built reads its intermediates, forward and backward are
matched together (:mod:`.attention_train`: the backward is checked to be the forward's VJP by
evaluation) and outlined as a forward returning its row statistics (kind
``attention_fwd_lse``) and a flash backward (kind ``attention_bwd``); statistic
``attention_training``. GQA: the K/V repeat is taken into both regions (the backward's group
sums of dK/dV with it; the kernels sum over each group's query heads, nothing repeated is
materialized), else, when that does not match, left outside as before. A refused training
match is reported at the op where it failed when known (else at the P·V candidate). A multiplier on the probabilities that does not vary along the key
(a head mask) is moved after P·V first (``row_multipliers_moved``); a transpose between exp
and the divide is read as a layout of the numerator.

Not matched (left alone, with the reason in the pass statistics, ``refused[<reason>]``, and a
report note per reason): intermediates used
outside the region (returned attention weights; residuals kept by a separately exported
backward program, as ``jax.grad(hlofuse.jit(f))`` makes), dropout (the probabilities
feed a multiply by a random mask, not the P·V product), softmax over a non-key dim, two
candidate QKᵀ products, dynamic shapes. Candidates are the ``dot_general`` ops with a softmax
(exp normalized by its sum) as an operand, in blocks with an exp and two dot_generals; a block
with a softmax but no candidate gets one reason (:data:`NO_SOFTMAX_DOT`), a block without a
softmax (a cross-entropy's log-softmax and its gradient) none.

Preconditions: calls inlined (``inline-calls``); runs after ``cse`` and before the other fusion
passes so it claims its ops first. Invariant: the module verifies; results equal the original
within the ``reassociate`` tolerance (the kernel evaluates the same logit ops, then an online
softmax that reassociates the sums), including fully masked rows, NaN and infinities.
"""

from __future__ import annotations

from jaxlib.mlir import ir

from hlofuse.core import ir as hir
from hlofuse.core.pipeline import Pass
from hlofuse.kernels.attention import SPEC_ATTR, AttentionSpec
from hlofuse.passes.fusion.commit import LeftToXla, record_region
from hlofuse.passes.fusion.outline import outline_region, program_blocks, region_boundary
from hlofuse.passes.attention.match import (_USED_OUTSIDE, KIND, MAX_REMAT_ROUNDS, NOT_SOFTMAX,
                                           NO_SOFTMAX_DOT, NoMatch, WHAT, _move_row_multipliers,
                                           _rematerialize_shared_sides, _softmax_behind,
                                           _try_analyze, _unshare_generators, apply_layout_copies,
                                           block_index, drop_layout_copies, find_attention,
                                           region_spec)


class FuseAttention(Pass):
    """See the module docstring."""
    name = "fuse-attention"

    def run(self, module, ctx):
        n = n_train = moved = remat = 0
        left = LeftToXla(self.name)
        for block in program_blocks(module):
            ops = hir.block_ops(block)
            if not any(o.name == "stablehlo.exponential" for o in ops) or \
                    sum(o.name == "stablehlo.dot_general" for o in ops) < 2:
                continue
            with module.context:
                _unshare_generators(block)
                n_mult = _move_row_multipliers(block)
                if n_mult:
                    ops = hir.block_ops(block)
                    moved += n_mult
            # every match as data first: outlining one replaces values the next may read
            matches, refused = [], []
            found = find_attention(block, refused)
            for _ in range(MAX_REMAT_ROUNDS):
                with module.context:
                    n_remat = sum([_rematerialize_shared_sides(att, block) for att in found])
                if not n_remat:
                    break
                remat += n_remat
                refused = []
                found = find_attention(block, refused)
            for att in found:
                with module.context:
                    copies = apply_layout_copies(att)
                try:
                    matches.append((att, region_spec(att, region_boundary(att.members)), copies))
                except NoMatch as e:
                    drop_layout_copies(copies)
                    refused.append((att.members[-1], str(e)))
            trains, refused = _training_matches(block, refused, found, module, ctx.target)
            for op, reason in refused:
                left.add(WHAT, op, reason)
            if not found and not refused and not trains and any(
                    o.name == "stablehlo.divide" and _softmax_behind(o.results[0]) for o in ops):
                # a softmax no dot reads as probabilities (dropout between); a block with no
                # exp normalized by a divide (a cross-entropy's log-softmax) has no candidate
                left.add(WHAT, next(o for o in ops if o.name == "stablehlo.dot_general"),
                         NO_SOFTMAX_DOT)
            for att, spec, copies in matches:
                boundary = region_boundary(att.members)
                region = record_region(
                    ctx, KIND, att.members, boundary, layout=_layout_str(spec),
                    mask=_mask_kind(spec), gqa_groups=spec.gqa_groups, seq_q=spec.seq_q,
                    seq_k=spec.seq_k)
                _, fn, _ = outline_region(module, att.members, f"hlofuse_attention_{region.id}",
                                          region_id=region.id, kind=KIND)
                with module.context:
                    fn.operation.attributes[SPEC_ATTR] = ir.StringAttr.get(spec.to_attr())
                drop_layout_copies(copies)
                n += 1
            for tr in trains:
                _commit_training(module, ctx, tr)
                n_train += 1
        left.flush(ctx)
        return {"attention_regions": n, "attention_training": n_train,
                "row_multipliers_moved": moved, "side_chains_rematerialized": remat,
                **left.stats()}


def _training_matches(block, refused: list, found: list, module, target) -> tuple:
    """Candidates refused because a backward reads them: matched again as forward + backward
    (:mod:`.attention_train`). Returns (training matches, the refusals left, reasons updated).
    Every target: cpu loops, Triton (gpu) and Mosaic (tpu) kernels. Where the target's kernels
    would refuse the region (f16 on tpu), the match is refused here with that reason: an outlined
    backward left to XLA would only recompute the forward."""
    from hlofuse.passes.attention import train as at
    cands = [(op, r) for op, r in refused
             if op.name == "stablehlo.dot_general" and any(w in r for w in _USED_OUTSIDE)]
    if not cands:
        return [], refused
    with module.context:
        at.unshare_generator_trees(block)
    index = block_index(block)
    taken = {m for a in found for m in a.members}
    trains, left = [], [(op, r) for op, r in refused if (op, r) not in cands]
    for op, reason in cands:
        att, reasons = _try_analyze(op, index, relaxed=True)
        if att is None:
            why = "; ".join(r for r in reasons if r != NOT_SOFTMAX)
            left.append((op, f"{reason}; as a training step: {why}" if why else reason))
            continue
        if any(m in taken for m in att.members):
            left.append((op, "overlaps an attention matched before it"))
            continue
        tr, err, where = _try_training(att, block, index, target)
        if tr is None and att.repeat is not None:
            # GQA: with the repeated K/V as the region's inputs instead (dK/dV summed by XLA)
            att2, _ = _try_analyze(op, index, relaxed=True, gqa=False)
            if att2 is not None and not any(m in taken for m in att2.members):
                tr, err2, _ = _try_training(att2, block, index, target)
                err = f"{err} (and with the K/V repeat outside the region: {err2})" if tr is None \
                    else None
        if tr is None:
            # reported at the op where the match failed when known, else at the candidate
            left.append((where or op, f"{reason}; as a training step: {err}"))
            continue
        if _reads_taken(tr, taken):
            # committing the first region replaces the values this match holds (a NoMatch at
            # commit: 'a value the logits read is neither a region input nor a region op',
            # attention applied to an attention's output in a training step; adversarial round)
            left.append((op, f"{reason}; as a training step: reads a value of an attention "
                             f"matched before it (chained attentions: the first is fused)"))
            continue
        att = tr.att
        taken.update(att.members)
        taken.update(tr.bwd_ops)
        trains.append(tr)
    return trains, [(op, r) for op, r in left if op not in taken]


def _reads_taken(tr, taken: set) -> bool:
    """Whether the training match ``tr`` (forward members or backward ops) reads a value that
    an op of a match made before it produces."""
    ops = list(tr.att.members) + list(tr.bwd_ops)
    for o in ops:
        for v in o.operands:
            d = hir.defining_op(v)
            if d is not None and d in taken and d not in ops:
                return True
    return False


def _try_training(att, block, index, target) -> tuple:
    """(the training match, None, None) or (None, why not, the op where it failed or None)."""
    from hlofuse.passes.attention import train as at
    try:
        boundary = region_boundary(att.members)
        fspec = region_spec(att, boundary)    # the forward must be expressible as a spec
        why = _training_kernel_refusal(fspec, boundary, target)
        if why:
            raise NoMatch(why)
        return at.match_training(att, block, index, boundary), None, None
    except (NoMatch, at.TrainNoMatch) as e:
        return None, str(e), getattr(e, "op", None)


def _training_kernel_refusal(spec, boundary, target) -> str | None:
    """Why the target's training kernels would not build for this forward, or None."""
    if not target.is_tpu:
        return None
    dts = [spec.x_dtype, spec.p_dtype, spec.out_dtype, spec.s_dtype]
    dts += [hir.tensor_type_info(v.type).dtype for v in boundary.inputs
            if hir.tensor_type_info(v.type) is not None]
    if "f16" in dts:
        return "f16 is not supported by the TPU flash backward kernel"
    return None


def _commit_training(module, ctx, tr) -> None:
    """Outline a training match: the forward returning lse, and the backward."""
    from hlofuse.passes.attention import train as at
    from hlofuse.kernels.attention.backward import (BWD_ATTR, FWD_LSE_ATTR, BwdSpec, FwdLseSpec)
    from hlofuse.passes.fusion.outline import Boundary
    att = tr.att
    lse_ops, lse_val, lse_dims = at.add_lse(att, module)
    index = block_index(att.pv.block)
    att.members = sorted(list(att.members) + lse_ops, key=lambda o: index[o])
    boundary = region_boundary(att.members)
    spec = region_spec(att, boundary)
    pos = {hir.value_key(v): i for i, v in enumerate(boundary.inputs)}
    n_in = len(boundary.inputs)
    bspec = BwdSpec(spec, n_in, n_in + 1, n_in + 2, tr.do_dims, lse_dims,
                    tuple((pos[hir.value_key(v)], tuple(p)) for v, p in tr.grads))
    o_val = att.pv.results[0]
    bregion = record_region(ctx, "attention_bwd", tr.bwd_ops,
                            Boundary(list(boundary.inputs) + [o_val, lse_val, tr.do_root],
                                     list(tr.outputs), []),
                            grads=len(tr.outputs), seq_q=spec.seq_q, seq_k=spec.seq_k)
    _, bfn = at.outline_backward(module, tr, boundary, o_val, lse_val,
                                 f"hlofuse_attention_bwd_{bregion.id}", bregion.id, "attention_bwd")
    with module.context:
        bfn.operation.attributes[BWD_ATTR] = ir.StringAttr.get(bspec.to_attr())
    boundary = region_boundary(att.members)
    o_index = [hir.value_key(v) for v in boundary.outputs].index(hir.value_key(o_val))
    region = record_region(ctx, "attention_fwd_lse", att.members, boundary,
                           layout=_layout_str(spec), mask=_mask_kind(spec), seq_q=spec.seq_q,
                           seq_k=spec.seq_k)
    _, fn, _ = outline_region(module, att.members, f"hlofuse_attention_{region.id}",
                              region_id=region.id, kind="attention_fwd_lse")
    with module.context:
        fn.operation.attributes[FWD_LSE_ATTR] = ir.StringAttr.get(
            FwdLseSpec(spec, lse_dims, o_index).to_attr())


def _mask_kind(spec: AttentionSpec) -> str:
    names = {st.name for st in spec.steps}
    kinds = []
    if "stablehlo.select" in names:
        kinds.append("select(" + ("positions" if spec.mask_select is not None else "mask") + ")")
    if names & {"stablehlo.add", "stablehlo.subtract"} and spec.n_sides:
        kinds.append("additive")
    return "+".join(kinds) or "none"


def _layout_str(spec: AttentionSpec) -> str:
    def name(d):
        if d is None:
            return "1"
        if d in ("d", "dv"):
            return "D"
        if d == spec.key:
            return "K"
        if d == spec.sq:
            return "S"
        if spec.repeat and d == spec.repeat.kv:
            return "Hkv"
        if d in spec.batch_labels:
            return "B"
        return "H"
    return "q:" + "".join(name(d) for d in spec.q_dims) + " k:" + "".join(
        name(d) for d in spec.k_dims)
