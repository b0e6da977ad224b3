"""Cost model: bytes moved, flops, arithmetic intensity, and whether fusing pays per target.

Figures are *modeled* (never measured): an unfused op reads its operands and writes its result
to memory; a fused region reads its inputs once and writes its outputs once. Targets:

* gpu — H100-class: HBM 3.35 TB/s, f32 67 TFLOP/s, bf16 990 TFLOP/s, ~228 KiB shared memory
  per SM, ~5 µs launch overhead.
* tpu — v5e-class: HBM 0.8 TB/s, bf16 197 TFLOP/s, 16 MiB scoped VMEM by default, (8,128) tiles.
* cpu — XLA:CPU already fuses elementwise chains; a whole-array interpret-mode kernel compiles
  to the same loop (measured ratio 0.99), so on CPU fusion is neutral unless a later pass finds
  a real win (attention, library-fusion choice).
"""

from __future__ import annotations

import dataclasses

from hlofuse import ir as hir
from hlofuse.ops import OpClass, rule_for


@dataclasses.dataclass(frozen=True)
class TargetModel:
    name: str
    hbm_bytes_per_s: float
    flops_per_s: float
    launch_s: float
    on_chip_bytes: int


TARGETS = {
    "gpu": TargetModel("gpu", 3.35e12, 67e12, 5e-6, 228 * 1024),
    "tpu": TargetModel("tpu", 0.8e12, 197e12, 2e-6, 16 * 1024 * 1024),
    "cpu": TargetModel("cpu", 50e9, 200e9, 1e-6, 32 * 1024 * 1024),
}


@dataclasses.dataclass
class RegionCost:
    bytes_unfused: int
    bytes_fused: int
    flops: int
    kernels_unfused: int

    def seconds(self, model: TargetModel, fused: bool) -> float:
        b = self.bytes_fused if fused else self.bytes_unfused
        n = 1 if fused else self.kernels_unfused
        return max(b / model.hbm_bytes_per_s, self.flops / model.flops_per_s) + n * model.launch_s


def _nbytes(v) -> int:
    info = hir.tensor_type_info(v.type)
    return info.nbytes if info else 0


def region_cost(members: list, inputs: list, outputs: list) -> RegionCost:
    unfused = 0
    flops = 0
    kernels = 0
    for op in members:
        rule = rule_for(op.name)
        if rule.cls is OpClass.CONSTANT:
            continue
        kernels += 1
        unfused += sum(_nbytes(v) for v in op.operands) + sum(_nbytes(r) for r in op.results)
        for r in op.results:
            info = hir.tensor_type_info(r.type)
            flops += rule.flops * (info.size if info else 0)
    fused = sum(_nbytes(v) for v in inputs) + sum(_nbytes(v) for v in outputs)
    return RegionCost(unfused, fused, flops, kernels)


def fusion_pays(cost: RegionCost, target: str) -> bool:
    """Does running the region as one kernel beat running its ops one by one on ``target``?"""
    model = TARGETS[target]
    return cost.seconds(model, fused=True) <= cost.seconds(model, fused=False)
