"""Block sizes per target and chip, validated on construction, from a tuning table with a heuristic fallback.

Every per-chip figure comes from :mod:`hlofuse.core.chips` (the GPU target description that ships
with hlofuse, JAX's TPU hardware table plus the measured scoped-VMEM limits); this file holds
only rules of the compilers and heuristics. A ``chip=`` argument (a name or
:class:`~hlofuse.core.chips.Chip`) picks the chip; without it, the chip in force
(:func:`hlofuse.core.chips.use`, the pass option ``chip``) or the target's default (h100, v5e).

The elementwise family views its iteration domain as 2-D (rows, cols) = (prod(shape[:-1]),
shape[-1]) and tiles it with ``(br, bc)`` blocks:

* cpu (Pallas interpret): whole-array blocks. Interpret mode lowers the grid to a while loop
  that carries every input and output, copying whole arrays each step: 1024² blocks ran 6.5×
  slower than XLA on a 4096² chain, 128² blocks 200× slower, whole-array blocks 0.99×.
* gpu (Triton): power-of-two blocks (Triton requires it; edge blocks are masked) of at most
  ``TRITON_MAX_ELEMS`` elements (Triton's tensor limit), at most ``MAX_GPU_BLOCK_ELEMS``
  elements per program, ``num_warps`` by block size; matmul tiles within the chip's shared
  memory per block, row blocks within its registers.
* tpu (Mosaic): last dim a multiple of 128 or the full dim, second-to-last a multiple of the
  dtype's sublane tile (8 for 32-bit, 16 for 16-bit, 32 for 8-bit) or the full dim; all
  double-buffered blocks within the chip's scoped VMEM limit (16 MiB v4/v5e, 32 MiB v6e).

Tuning table: entries keyed by (target, rows bucket, cols bucket) come from measurements on the
device; none are recorded yet (no GPU/TPU in CI), so every shape uses the heuristic below.
"""

from __future__ import annotations

import dataclasses
import math

from hlofuse.core.target import Target

MAX_GPU_BLOCK_ELEMS = 4096      # heuristic: elements of one elementwise program
TRITON_MAX_ELEMS = 1 << 20      # Triton: "Maximum allowed number of elements is 1048576"
TPU_MAX_BLOCK_BYTES = 1024 * 1024


def chip_for(target, chip=None):
    """The :class:`~hlofuse.core.chips.Chip` whose limits apply (None for cpu)."""
    return Target.of(target, chip).chip


# The budgets are the Target's (hlofuse.core.target): these name them for one chip (default: in force)
def vmem_budget(chip=None) -> int:
    return Target.of("tpu", chip).vmem_budget


def lane_padded(cols: int, chip=None) -> int:
    return Target.of("tpu", chip).lane_padded(cols)


def smem_budget(chip=None) -> int:
    return Target.of("gpu", chip).smem_budget


def gpu_row_block_elems(chip=None) -> int:
    return Target.of("gpu", chip).gpu_row_block_elems


def max_row_elems(target, chip=None) -> int:
    return Target.of(target, chip).max_row_elems


def max_tiled_row_elems(target, chip=None) -> int:
    return Target.of(target, chip).max_tiled_row_elems


def _with_target(blocks) -> None:
    """Blocks' ``target`` as a Target (a name is accepted) and ``chip`` as its chip's name."""
    t = Target.of(blocks.target, blocks.chip or None)
    object.__setattr__(blocks, "target", t)
    object.__setattr__(blocks, "chip", t.chip_name)


# (target, rows_bucket, cols_bucket) -> (br, bc); buckets are powers of two.
TUNED: dict[tuple, tuple[int, int]] = {}


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def is_pow2(n: int) -> bool:
    return n >= 1 and not (n & (n - 1))


