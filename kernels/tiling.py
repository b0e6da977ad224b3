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


# ---------------------------------------------------------------------------------------------
# Row blocks (reduction family) and matmul blocks (matmul-epilogue / horizontal families).
#
# Tuning tables: keyed by (target, bucketed shape); filled from device measurements (regenerate
# with ``bench/`` on the device and paste the winners here). None are recorded yet: no GPU/TPU
# was available when this was written, so every shape uses the heuristic fallback below.
# ---------------------------------------------------------------------------------------------

GPU_SMEM_BUDGET = 228 * 1024           # H100: shared memory per SM (one CTA may use it all)
MAX_GPU_ROW_BLOCK_ELEMS = 8192          # elements of one (br, bc) row block held in registers
MAX_GPU_ROW = 16384                     # longest row a reduction kernel keeps on chip (gpu)
TPU_LANES = 128

TUNED_ROWS: dict[tuple, int] = {}               # (target, rows_b, cols_b) -> br
TUNED_MATMUL: dict[tuple, tuple] = {}           # (target, m_b, n_b, k_b) -> (bm, bn, bk)


def _pow2(n: int) -> bool:
    return n >= 1 and not (n & (n - 1))


def _warps(elems: int) -> int:
    return 8 if elems >= 4096 else 4 if elems >= 1024 else 2 if elems >= 256 else 1


def sublane_tile(itemsize: int) -> int:
    """TPU second-minor tile: 8 rows of 32-bit, 16 of 16-bit, 32 of 8-bit values."""
    return {1: 32, 2: 16}.get(itemsize, 8)


@dataclasses.dataclass(frozen=True)
class RowBlocks:
    """Blocks of whole rows for a (rows, cols) view: grid over row blocks only.

    cpu: one block of the whole array. gpu: power-of-two ``(br, bc)`` with ``bc >= cols``
    (padded lanes are masked before every reduction). tpu: ``bc == cols`` (the full dim is
    always a legal lane block), ``br`` a multiple of the sublane tile or all rows.
    """
    target: str
    rows: int
    cols: int
    br: int
    bc: int
    sublane: int = 8
    num_warps: int = 4
    num_stages: int = 1
    vmem_bytes: int = 0

    def __post_init__(self):
        if self.br < 1 or self.bc < 1:
            raise ValueError(f"row blocks must be positive, got {self.br}x{self.bc}")
        if self.target == "cpu":
            if (self.br, self.bc) != (self.rows, self.cols):
                raise ValueError("cpu interpret blocks must cover the whole array")
        elif self.target == "gpu":
            if not (_pow2(self.br) and _pow2(self.bc)):
                raise ValueError(f"Triton blocks must be powers of two, got {self.br}x{self.bc}")
            if self.bc < self.cols:
                raise ValueError(f"row block {self.bc} shorter than the row ({self.cols})")
            if self.br * self.bc > MAX_GPU_ROW_BLOCK_ELEMS and self.br > 1:
                raise ValueError(f"row block {self.br}x{self.bc} exceeds {MAX_GPU_ROW_BLOCK_ELEMS} elements")
        elif self.target == "tpu":
            if self.bc != self.cols:
                raise ValueError("TPU row blocks must span the whole row")
            if self.br != self.rows and self.br % self.sublane:
                raise ValueError(f"TPU sublane block {self.br} must be a multiple of {self.sublane} or {self.rows}")
            if self.vmem_bytes > TPU_VMEM_BUDGET:
                raise ValueError(f"TPU row blocks need {self.vmem_bytes} B of VMEM > {TPU_VMEM_BUDGET}")
        else:
            raise ValueError(f"unknown target {self.target!r}")

    @property
    def grid(self) -> tuple[int]:
        return (math.ceil(self.rows / self.br),)

    @property
    def padded(self) -> bool:
        return self.bc != self.cols

    def __str__(self) -> str:
        return f"{self.br}x{self.bc} row blocks, grid {self.grid[0]}"


