"""The compilation target: one object, built once at the API boundary, passed everywhere.

A :class:`Target` says which XLA platform a program is optimized for (``cpu``, ``gpu``,
``tpu``), which chip its kernels are tiled for (a :class:`~hlofuse.core.chips.Chip`, from
:mod:`hlofuse.core.chips`; ``None`` on cpu), and the budgets that follow from that chip: the longest
row a reduction keeps on chip, the VMEM or shared memory one kernel instance may plan for. The
tiling rules (:mod:`hlofuse.kernels.tiling`), the fusion predicates and the cost model all read
these figures from here, so no per-chip constant is written twice.

:meth:`Target.of` is the one normalizer: it accepts a :class:`Target`, a target name, a jax
platform name (``cuda``, ``rocm``, ``host``) or ``None`` (jax's default backend), and a chip
(name or :class:`~hlofuse.core.chips.Chip`; default: the chip in force via
:func:`hlofuse.core.chips.use`, else the platform's default chip; ignored for cpu, an error when it
is a chip of the other accelerator).
"""

from __future__ import annotations

import dataclasses

from hlofuse.core import chips as _chips

__all__ = ["Target", "KINDS", "CPU"]

KINDS = ("cpu", "gpu", "tpu")
_ALIASES = {"cuda": "gpu", "rocm": "gpu", "host": "cpu"}
_PLATFORM = {"cpu": "cpu", "gpu": "cuda", "tpu": "tpu"}

# Mosaic keeps temporaries (a dot's f32 result, epilogue values) in VMEM beside the blocks
TPU_VMEM_HEADROOM = 0.75
# what a cpu "kernel" may hold: the CPU path runs plain XLA loops, so rows are unbounded
_CPU_ROW_LIMIT = 1 << 30
# the longest gpu/tpu row a column-tiled row kernel walks
_TILED_ROW_LIMIT = 1 << 24