# ---------------------------------------------------------------------------------------------
# Per-target block rules: what the compilers require of any block of a (rows, cols) view.
#
# A rule reads ``br, bc`` (the block), ``rows, cols`` (the array) and ``sublane`` from a block
# object (:class:`Blocks2D`, :class:`RowBlocks`, or a :class:`Tile` built by another family)
# and returns why the block is illegal, or None. :func:`check_block` applies the target's row
# of :data:`BLOCK_RULES`, then the family's own extra rules.
# ---------------------------------------------------------------------------------------------

TPU_LANES = 128


@dataclasses.dataclass(frozen=True)
class Tile:
    """The last two dims of a block and of the array it tiles, for families whose block class
    names them differently (e.g. attention's ``bq``/``bk``).

    ``rows``/``cols`` None: the block is checked before the array is known (attention blocks
    are validated on their own), so no whole-dimension exception applies (tpu blocks must be
    aligned) and nothing has to cover the array (cpu: the family loops over the blocks)."""
    br: int
    bc: int
    rows: int | None = None
    cols: int | None = None
    sublane: int = 8


def _covers_whole_array(b) -> str | None:
    if b.rows is not None and (b.br, b.bc) != (b.rows, b.cols):
        return "cpu interpret blocks must cover the whole array"
    return None


def _powers_of_two(b) -> str | None:
    if not (is_pow2(b.br) and is_pow2(b.bc)):
        return f"Triton blocks must be powers of two, got {b.br}x{b.bc}"
    return None


def _within_triton_tensor(b) -> str | None:
    if b.br * b.bc > TRITON_MAX_ELEMS:
        return f"Triton block {b.br}x{b.bc} exceeds {TRITON_MAX_ELEMS} elements"
    return None


def _lane_aligned(b) -> str | None:
    if b.bc != b.cols and b.bc % TPU_LANES:
        return f"TPU lane block {b.bc} must be a multiple of {TPU_LANES}" + _or_whole(b.cols)
    return None


def _sublane_aligned(b) -> str | None:
    if b.br != b.rows and b.br % b.sublane:
        return f"TPU sublane block {b.br} must be a multiple of {b.sublane}" + _or_whole(b.rows)
    return None


def _or_whole(n: int | None) -> str:
    return "" if n is None else f" or {n}"


# target -> rules every block obeys (cpu: Pallas interpret; gpu: Triton; tpu: Mosaic)
BLOCK_RULES: dict[str, tuple] = {
    "cpu": (_covers_whole_array,),
    "gpu": (_powers_of_two, _within_triton_tensor),
    "tpu": (_lane_aligned, _sublane_aligned),
}


def check_block(target, block, extra: dict | None = None) -> None:
    """Raise ``ValueError`` naming the first rule ``block`` breaks: positive sizes, the
    target's :data:`BLOCK_RULES`, then ``extra[target]`` (a family's own rules)."""
    if block.br < 1 or block.bc < 1:
        raise ValueError(f"blocks must be positive, got {block.br}x{block.bc}")
    kind = Target.of(target).kind
    for rule in BLOCK_RULES[kind] + tuple((extra or {}).get(kind, ())):
        why = rule(block)
        if why is not None:
            raise ValueError(why)


@dataclasses.dataclass(frozen=True)
class Blocks2D:
    target: Target
    rows: int
    cols: int
    br: int
    bc: int
    sublane: int = 8
    num_warps: int = 4
    num_stages: int = 1
    chip: str = ""                # chip whose limits were applied ('' on cpu)

    def __post_init__(self):
        _with_target(self)
        check_block(self.target, self)

    @property
    def grid(self) -> tuple[int, int]:
        return (math.ceil(self.rows / self.br), math.ceil(self.cols / self.bc))

    @property
    def dimension_semantics(self) -> tuple:
        return ("parallel", "parallel")

    def __str__(self) -> str:
        g = self.grid
        return f"{self.br}x{self.bc} blocks, grid {g[0]}x{g[1]}"