def row_blocks(rows: int, cols: int, *, target: str, itemsize: int = 4, n_arrays: int = 2) -> RowBlocks:
    """Whole-row blocks for a reduction region (tuning table first, heuristic fallback)."""
    if target == "cpu":
        return RowBlocks("cpu", rows, cols, rows, cols)
    key = (target, next_pow2(rows), next_pow2(cols))
    if target == "gpu":
        if cols > MAX_GPU_ROW:
            raise ValueError(f"row of {cols} elements does not fit one Triton block")
        bc = next_pow2(cols)
        br = TUNED_ROWS.get(key) or max(1, min(next_pow2(rows), MAX_GPU_ROW_BLOCK_ELEMS // bc))
        return RowBlocks("gpu", rows, cols, br, bc, num_warps=_warps(br * bc))
    if target == "tpu":
        sub = sublane_tile(itemsize)
        per_row = max(cols, TPU_LANES) * max(itemsize, 4)
        br = TUNED_ROWS.get(key) or max(sub, (TPU_MAX_BLOCK_BYTES // per_row) // sub * sub)
        while br > sub and 2 * n_arrays * br * per_row > TPU_VMEM_BUDGET:
            br -= sub
        br = rows if rows <= br else br
        return RowBlocks("tpu", rows, cols, br, cols, sublane=sub,
                         vmem_bytes=2 * n_arrays * min(br, rows) * per_row)
    raise ValueError(f"unknown target {target!r}")


@dataclasses.dataclass(frozen=True)
class MatmulBlocks:
    """Tiles of a (batch, M, N, K) matmul with f32 accumulation.

    cpu: one block of the whole arrays (batch included), one grid step. gpu (Triton): grid
    (batch, M/bm, N/bn), K looped inside the kernel in ``bk`` chunks; power-of-two tiles of at
    least 16 (``tl.dot``), ``num_stages`` pipelined operand tiles within shared memory. tpu
    (Mosaic): grid (batch, M/bm, N/bn, K/bk), K last and ``arbitrary`` with a VMEM f32
    accumulator; ``bm`` a multiple of the sublane tile or M, ``bn``/``bk`` multiples of 128 or
    the full dim, ``bk`` dividing K (padded K would add garbage to the sum), all
    double-buffered tiles within the scoped VMEM budget.
    """
    target: str
    batch: int
    m: int
    n: int
    k: int
    bm: int
    bn: int
    bk: int
    members: int = 1
    itemsize: int = 4
    sublane: int = 8
    num_warps: int = 4
    num_stages: int = 2
    extra_bytes: int = 0          # epilogue operand tiles per grid step

    def __post_init__(self):
        if min(self.bm, self.bn, self.bk) < 1:
            raise ValueError("matmul tiles must be positive")
        if self.target == "cpu":
            if (self.bm, self.bn, self.bk) != (self.m, self.n, self.k):
                raise ValueError("cpu interpret tiles must cover the whole arrays")
        elif self.target == "gpu":
            if not all(_pow2(b) and b >= 16 for b in (self.bm, self.bn, self.bk)):
                raise ValueError(f"Triton tiles must be powers of two >= 16, got {self.bm}x{self.bn}x{self.bk}")
            if self.smem_bytes > GPU_SMEM_BUDGET:
                raise ValueError(f"tiles need {self.smem_bytes} B of shared memory > {GPU_SMEM_BUDGET}")
        elif self.target == "tpu":
            if self.bm != self.m and self.bm % self.sublane:
                raise ValueError(f"TPU bm {self.bm} must be a multiple of {self.sublane} or {self.m}")
            for b, full, what in ((self.bn, self.n, "bn"), (self.bk, self.k, "bk")):
                if b != full and b % TPU_LANES:
                    raise ValueError(f"TPU {what} {b} must be a multiple of {TPU_LANES} or {full}")
            if self.k % self.bk:
                raise ValueError(f"TPU bk {self.bk} must divide K={self.k}")
            if self.vmem_bytes > TPU_VMEM_BUDGET:
                raise ValueError(f"TPU tiles need {self.vmem_bytes} B of VMEM > {TPU_VMEM_BUDGET}")
        else:
            raise ValueError(f"unknown target {self.target!r}")

    @property
    def k_steps(self) -> int:
        return math.ceil(self.k / self.bk)

    @property
    def smem_bytes(self) -> int:
        return self.num_stages * (self.bm * self.bk + self.members * self.bk * self.bn) * self.itemsize

    @property
    def vmem_bytes(self) -> int:
        tiles = (self.bm * self.bk + self.members * self.bk * self.bn) * self.itemsize
        outs = self.members * self.bm * self.bn * 4
        return 2 * (tiles + outs + self.extra_bytes) + self.members * self.bm * self.bn * 4

    @property
    def grid(self) -> tuple:
        if self.target == "cpu":
            return (1,)
        g = (self.batch, math.ceil(self.m / self.bm), math.ceil(self.n / self.bn))
        return g + (self.k_steps,) if self.target == "tpu" else g

    @property
    def grid_steps(self) -> int:
        return math.prod(self.grid)

    @property
    def dimension_semantics(self) -> tuple:
        return ("parallel", "parallel", "parallel", "arbitrary")

    def __str__(self) -> str:
        g = "x".join(map(str, self.grid))
        extra = f", {self.num_warps} warps, {self.num_stages} stages" if self.target == "gpu" else ""
        return f"{self.bm}x{self.bn}x{self.bk} tiles, grid {g}{extra}"


def _gpu_bk(k: int) -> int:
    for b in (64, 32, 16):
        if k % b == 0:
            return b
    return min(64, max(16, next_pow2(k)))


def _tpu_tile(full: int, cap: int, align: int) -> int:
    if full <= cap:
        return full
    for b in range(cap - cap % align, align - 1, -align):
        if full % b == 0:
            return b
    return cap - cap % align


def matmul_blocks(batch: int, m: int, n: int, k: int, *, target: str, itemsize: int = 4,
                  members: int = 1, extra_bytes: int = 0) -> MatmulBlocks:
    """Tiles for a (batch, M, N, K) matmul (tuning table first, heuristic fallback)."""
    if target == "cpu":
        return MatmulBlocks("cpu", batch, m, n, k, m, n, k, members=members, itemsize=itemsize)
    key = (target, next_pow2(m), next_pow2(n), next_pow2(k))
    if target == "gpu":
        if key in TUNED_MATMUL:
            bm, bn, bk = TUNED_MATMUL[key]
        else:
            bm = min(64, max(16, next_pow2(m)))
            bn = min(64 if members > 1 else 128, max(16, next_pow2(n)))
            bk = _gpu_bk(k)
        stages = 3 if math.ceil(k / bk) > 2 else 2
        while stages > 1 and stages * (bm * bk + members * bk * bn) * itemsize > GPU_SMEM_BUDGET:
            stages -= 1
        return MatmulBlocks("gpu", batch, m, n, k, bm, bn, bk, members=members, itemsize=itemsize,
                            num_warps=4 if bm * bn <= 4096 else 8, num_stages=stages)
    if target == "tpu":
        sub = sublane_tile(itemsize)
        if key in TUNED_MATMUL:
            bm, bn, bk = TUNED_MATMUL[key]
        else:
            bm = m if m <= 512 else 512
            bn = _tpu_tile(n, 512, TPU_LANES) if n % TPU_LANES == 0 or n <= 512 else 512
            bk = k if k <= 1024 or k % TPU_LANES else _tpu_tile(k, 1024, TPU_LANES)
        def vmem(bm, bn):
            tiles = (bm * bk + members * bk * bn) * itemsize
            return 2 * (tiles + members * bm * bn * 4 + extra_bytes) + members * bm * bn * 4
        while vmem(bm, bn) > TPU_VMEM_BUDGET and (bm > sub or bn > TPU_LANES):
            if bm > sub and (bm >= bn or bn <= TPU_LANES):
                bm = max(sub, (bm // 2) // sub * sub)
            else:
                bn = max(TPU_LANES, (bn // 2) // TPU_LANES * TPU_LANES)
        return MatmulBlocks("tpu", batch, m, n, k, bm, bn, bk, members=members, itemsize=itemsize,
                            sublane=sub, extra_bytes=extra_bytes, num_stages=1)
    raise ValueError(f"unknown target {target!r}")