@dataclasses.dataclass(frozen=True, eq=False)
class Target:
    """Where a program runs: platform kind plus, on gpu/tpu, the chip its kernels fit.

    Equal to another Target of the same kind and chip. Comparing it with a string raises
    TypeError (so does looking it up in a dict keyed by strings): a leftover ``target == "gpu"``
    would otherwise be silently False; ask ``target.is_gpu`` or ``target.kind``.
    """
    kind: str                         # 'cpu' | 'gpu' | 'tpu'
    chip: _chips.Chip | None = None   # None on cpu

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"target must be one of {KINDS}, got {self.kind!r}")
        if (self.chip is None) != (self.kind == "cpu"):
            raise ValueError(f"target {self.kind!r} with chip {self.chip!r}: a gpu/tpu target "
                             f"needs a chip and a cpu target has none")
        if self.chip is not None and self.chip.target != self.kind:
            raise ValueError(f"chip {self.chip.name} is a {self.chip.target} chip, not a "
                             f"{self.kind} one")

    def __eq__(self, other):
        if isinstance(other, Target):
            return self.kind == other.kind and self.chip_name == other.chip_name
        if isinstance(other, str):
            raise TypeError(f"Target({self.describe()}) compared with the string {other!r}: "
                            f"use target.kind or target.is_{other if other in KINDS else 'gpu'}")
        return NotImplemented

    def __hash__(self):
        return hash(self.kind)  # as a str's would: a lookup among string keys meets __eq__

    # -- construction ---------------------------------------------------------------------------
    @classmethod
    def of(cls, target: "Target | str | None" = None, chip=None) -> "Target":
        """The target for a name (``cpu``/``gpu``/``tpu``, or a jax platform name), a Target
        (returned as is unless ``chip`` re-tiles it), or None (jax's default backend)."""
        if isinstance(target, Target):
            if chip is None or target.is_cpu:
                return target
            return cls(target.kind, _chips.resolve(target.kind, chip))
        if target is None:
            import jax  # only when asked for the default backend
            target = jax.default_backend()
        kind = _ALIASES.get(str(target), str(target))
        if kind not in KINDS:
            raise ValueError(f"target must be one of {KINDS} (or a jax platform: cuda, rocm, "
                             f"host) or None, got {target!r}")
        if kind == "cpu":
            return CPU  # a chip names a gpu/tpu; the cpu path has no tiles to fit to one
        return cls(kind, _chips.resolve(kind, chip))

    @classmethod
    def from_platform(cls, platform: str) -> "Target | None":
        """The target of a jax platform name (``cpu``, ``cuda``, ``rocm``, ``tpu``), or None."""
        kind = _ALIASES.get(platform, platform)
        return cls.of(kind) if kind in KINDS else None

    # -- what it is -----------------------------------------------------------------------------
    @property
    def is_cpu(self) -> bool:
        return self.kind == "cpu"

    @property
    def is_gpu(self) -> bool:
        return self.kind == "gpu"

    @property
    def is_tpu(self) -> bool:
        return self.kind == "tpu"

    @property
    def platform(self) -> str:
        """The jax lowering platform: ``cpu``, ``cuda``, ``tpu``."""
        return _PLATFORM[self.kind]

    @property
    def backend(self) -> str:
        """The name ``jax.extend.backend.get_backend`` takes."""
        return self.kind

    @property
    def chip_name(self) -> str:
        return self.chip.name if self.chip is not None else ""

    def __str__(self) -> str:
        return self.kind

    def describe(self) -> str:
        return self.kind if self.chip is None else f"{self.kind} ({self.chip.name})"

    # -- budgets that follow from the chip --------------------------------------------------------
    @property
    def max_row_elems(self) -> int:
        """Longest row a reduction kernel keeps on chip. gpu: one row in registers (four live
        values per element); tpu: a sublane tile of f32 rows, in and out double-buffered, with
        room for as much again in intermediates; cpu: no limit."""
        c = self.chip
        if self.is_gpu:
            return c.registers_per_block // 4
        if self.is_tpu:
            return c.scoped_vmem_bytes // (2 * 2 * 2 * 4 * c.sublanes)
        return _CPU_ROW_LIMIT

    @property
    def max_tiled_row_elems(self) -> int:
        """Longest row a reduction kernel takes at all: gpu/tpu rows longer than
        :attr:`max_row_elems` are walked in column tiles (``hlofuse.kernels.row_tiled``) up to
        2^24 elements (column offsets stay far inside int32); cpu: no limit."""
        return _CPU_ROW_LIMIT if self.is_cpu else _TILED_ROW_LIMIT

    @property
    def gpu_row_block_elems(self) -> int:
        """Elements of one (br, bc) row block held in registers: about eight live 32-bit values
        per element (loaded rows, intermediates, result) share the block's register file."""
        return self._need("gpu").registers_per_block // 8

    @property
    def smem_budget(self) -> int:
        """Shared memory one Triton program may use (the chip's opt-in maximum per block)."""
        return self._need("gpu").smem_per_block

    @property
    def vmem_budget(self) -> int:
        """VMEM the blocks of one TPU kernel may plan for: the chip's scoped limit (what XLA:TPU
        enforces without ``vmem_limit_bytes``) less room for Mosaic's own temporaries. Measured:
        512x512x1024 f32 matmul tiles modeled at 13 MiB did not fit v5e's 16 MiB."""
        return int(self._need("tpu").scoped_vmem_bytes * TPU_VMEM_HEADROOM)

    def lane_padded(self, cols: int) -> int:
        """Columns as VMEM holds them: the minor dim padded to a multiple of the lanes (128)."""
        lanes = self._need("tpu").lanes
        return -(-cols // lanes) * lanes

    def _need(self, kind: str) -> _chips.Chip:
        if self.kind != kind:
            raise ValueError(f"a {kind} budget asked of a {self.kind} target")
        return self.chip


CPU = Target("cpu")