def elementwise_blocks(rows: int, cols: int, *, target: Target | str, itemsize: int = 4,
                       n_arrays: int = 2, chip=None) -> Blocks2D:
    target = Target.of(target, chip)
    c = target.chip
    key = (target.kind, next_pow2(rows), next_pow2(cols))
    if key in TUNED:
        br, bc = TUNED[key]
        return Blocks2D(target, rows, cols, min(br, rows) if not target.is_gpu else br, bc,
                        sublane=c.sublane_tile(itemsize) if target.is_tpu else 8)
    if target.is_cpu:
        return Blocks2D(target, rows, cols, rows, cols)
    if target.is_gpu:
        bc = min(next_pow2(cols), 1024)
        br = min(next_pow2(rows), max(1, MAX_GPU_BLOCK_ELEMS // bc))
        warps = 8 if br * bc >= 4096 else 4 if br * bc >= 1024 else 2 if br * bc >= 256 else 1
        return Blocks2D(target, rows, cols, br, bc, num_warps=warps)
    if target.is_tpu:
        sub = c.sublane_tile(itemsize)
        bc = cols if (cols <= 2048 or cols % c.lanes) else 2048
        per_row = target.lane_padded(bc) * max(itemsize, 4)
        br_cap = max(sub, (TPU_MAX_BLOCK_BYTES // per_row) // sub * sub)
        # all arrays double-buffered must fit the chip's VMEM budget
        while br_cap > sub and 2 * n_arrays * br_cap * per_row > target.vmem_budget:
            br_cap -= sub
        br = rows if rows <= br_cap else br_cap
        return Blocks2D(target, rows, cols, br, bc, sublane=sub)


# ---------------------------------------------------------------------------------------------
# Row blocks (reduction family) and matmul blocks (matmul-epilogue / horizontal families).
#
# Tuning tables: keyed by (target, bucketed shape); filled from device measurements (regenerate
# with ``bench/`` on the device and paste the winners here). None are recorded yet: no GPU/TPU
# was available when this was written, so every shape uses the heuristic fallback below.
# ---------------------------------------------------------------------------------------------

TUNED_ROWS: dict[tuple, int] = {}               # (target, rows_b, cols_b) -> br
TUNED_MATMUL: dict[tuple, tuple] = {}           # (target, m_b, n_b, k_b) -> (bm, bn, bk)


def _warps(elems: int) -> int:
    return 8 if elems >= 4096 else 4 if elems >= 1024 else 2 if elems >= 256 else 1


def sublane_tile(itemsize: int, chip=None) -> int:
    """TPU second-minor tile: 8 rows of 32-bit, 16 of 16-bit, 32 of 8-bit values."""
    return chip_for("tpu", chip).sublane_tile(itemsize)


@dataclasses.dataclass(frozen=True)
class RowBlocks:
    """Blocks of whole rows for a (rows, cols) view: grid over row blocks only.

    cpu: one block of the whole array. gpu: power-of-two ``(br, bc)`` with ``bc >= cols``
    (padded lanes are masked before every reduction), within the chip's registers. tpu:
    ``bc == cols`` (the full dim is always a legal lane block), ``br`` a multiple of the
    sublane tile or all rows, within the chip's scoped VMEM.
    """
    target: Target
    rows: int
    cols: int
    br: int
    bc: int
    sublane: int = 8
    num_warps: int = 4
    num_stages: int = 1
    vmem_bytes: int = 0
    chip: str = ""

    def __post_init__(self):
        _with_target(self)
        check_block(self.target, self, {"gpu": (_whole_row_block, _within_registers),
                                         "tpu": (_whole_row_lanes, _within_vmem)})

    @property
    def grid(self) -> tuple[int]:
        return (math.ceil(self.rows / self.br),)

    @property
    def dimension_semantics(self) -> tuple:
        return ("parallel",)

    @property
    def padded(self) -> bool:
        return self.bc != self.cols

    def __str__(self) -> str:
        return f"{self.br}x{self.bc} row blocks, grid {self.grid[0]}"


def _whole_row_block(b: RowBlocks) -> str | None:
    if b.bc < b.cols:
        return f"row block {b.bc} shorter than the row ({b.cols})"
    return None


def _within_registers(b: RowBlocks) -> str | None:
    limit = b.target.gpu_row_block_elems
    if b.br * b.bc > limit and b.br > 1:
        return f"row block {b.br}x{b.bc} exceeds {limit} elements (registers of {b.chip})"
    return None


def _whole_row_lanes(b: RowBlocks) -> str | None:
    return "TPU row blocks must span the whole row" if b.bc != b.cols else None


def _within_vmem(b: RowBlocks) -> str | None:
    budget = b.target.vmem_budget
    if b.vmem_bytes > budget:
        return f"TPU row blocks need {b.vmem_bytes} B of VMEM > {budget} ({b.chip})"
    return None


def row_blocks(rows: int, cols: int, *, target: Target | str, itemsize: int = 4, n_arrays: int = 2,
               chip=None) -> RowBlocks:
    """Whole-row blocks for a reduction region (tuning table first, heuristic fallback)."""
    target = Target.of(target, chip)
    c = target.chip
    if target.is_cpu:
        return RowBlocks(target, rows, cols, rows, cols)
    key = (target.kind, next_pow2(rows), next_pow2(cols))
    if target.is_gpu:
        if cols > target.max_row_elems:
            raise ValueError(f"row of {cols} elements does not fit one Triton block on {c.name}")
        bc = next_pow2(cols)
        br = TUNED_ROWS.get(key) or max(1, min(next_pow2(rows), target.gpu_row_block_elems // bc))
        return RowBlocks(target, rows, cols, br, bc, num_warps=_warps(br * bc))
    if target.is_tpu:
        sub = c.sublane_tile(itemsize)
        per_row = target.lane_padded(cols) * max(itemsize, 4)
        br = TUNED_ROWS.get(key) or max(sub, (TPU_MAX_BLOCK_BYTES // per_row) // sub * sub)
        while br > sub and 2 * n_arrays * br * per_row > target.vmem_budget:
            br -= sub
        br = rows if rows <= br else br
        return RowBlocks(target, rows, cols, br, cols, sublane=sub,
                         vmem_bytes=2 * n_arrays * min(br, rows) * per_row)



# ---------------------------------------------------------------------------------------------
# Column-tiled row blocks (reduction family, rows longer than the target's row budget):
# :mod:`hlofuse.kernels.row_tiled` walks each row in ``bc``-wide column tiles with running
# (online) row statistics, so a row of any length is one kernel.
# ---------------------------------------------------------------------------------------------

TILED_GPU_TILE = 2048       # heuristic: column tile of a gpu tiled row kernel (a power of two)
TILED_TPU_TILE = 4096       # heuristic: lanes of a tpu column tile (a multiple of 128)


@dataclasses.dataclass(frozen=True)
class TiledRowBlocks:
    """``(br, bc)`` tiles of a (rows, cols) view whose rows are walked tile by tile.

    gpu: power-of-two ``br`` and ``bc`` within the chip's registers (the grid runs over row
    blocks; each program loops over the column tiles, once per pass). tpu: ``bc`` a multiple
    of 128 (or all columns), ``br`` a multiple of the sublane tile (or all rows); the grid is
    (row blocks, passes x column tiles), the second axis sequential. cpu has no tiled kernel
    (its rows are unbounded).
    """
    target: Target
    rows: int
    cols: int
    br: int
    bc: int
    sublane: int = 8
    num_warps: int = 4
    num_stages: int = 1
    vmem_bytes: int = 0
    chip: str = ""
    passes: int = 0               # passes over each row (set by the builder; 0: not yet known)

    def __post_init__(self):
        _with_target(self)
        if self.target.is_cpu:
            raise ValueError("no column-tiled row kernel on cpu (a cpu row is unbounded)")
        check_block(self.target, self, {"gpu": (_within_registers,), "tpu": (_within_vmem,)})

    @property
    def tiles(self) -> int:
        return math.ceil(self.cols / self.bc)

    @property
    def grid(self) -> tuple[int]:
        return (math.ceil(self.rows / self.br),)

    @property
    def dimension_semantics(self) -> tuple:
        return ("parallel", "arbitrary")

    @property
    def padded(self) -> bool:
        return self.cols % self.bc != 0

    def __str__(self) -> str:
        passes = f", {self.passes} passes" if self.passes else ""
        return f"{self.br}x{self.bc} column tiles ({self.tiles} per row{passes}), grid {self.grid[0]}"


def tiled_row_blocks(rows: int, cols: int, *, target: Target | str, itemsize: int = 4,
                     n_arrays: int = 2, chip=None) -> TiledRowBlocks:
    """Column tiles for a row longer than the target's row budget (heuristic)."""
    target = Target.of(target, chip)
    c = target.chip
    if target.is_gpu:
        elems = target.gpu_row_block_elems
        bc = min(TILED_GPU_TILE, next_pow2(cols), 1 << (elems.bit_length() - 1))
        br = max(1, min(next_pow2(rows), elems // bc))
        return TiledRowBlocks(target, rows, cols, br, bc, num_warps=_warps(br * bc))
    if target.is_tpu:
        sub = c.sublane_tile(itemsize)
        size = max(itemsize, 4)
        for br in ((rows,) if rows <= 2 * sub else (2 * sub, sub)):
            # lanes that fit the VMEM budget with every array double-buffered
            fit = target.vmem_budget // (2 * n_arrays * br * size) // TPU_LANES * TPU_LANES
            if fit >= TPU_LANES:
                break
        else:
            raise ValueError(f"no {TPU_LANES}-lane column tile fits the VMEM of {c.name}")
        bc = min(TILED_TPU_TILE, fit)
        if cols <= bc:
            bc = cols
        return TiledRowBlocks(target, rows, cols, br, bc, sublane=sub,
                              vmem_bytes=2 * n_arrays * br * target.lane_padded(bc) * size)
    raise ValueError("no column-tiled row kernel on cpu (a cpu row is unbounded)")


@dataclasses.dataclass(frozen=True)
class MatmulBlocks:
    """Tiles of a (batch, M, N, K) matmul with f32 accumulation.

    cpu: one block of the whole arrays (batch included), one grid step. gpu (Triton): grid
    (batch, M/bm, N/bn), K looped inside the kernel in ``bk`` chunks; power-of-two tiles of at
    least 16 (``tl.dot``), ``num_stages`` pipelined operand tiles within the chip's shared
    memory per block. tpu (Mosaic): grid (batch, M/bm, N/bn, K/bk), K last and ``arbitrary``
    with a VMEM f32 accumulator; ``bm`` a multiple of the sublane tile or M, ``bn``/``bk``
    multiples of 128 or the full dim, ``bk`` dividing K (padded K would add garbage to the
    sum), all double-buffered tiles within the chip's scoped VMEM.
    """
    target: Target
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
    chip: str = ""

    def __post_init__(self):
        _with_target(self)
        if min(self.bm, self.bn, self.bk) < 1:
            raise ValueError("matmul tiles must be positive")
        if self.target.is_cpu:
            if (self.bm, self.bn, self.bk) != (self.m, self.n, self.k):
                raise ValueError("cpu interpret tiles must cover the whole arrays")
        elif self.target.is_gpu:
            if not all(is_pow2(b) and b >= 16 for b in (self.bm, self.bn, self.bk)):
                raise ValueError(f"Triton tiles must be powers of two >= 16, got {self.bm}x{self.bn}x{self.bk}")
            budget = self.target.smem_budget
            if self.smem_bytes > budget:
                raise ValueError(f"tiles need {self.smem_bytes} B of shared memory > {budget} "
                                 f"({self.chip})")
        elif self.target.is_tpu:
            lanes = self.target.chip.lanes
            if self.bm != self.m and self.bm % self.sublane:
                raise ValueError(f"TPU bm {self.bm} must be a multiple of {self.sublane} or {self.m}")
            for b, full, what in ((self.bn, self.n, "bn"), (self.bk, self.k, "bk")):
                if b != full and b % lanes:
                    raise ValueError(f"TPU {what} {b} must be a multiple of {lanes} or {full}")
            if self.k % self.bk:
                raise ValueError(f"TPU bk {self.bk} must divide K={self.k}")
            budget = self.target.vmem_budget
            if self.vmem_bytes > budget:
                raise ValueError(f"TPU tiles need {self.vmem_bytes} B of VMEM > {budget} "
                                 f"({self.chip})")

    @property
    def k_steps(self) -> int:
        return math.ceil(self.k / self.bk)

    @property
    def smem_bytes(self) -> int:
        return gpu_smem_bytes(self.bm, self.bn, self.bk, self.num_stages, self.members, self.itemsize)

    @property
    def vmem_bytes(self) -> int:
        return tpu_vmem_bytes(self.bm, self.bn, self.bk, self.members, self.itemsize, self.extra_bytes)

    @property
    def grid(self) -> tuple:
        if self.target.is_cpu:
            return (1,)
        g = (self.batch, math.ceil(self.m / self.bm), math.ceil(self.n / self.bn))
        return g + (self.k_steps,) if self.target.is_tpu else g

    @property
    def grid_steps(self) -> int:
        return math.prod(self.grid)

    @property
    def dimension_semantics(self) -> tuple:
        return ("parallel", "parallel", "parallel", "arbitrary")

    def __str__(self) -> str:
        g = "x".join(map(str, self.grid))
        extra = f", {self.num_warps} warps, {self.num_stages} stages" if self.target.is_gpu else ""
        return f"{self.bm}x{self.bn}x{self.bk} tiles, grid {g}{extra}"


def gpu_smem_bytes(bm: int, bn: int, bk: int, stages: int, members: int, itemsize: int) -> int:
    """Shared memory of Triton's software pipeline: ``stages`` buffered operand tiles."""
    return stages * (bm * bk + members * bk * bn) * itemsize


def tpu_vmem_bytes(bm: int, bn: int, bk: int, members: int, itemsize: int, extra_bytes: int = 0) -> int:
    """Double-buffered operand and f32 output tiles plus the f32 accumulator scratch."""
    tiles = (bm * bk + members * bk * bn) * itemsize
    return 2 * (tiles + members * bm * bn * 4 + extra_bytes) + members * bm * bn * 4


# f32 accumulator values per thread a gpu matmul program may hold (all members' ``bm x bn``
# tiles over ``num_warps`` warps): a horizontal kernel holds one accumulator per member dot.
# Q/K/V (3 members) in 64x64 tiles at 4 warps held 96 per thread and spilled (ptxas, deviceless
# compile, hlofuse.runtime.aot: BERT/GPT-2 layers with biases 255 registers/thread, 96 B on H100
# and 56-96 B on A100); the rule halves ``bn`` to 64x32 tiles (48 per thread): no spills, and the
# occupancy bound rose or stayed on every case of .ci/aot_matrix.py (H100 f32 BERT 0.06 -> 0.12,
# bf16 0.12 -> 0.19, int8 GPT-2 0.12 -> 0.25; A100 0.12 -> 0.12-0.19). Two members (64x64) fit.
GPU_MAX_ACC_PER_THREAD = 64


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


def matmul_blocks(batch: int, m: int, n: int, k: int, *, target: Target | str, itemsize: int = 4,
                  members: int = 1, extra_bytes: int = 0, chip=None) -> MatmulBlocks:
    """Tiles for a (batch, M, N, K) matmul (tuning table first, heuristic fallback)."""
    target = Target.of(target, chip)
    c = target.chip
    if target.is_cpu:
        return MatmulBlocks(target, batch, m, n, k, m, n, k, members=members, itemsize=itemsize)
    key = (target.kind, next_pow2(m), next_pow2(n), next_pow2(k))
    if target.is_gpu:
        if key in TUNED_MATMUL:
            bm, bn, bk = TUNED_MATMUL[key]
        else:
            bm = min(64, max(16, next_pow2(m)))
            bn = min(64 if members > 1 else 128, max(16, next_pow2(n)))
            bk = _gpu_bk(k)
            # one f32 accumulator tile per member within the threads' registers
            warps = 4 if bm * bn <= 4096 else 8
            while (members > 1 and bn > 16
                   and members * bm * bn > GPU_MAX_ACC_PER_THREAD * c.warp_size * warps):
                bn //= 2
        stages = 3 if math.ceil(k / bk) > 2 else 2
        while stages > 1 and gpu_smem_bytes(bm, bn, bk, stages, members, itemsize) > c.smem_per_block:
            stages -= 1
        return MatmulBlocks(target, batch, m, n, k, bm, bn, bk, members=members, itemsize=itemsize,
                            num_warps=4 if bm * bn <= 4096 else 8, num_stages=stages)
    if target.is_tpu:
        sub = c.sublane_tile(itemsize)
        lanes = c.lanes
        if key in TUNED_MATMUL:
            bm, bn, bk = TUNED_MATMUL[key]
        else:
            bm = m if m <= 512 else 512
            bn = _tpu_tile(n, 512, lanes) if n % lanes == 0 or n <= 512 else 512
            bk = k if k <= 1024 or k % lanes else _tpu_tile(k, 1024, lanes)
        while (tpu_vmem_bytes(bm, bn, bk, members, itemsize, extra_bytes) > target.vmem_budget
               and (bm > sub or bn > lanes)):
            if bm > sub and (bm >= bn or bn <= lanes):
                bm = max(sub, (bm // 2) // sub * sub)
            else:
                bn = max(lanes, (bn // 2) // lanes * lanes)
        return MatmulBlocks(target, batch, m, n, k, bm, bn, bk, members=members, itemsize=itemsize,
                            sublane=sub, extra_bytes=extra_bytes, num_stages=1)


# ---------------------------------------------------------------------------------------------
# Tiling report: a matmul's or convolution's shape against the target's native tile
# ---------------------------------------------------------------------------------------------

def native_tile(target: Target | str, itemsize: int) -> tuple[int, int, int] | None:
    """The (M, N, K) tile the target's matrix unit works in, for ``itemsize``-byte operands:
    TPU MXU: ``mxu`` x ``mxu`` weights (128x128 on v4/v5e, 256x256 on v6e) streaming rows in
    sublane tiles (8 rows of f32, 16 of bf16, 32 of int8); GPU tensor cores: ``mma.sync``
    m16n8 (A100) or ``wgmma`` m64n8 (H100) with K = 32 bytes (k8 tf32, k16 bf16, k32 int8).
    None on cpu (no fixed tile)."""
    target = Target.of(target)
    if target.is_cpu:
        return None
    c = target.chip
    if target.is_tpu:
        return (c.sublane_tile(itemsize), c.mxu, c.mxu)
    m = 64 if c.compute_capability >= (9, 0) else 16
    return (m, 8, 32 // max(1, itemsize))


def padding_waste(m: int, n: int, k: int, tile) -> float:
    """Percent of the matrix unit's multiply-adds spent on padding when (M, N, K) is padded up
    to multiples of ``tile``."""
    if not tile:
        return 0.0
    tm, tn, tk = tile
    padded = (-(-m // tm) * tm) * (-(-n // tn) * tn) * (-(-k // tk) * tk)
    return round(100.0 * (1.0 - (m * n * k) / padded), 2) if padded else 0.0
