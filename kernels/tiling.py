"""Block sizes per target, validated on construction, from a tuning table with a heuristic fallback.

The elementwise family views its iteration domain as 2-D (rows, cols) = (prod(shape[:-1]),
shape[-1]) and tiles it with ``(br, bc)`` blocks:

* cpu (Pallas interpret): whole-array blocks. Interpret mode lowers the grid to a while loop
  that carries every input and output, copying whole arrays each step: 1024² blocks ran 6.5×
  slower than XLA on a 4096² chain, 128² blocks 200× slower, whole-array blocks 0.99×.
* gpu (Triton): power-of-two blocks (Triton requires it; edge blocks are masked), at most
  ``MAX_GPU_BLOCK_ELEMS`` elements per program, ``num_warps`` by block size.
* tpu (Mosaic): last dim a multiple of 128 or the full dim, second-to-last a multiple of the
  dtype's sublane tile (8 for 32-bit, 16 for 16-bit, 32 for 8-bit) or the full dim; all
  double-buffered blocks within the scoped VMEM budget.

Tuning table: entries keyed by (target, rows bucket, cols bucket) come from measurements on the
device; none are recorded yet (no GPU/TPU in CI), so every shape uses the heuristic below.
"""

from __future__ import annotations

import dataclasses
import math

MAX_GPU_BLOCK_ELEMS = 4096
TPU_VMEM_BUDGET = 16 * 1024 * 1024
TPU_MAX_BLOCK_BYTES = 1024 * 1024

# (target, rows_bucket, cols_bucket) -> (br, bc); buckets are powers of two.
TUNED: dict[tuple, tuple[int, int]] = {}


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


@dataclasses.dataclass(frozen=True)
class Blocks2D:
    target: str
    rows: int
    cols: int
    br: int
    bc: int
    sublane: int = 8
    num_warps: int = 4
    num_stages: int = 1

    def __post_init__(self):
        if self.br < 1 or self.bc < 1:
            raise ValueError(f"blocks must be positive, got {self.br}x{self.bc}")
        if self.target == "cpu":
            if (self.br, self.bc) != (self.rows, self.cols):
                raise ValueError("cpu interpret blocks must cover the whole array")
        elif self.target == "gpu":
            if self.br & (self.br - 1) or self.bc & (self.bc - 1):
                raise ValueError(f"Triton blocks must be powers of two, got {self.br}x{self.bc}")
        elif self.target == "tpu":
            if self.bc != self.cols and self.bc % 128:
                raise ValueError(f"TPU lane block {self.bc} must be a multiple of 128 or {self.cols}")
            if self.br != self.rows and self.br % self.sublane:
                raise ValueError(f"TPU sublane block {self.br} must be a multiple of {self.sublane} or {self.rows}")
        else:
            raise ValueError(f"unknown target {self.target!r}")

    @property
    def grid(self) -> tuple[int, int]:
        return (math.ceil(self.rows / self.br), math.ceil(self.cols / self.bc))

    def __str__(self) -> str:
        g = self.grid
        return f"{self.br}x{self.bc} blocks, grid {g[0]}x{g[1]}"


def elementwise_blocks(rows: int, cols: int, *, target: str, itemsize: int = 4,
                       n_arrays: int = 2) -> Blocks2D:
    key = (target, next_pow2(rows), next_pow2(cols))
    if key in TUNED:
        br, bc = TUNED[key]
        return Blocks2D(target, rows, cols, min(br, rows) if target != "gpu" else br, bc)
    if target == "cpu":
        return Blocks2D("cpu", rows, cols, rows, cols)
    if target == "gpu":
        bc = min(next_pow2(cols), 1024)
        br = min(next_pow2(rows), max(1, MAX_GPU_BLOCK_ELEMS // bc))
        warps = 8 if br * bc >= 4096 else 4 if br * bc >= 1024 else 2 if br * bc >= 256 else 1
        return Blocks2D("gpu", rows, cols, br, bc, num_warps=warps)
    if target == "tpu":
        sub = {1: 32, 2: 16}.get(itemsize, 8)
        bc = cols if (cols <= 2048 or cols % 128) else 2048
        per_row = bc * max(itemsize, 4)
        br_cap = max(sub, (TPU_MAX_BLOCK_BYTES // per_row) // sub * sub)
        # all arrays double-buffered must fit the scoped VMEM budget
        while br_cap > sub and 2 * n_arrays * br_cap * per_row > TPU_VMEM_BUDGET:
            br_cap -= sub
        br = rows if rows <= br_cap else br_cap
        return Blocks2D("tpu", rows, cols, br, bc, sublane=sub)
    raise ValueError(f"unknown target {target!r}")
