"""Peak device memory of training steps per chip, measured without the chip (issue 45).

    python -m bench --memory                      # every step at real size: h100, a100, v5e, v6e
    python -m bench --memory --quick              # small sizes, h100 and v5e (CI)
    python -m bench.memory --chips h100 --steps mlp bert --json out.json --plot out.png
    python -m bench --memory --largest-batch --chips h100 --steps gpt2 llama   # batch that fits
    python -m bench --memory --chips h100,v5e --steps gpt2_fsdp llama_fsdp      # sharded rows

Each training step is written as users write one in plain JAX: a model's loss,
``jax.value_and_grad``, an ``optax.adamw`` update, parameters and optimizer state donated
(``donate_argnums=(0, 1)``) to both ``jax.jit`` and ``hlofuse.jit(target=...)``. Both are
compiled for the chip by its own compiler, here, without the chip (the ``aot`` extra's XLA:GPU
with a target description of the GPU, libtpu's compile-only topologies;
``../shared/reference/deviceless-compile.md``), one process per chip. The compiled executable's
``memory_analysis()`` is XLA's buffer assignment for that chip, the bytes the chip would
allocate: peak = arguments + outputs + temporaries - aliased (donated). ``cost_analysis()``
gives flops and bytes where the compiler reports them (deviceless XLA:GPU reports none;
XLA:TPU does not count a Mosaic kernel's flops, so the kernels' flops are added from their
regions). The table is of ratios hlofuse / jax.jit, one row per step and chip.

Sharded rows (``*_fsdp`` steps): the same step on several devices of the chip, compiled by
XLA's SPMD partitioner: 8 GPUs (H100/A100 ``1x1x8``) or a TPU ``2x2`` slice (4 chips); FSDP:
every parameter and optimizer-state array sharded along its first dim the device count
divides, the batch along its batch dim, with each device's batch the single-chip row's. The
figures are per device.

``--largest-batch``: per step and chip, the largest batch whose peak fits the chip's memory (the
chip table's HBM capacity) under ``jax.jit`` and under ``hlofuse.jit``: peaks compiled at the
step's batch and twice it give the bytes per example, the predicted largest batch is compiled,
and the search narrows between the largest batch that fit and the smallest that did not
(:func:`largest_batch`) until they are neighbours (a handful of compiles per program). ``--capacity
8GiB`` fits that instead of the chip's memory.

Deterministic figures only: nothing here is timed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Callable

import numpy as np

__all__ = ["STEPS", "FSDP_STEPS", "CHIPS", "QUICK_CHIPS", "main", "measure_chip", "run_chip", "table",
           "largest_batch_chip", "largest_batch", "batch_table"]

CHIPS = ["h100", "a100", "v5e", "v6e"]
QUICK_CHIPS = ["h100", "v5e"]
MIB = 1 << 20


# ----------------------------------------------------------------------------------------------
# The steps: models from bench.workloads, a loss, optax's AdamW
# ----------------------------------------------------------------------------------------------
def _mse(y, t):
    import jax.numpy as jnp
    return jnp.mean((y.astype(jnp.float32) - t.astype(jnp.float32)) ** 2)


def _bert(quick: bool):
    from bench import workloads as w
    s, b, d, ff, layers = (128, 2, 256, 1024, 2) if quick else (512, 32, 768, 3072, 2)
    rng = np.random.default_rng(0)
    params = [w._transformer_params(rng, d, ff) for _ in range(layers)]
    x = np.zeros((b, s, d), np.float32)
    mask = np.zeros((b, 1, 1, s), np.float32)

    def loss(p, x, mask, y):
        h = x
        for lp in p:
            h = w.bert_layer(lp, h, mask, n_heads=d // 64)
        return _mse(h, y)
    return loss, params, (x, mask, x), f"BERT-base encoder x{layers}, S={s}, batch {b}, f32"


def _gpt2(quick: bool):
    from bench import workloads as w
    s, b, d, ff, layers = (128, 2, 256, 1024, 2) if quick else (1024, 4, 768, 3072, 2)
    rng = np.random.default_rng(0)
    params = [w._transformer_params(rng, d, ff) for _ in range(layers)]
    x = np.zeros((b, s, d), np.float32)

    def loss(p, x, y):
        h = x
        for lp in p:
            h = w.gpt2_block(lp, h, n_heads=d // 64)
        return _mse(h, y)
    return loss, params, (x, x), f"GPT-2-small decoder x{layers}, causal, S={s}, batch {b}, f32"


def _vit(quick: bool):
    """ViT-B/16 at 224x224: a patch embedding (16x16 conv as a reshape + dense) and encoder
    layers over 197 tokens."""
    import jax.numpy as jnp
    from bench import workloads as w
    img, b, d, ff, layers = (64, 2, 256, 1024, 2) if quick else (224, 32, 768, 3072, 2)
    n = (img // 16) ** 2
    rng = np.random.default_rng(0)
    params = {"embed": w._dense_params(rng, 16 * 16 * 3, d),
              "cls": np.zeros((1, 1, d), np.float32),
              "layers": [w._transformer_params(rng, d, ff) for _ in range(layers)]}
    x = np.zeros((b, img, img, 3), np.float32)
    y = np.zeros((b, n + 1, d), np.float32)
    mask = np.zeros((b, 1, 1, n + 1), np.float32)

    def loss(p, x, y):
        bb = x.shape[0]
        patches = x.reshape(bb, img // 16, 16, img // 16, 16, 3).transpose(0, 1, 3, 2, 4, 5)
        h = patches.reshape(bb, n, 16 * 16 * 3) @ p["embed"]["w"] + p["embed"]["b"]
        h = jnp.concatenate([jnp.broadcast_to(p["cls"], (bb, 1, d)), h], axis=1)
        for lp in p["layers"]:
            h = w.bert_layer(lp, h, mask, n_heads=d // 64)
        return _mse(h, y)
    return loss, params, (x, y), f"ViT-B/16 encoder x{layers}, {img}x{img}, batch {b}, f32"


def _llama(quick: bool):
    import jax.numpy as jnp
    from bench import workloads as w
    if quick:
        s, b, d, ff, heads, kv, layers = 128, 2, 256, 704, 4, 2, 2
    else:   # a Llama-class 1B layer (d=2048, ff=5632, 32 heads, 4 kv heads), 2 of its 22 layers
        s, b, d, ff, heads, kv, layers = 2048, 4, 2048, 5632, 32, 4, 2
    rng = np.random.default_rng(0)
    made = [w._llama_args(s=s, b=b, d=d, ff=ff, n_heads=heads, n_kv=kv)(rng) for _ in range(layers)]
    bf16 = lambda a: np.asarray(a).astype(jnp.bfloat16)  # noqa: E731
    params = [{k: bf16(v) for k, v in m[0].items()} for m in made]
    x, cos, sin = (bf16(a) for a in made[0][1:])

    def loss(p, x, cos, sin, y):
        h = x
        for lp in p:
            h = w.llama_block(lp, h, cos, sin, n_heads=heads, n_kv=kv)
        return _mse(h, y)
    return loss, params, (x, cos, sin, x), \
        f"Llama-1B-class decoder x{layers}, S={s}, batch {b}, bf16"


def _bn_train(x, bn):
    """Training BatchNorm (batch statistics over N, H, W), as Flax's BatchNorm trains."""
    import jax.numpy as jnp
    m = x.mean((0, 1, 2))
    v = ((x - m) ** 2).mean((0, 1, 2))
    return (x - m) * (bn["gamma"] / jnp.sqrt(v + 1e-5)) + bn["beta"]


def _resnet(quick: bool):
    import jax
    from bench import workloads as w
    hw, b = (16, 2) if quick else (56, 64)
    params, x = w._resnet_args("NHWC", hw=hw, b=b)(np.random.default_rng(0))
    params = [{k: ({"gamma": v["gamma"], "beta": v["beta"]} if k.startswith("bn") else v)
               for k, v in blk.items()} for blk in params]

    def loss(p, x, y):
        for blk in p:
            h = jax.nn.relu(_bn_train(w._conv(x, blk["w1"], "NHWC"), blk["bn1"]))
            h = jax.nn.relu(_bn_train(w._conv(h, blk["w2"], "NHWC"), blk["bn2"]))
            h = _bn_train(w._conv(h, blk["w3"], "NHWC"), blk["bn3"])
            sc = _bn_train(w._conv(x, blk["wsc"], "NHWC"), blk["bnsc"]) if "wsc" in blk else x
            x = jax.nn.relu(h + sc)
        return _mse(x, y)
    y = np.zeros(x.shape[:-1] + (256,), np.float32)
    return loss, params, (x, y), (f"ResNet-50 stage conv2_x (3 bottlenecks, training "
                                  f"BatchNorm), {hw}x{hw}x256, batch {b}, NHWC f32")


def _mlp(quick: bool):
    from bench import workloads as w
    d, b = (512, 32) if quick else (4096, 256)
    params = [w._dense_params(np.random.default_rng(i), d, d) for i in range(3)]
    x = np.zeros((b, d), np.float32)

    def loss(p, x, y):
        return _mse(w.mlp(p, x), y)
    return loss, params, (x, x), f"MLP 3x{d}, GELU, batch {b}, f32"


#: name -> builder(quick) -> (loss(params, *batch), params, batch, description)
STEPS: dict[str, Callable] = {"bert": _bert, "gpt2": _gpt2, "vit": _vit, "llama": _llama,
                              "resnet": _resnet, "mlp": _mlp}


def train_step(loss: Callable):
    """The step users write: value_and_grad, optax.adamw, new params and state out."""
    import jax
    import optax
    opt = optax.adamw(1e-4)

    def step(params, opt_state, *batch):
        value, grads = jax.value_and_grad(loss)(params, *batch)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value
    return step, opt


# ----------------------------------------------------------------------------------------------
# One chip (a worker process): compile both programs, read XLA's figures
# ----------------------------------------------------------------------------------------------
#: sharded rows: step name -> the single-chip step it shards (FSDP over the chip's slice)
FSDP_STEPS = {"gpt2_fsdp": "gpt2", "llama_fsdp": "llama"}


def _slice_devices(chip) -> list:
    """The devices of a multi-device slice of ``chip``: 8 GPUs, or a TPU 2x2 (4 chips)."""
    from jax.experimental import topologies
    if chip.target == "tpu":
        name = chip.topology.split(":")[0]
        topo = topologies.get_topology_desc(f"{name}:2x2", platform="tpu",
                                            chips_per_host_bounds=(2, 2, 1))
    else:
        topo = topologies.get_topology_desc(platform="cuda", topology="1x1x8",
                                            target_config=chip.target_config)
    return list(topo.devices)


def _setup(chip_name: str, sharded: bool = False):
    """``(chip, mesh, replicated sharding)`` for compiling on ``chip_name`` in this process
    (``sharded``: on a multi-device slice of it, :func:`_slice_devices`)."""
    import jax  # noqa: F401
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from hlofuse.core import chips as _chips
    from hlofuse.runtime.aot import _device
    chip = _chips.get(chip_name)
    devices = _slice_devices(chip) if sharded else [_device(chip)]
    mesh = Mesh(np.array(devices), ("x",))
    return chip, mesh, NamedSharding(mesh, P())


def _fsdp(mesh, shape, batch: bool = False):
    """FSDP's sharding of one array: its batch dim (``batch``) or its first dim the mesh's
    device count divides, along the mesh axis; replicated when none does."""
    from jax.sharding import NamedSharding, PartitionSpec as P
    n = mesh.devices.size
    dims = [0] if batch else range(len(shape))
    for d in dims:
        if len(shape) > d and shape[d] % n == 0 and shape[d] >= n:
            return NamedSharding(mesh, P(*([None] * d + ["x"])))
    return NamedSharding(mesh, P())


def _step_args(params, opt, batch, rep, batch_size: int | None = None, base: int | None = None,
               fsdp: bool = False):
    """The step's argument specs (params, optimizer state, batch), replicated; with
    ``batch_size``, every batch array whose leading dim is the step's ``base`` batch gets it;
    ``fsdp``: sharded as FSDP shards them over ``rep``'s mesh (:func:`_fsdp`)."""
    import jax
    mesh = rep.mesh

    def spec(a, lead=False):
        shape = tuple(np.shape(a))
        is_batch = lead and base is not None and shape[:1] == (base,)
        if is_batch and batch_size is not None:
            shape = (batch_size,) + shape[1:]
        sharding = _fsdp(mesh, shape, batch=is_batch) if fsdp else rep
        return jax.ShapeDtypeStruct(shape, np.asarray(a).dtype, sharding=sharding)
    p_spec = jax.tree_util.tree_map(spec, params)
    o_spec = jax.tree_util.tree_map(
        lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype,
                                       sharding=_fsdp(mesh, s.shape) if fsdp else rep),
        jax.eval_shape(opt.init, p_spec))
    return (p_spec, o_spec, *[spec(b, lead=True) for b in batch])


def _compile(step, args, chip, mesh, program: str, options: dict | None = None):
    """``program`` ("jax" or "hlofuse") of ``step`` compiled for ``chip``: (compiled, lowered
    hlofuse program or None)."""
    import jax
    import hlofuse
    from hlofuse.core import chips as _chips
    with jax.set_mesh(mesh):
        if program == "jax":
            return jax.jit(step, donate_argnums=(0, 1)).trace(*args).lower().compile(), None
        f = hlofuse.jit(step, target=chip.target, donate_argnums=(0, 1), options=options)
        with _chips.use(chip):
            lowered = f.lower(*args)
            return lowered.jax_lowered.compile(), lowered


def measure_chip(chip_name: str, steps: list[str], quick: bool,
                 options: dict | None = None) -> list[dict]:
    """In this process (the chip's compiler loaded): each step under jax.jit and hlofuse.jit
    (with pass ``options``), compiled for the chip; one row per step."""
    from hlofuse.runtime import memory
    rows = []
    for name in steps:
        sharded = name in FSDP_STEPS
        chip, mesh, rep = _setup(chip_name, sharded)
        loss, params, batch, desc = STEPS[FSDP_STEPS.get(name, name)](quick)
        step, opt = train_step(loss)
        if sharded:   # each device's batch is the single-chip row's
            base = int(np.shape(batch[0])[0])
            n = mesh.devices.size
            args = _step_args(params, opt, batch, rep, base * n, base, fsdp=True)
            desc = f"{desc.replace(f'batch {base}', f'batch {base * n}')}, FSDP over {n} devices"
        else:
            args = _step_args(params, opt, batch, rep)
        row = {"step": name, "chip": chip.name, "target": chip.target, "what": desc,
               "devices": int(mesh.devices.size)}
        try:
            t0 = time.perf_counter()
            cj, _ = _compile(step, args, chip, mesh, "jax")
            row["jax_compile_s"] = round(time.perf_counter() - t0, 1)
            t0 = time.perf_counter()
            ch, lowered = _compile(step, args, chip, mesh, "hlofuse", options)
            row["hlofuse_compile_s"] = round(time.perf_counter() - t0, 1)
            report = lowered.report
            row["jax"] = memory.figures(cj).to_dict()
            row["hlofuse"] = memory.figures(ch).to_dict()
            kernels = report.kernels if report is not None else []
            row["kernels"] = len(kernels)
            row["kernel_kinds"] = sorted({r.kind for r in kernels})
            # per device: a kernel run per shard (region.extra['per_shard']) does its share of
            # the region's flops (FSDP splits the batch evenly); cost_analysis is per device
            n = int(mesh.devices.size)
            row["kernel_flops"] = int(sum(r.flops / n if r.extra.get("per_shard") else r.flops
                                          for r in kernels))
            row["kernels_per_shard"] = sum(1 for r in kernels if r.extra.get("per_shard"))
            row["regions_left_to_xla"] = len(report.left_to_xla) if report is not None else 0
        except Exception as e:  # noqa: BLE001 - the row says what failed; the others still run
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def largest_batch(peak: Callable[[int], int], base: int, capacity: int,
                  max_compiles: int = 12) -> tuple[int, list, bool]:
    """The largest batch ``b`` with ``peak(b) <= capacity`` (``peak``: bytes of one compile),
    searched from ``base`` and ``2 * base``: ``(b, [(batch, peak), ...], exact)``, ``exact``
    False when ``max_compiles`` ran out before ``b + 1`` was seen not to fit. The bytes grow
    about linearly with the batch: extrapolated from the two largest that fit until one does
    not, then interpolated between the largest batch that fit and the smallest that did not,
    each hit followed by a probe of its neighbour (a near-linear peak ends there), bisecting
    when probes keep fitting. 0 when even the base batch does not fit."""
    seen: dict[int, int] = {}

    def at(b):
        if b not in seen:
            seen[b] = peak(b)
        return seen[b]
    lo, hi = 0, None                       # largest known to fit, smallest known not to
    for b in (base, 2 * base):
        if at(b) <= capacity:
            lo = max(lo, b)
        else:
            hi = b if hi is None else min(hi, b)
            break
    if lo == 0:
        return 0, sorted(seen.items()), True
    moves: list = []                       # (how, side) of each step since both bounds exist
    while (hi is None or hi - lo > 1) and len(seen) < max_compiles:
        if hi is None:                     # extrapolate from the two largest batches that fit
            (b1, p1), (b2, p2) = sorted(seen.items())[-2:]
            slope = (p2 - p1) / (b2 - b1) if p2 > p1 else 0
            guess, how = max(lo + 1, int(b2 + (capacity - p2) // slope) if slope else 2 * lo), "x"
        elif len(moves) >= 3 and len({side for _, side in moves[-3:]}) == 1:
            guess, how = (lo + hi) // 2, "b"   # one bound stuck (a curved peak): bisect
        elif moves and moves[-1][0] == "i":    # an interpolation hit: probe its neighbour
            guess, how = (lo + 1 if moves[-1][1] == "lo" else hi - 1), "p"
        else:                              # interpolate between the bounds
            p_lo, p_hi = seen[lo], seen[hi]
            guess, how = lo + int((capacity - p_lo) * (hi - lo) // max(1, p_hi - p_lo)), "i"
        if hi is not None:
            guess = min(max(guess, lo + 1), hi - 1)
        if at(guess) <= capacity:
            lo, side = guess, "lo"
        else:
            hi, side = guess, "hi"
        if how != "x":
            moves.append((how, side))
    return lo, sorted(seen.items()), hi is not None and hi == lo + 1


def largest_batch_chip(chip_name: str, steps: list[str], quick: bool,
                       options: dict | None = None, capacity: int = 0) -> list[dict]:
    """In this process: per step, the largest batch that fits ``chip_name``'s memory (or
    ``capacity`` bytes) under jax.jit and under hlofuse.jit (:func:`largest_batch`); one row
    per step."""
    from hlofuse.runtime import memory
    chip, mesh, rep = _setup(chip_name)
    capacity = capacity or chip.hbm_capacity_bytes
    rows = []
    for name in steps:
        loss, params, batch, desc = STEPS[name](quick)
        step, opt = train_step(loss)
        base = int(np.shape(batch[0])[0])
        row = {"step": name, "chip": chip.name, "mode": "largest_batch", "what": desc,
               "capacity": capacity, "base_batch": base}
        try:
            for program in ("jax", "hlofuse"):
                def peak(b, program=program):
                    args = _step_args(params, opt, batch, rep, b, base)
                    compiled, _ = _compile(step, args, chip, mesh, program, options)
                    return memory.figures(compiled).peak
                t0 = time.perf_counter()
                best, tried, exact = largest_batch(peak, base, capacity)
                row[program] = {"batch": best, "tried": tried, "exact": exact,
                                "seconds": round(time.perf_counter() - t0, 1)}
        except Exception as e:  # noqa: BLE001 - the row says what failed; the others still run
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def _worker_main(argv) -> int:
    mode, chip, quick, steps = argv[0], argv[1], argv[2] == "quick", argv[3].split(",")
    options = json.loads(argv[4]) if len(argv) > 4 else None
    if mode.startswith("largest-batch"):   # "largest-batch:<bytes>" with --capacity
        largest_batch_chip(chip, steps, quick, options, int(mode.partition(":")[2] or 0))
    elif mode.startswith("rss:"):           # "rss:<program>": one program, one step, this CPU
        print(json.dumps(rss_measure(mode.partition(":")[2], steps[0], quick, options)),
              flush=True)
    else:
        measure_chip(chip, steps, quick, options)
    return 0


def run_chip(chip: str, steps: list[str], quick: bool, timeout: float = 3600,
             options: dict | None = None, mode: str = "peaks") -> list[dict]:
    """:func:`measure_chip` in a process of its own (the chip's compiler, ``$HLOFUSE_AOT_PYTHON``
    or this Python); a step the process did not get to has a row with ``error``."""
    from hlofuse.runtime import aot
    env = dict(os.environ, **aot._WORKER_ENV)
    env.setdefault("HLOFUSE_MODULE_CACHE", "0")
    cmd = [aot._python(), "-m", "bench.memory", "--worker", mode, chip,
           "quick" if quick else "full", ",".join(steps), json.dumps(options or {})]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        p = subprocess.run(cmd, env=env, cwd=root, capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        p = None
        err = f"timed out after {timeout:.0f}s"
    else:
        out, err = p.stdout, None
    rows = []
    for line in out.splitlines():
        if line.startswith("{"):
            try:
                rows.append(json.loads(line))
            except ValueError:
                pass
    done = {r["step"] for r in rows}
    for s in steps:
        if s not in done:
            tail = (p.stderr.strip().splitlines()[-1:] if p is not None and p.stderr else [""])[0]
            rows.append({"step": s, "chip": chip, "error": err or
                         f"compiler process exited {p.returncode}: {tail[:300]}"})
    return rows


# ----------------------------------------------------------------------------------------------
# The sanity check on this CPU: XLA's buffer assignment against the resident memory a call adds
# ----------------------------------------------------------------------------------------------
#: glibc's malloc serves blocks this large from their own mappings, returned on free, so a
#: call's buffers show in the resident set while it runs and leave it after (glibc's default
#: threshold grows with the blocks freed, and later blocks then come from the heap's pages)
RSS_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536", "JAX_PLATFORMS": "cpu"}
RSS_CALLS = 3


def rss_unavailable() -> str | None:
    """Why this process cannot reset its peak resident set (Linux's ``/proc/self/clear_refs``,
    value 5), or None."""
    from bench.common import proc_status, reset_peak_rss
    if not reset_peak_rss() or "VmHWM" not in proc_status():
        return "cannot reset the peak resident set here (Linux's /proc/self/clear_refs)"
    return None


def rss_measure(program: str, name: str, quick: bool, options: dict | None = None) -> dict:
    """In this process (run it fresh, with :data:`RSS_ENV`): ``program`` ("jax" or "hlofuse") of
    the step compiled for this CPU; XLA's figures for it and, per call (after one warm call),
    the peak resident bytes the call added: VmHWM reset before the call, minus VmRSS then."""
    import jax
    import jax.numpy as jnp
    import hlofuse
    from bench.common import proc_status, reset_peak_rss
    from hlofuse.runtime import memory
    loss, params, batch, desc = STEPS[name](quick)
    step, opt = train_step(loss)
    row = {"step": name, "chip": "cpu", "mode": "rss", "program": program, "what": desc}

    def fresh():
        p = jax.tree_util.tree_map(jnp.asarray, params)
        return (p, opt.init(p), *[jnp.asarray(b) for b in batch])
    try:
        if program == "jax":
            fn = jax.jit(step, donate_argnums=(0, 1))
            compiled = fn.lower(*fresh()).compile()
        else:   # the program the calls run: built in place (not tiered), tuning off
            fn = hlofuse.jit(step, donate_argnums=(0, 1), autotune="off", tiered=False,
                             options=options)
            lowered = fn.lower(*fresh())
            compiled = lowered.jax_lowered.compile()
            row["kernels"] = len(lowered.report.kernels) if lowered.report is not None else 0
        row["figures"] = memory.figures(compiled).to_dict()
        jax.block_until_ready(fn(*fresh()))
        why = rss_unavailable()
        if why:
            row["error"] = why
            return row
        added = []
        for _ in range(RSS_CALLS):
            args = fresh()
            jax.block_until_ready(args)
            before = proc_status()["VmRSS"]
            reset_peak_rss()
            out = fn(*args)
            jax.block_until_ready(out)
            added.append(proc_status()["VmHWM"] - before)
            del out, args
        row["rss_added"] = added
    except Exception as e:  # noqa: BLE001 - the row says what failed; the others still run
        row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
    return row


def run_rss(steps: list[str], quick: bool, timeout: float = 1800,
            options: dict | None = None) -> list[dict]:
    """Per step, both programs, each in a fresh process on this CPU (:func:`rss_measure`); one
    row per step: ``jax``/``hlofuse`` with XLA's figures (``predicted``: temporaries plus the
    outputs not written into donated buffers) and the median resident bytes a call added."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    rows = []
    for name in steps:
        row = {"step": name, "chip": "cpu", "mode": "rss"}
        for program in ("jax", "hlofuse"):
            cmd = [sys.executable, "-m", "bench.memory", "--worker", f"rss:{program}", "cpu",
                   "quick" if quick else "full", name, json.dumps(options or {})]
            try:
                p = subprocess.run(cmd, env=dict(os.environ, **RSS_ENV), cwd=root,
                                   capture_output=True, text=True, timeout=timeout)
                got = [json.loads(x) for x in p.stdout.splitlines() if x.startswith("{")]
                got = got[-1] if got else {"error": f"process exited {p.returncode}: "
                                                    f"{(p.stderr.strip().splitlines() or [''])[-1][:300]}"}
            except subprocess.TimeoutExpired:
                got = {"error": f"timed out after {timeout:.0f}s"}
            if "error" in got:
                row["error"] = f"{program}: {got['error']}"
                break
            f = got["figures"]
            row["what"] = got["what"]
            row[program] = {"temp": f["temp"], "predicted": f["temp"] + f["output"] - f["alias"],
                            "rss_added": got["rss_added"],
                            "rss": int(np.median(got["rss_added"]))}
            if "kernels" in got:
                row["kernels"] = got["kernels"]
        if "error" not in row:
            dj = row["hlofuse"]["predicted"] - row["jax"]["predicted"]
            dr = row["hlofuse"]["rss"] - row["jax"]["rss"]
            row["same_direction"] = (dj > 0) == (dr > 0) or dj == dr == 0
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def _rss_line(r: dict) -> str:
    j, h = r["jax"], r["hlofuse"]
    return (f"| {r['step']} | cpu | {j['predicted'] / MIB:.1f} | {h['predicted'] / MIB:.1f} | "
            f"{_ratio(h['predicted'], j['predicted'])} | {j['rss'] / MIB:.1f} | "
            f"{h['rss'] / MIB:.1f} | {_ratio(h['rss'], j['rss'])} | "
            f"{'yes' if r['same_direction'] else 'no'} | {r.get('kernels', 0)} |")


def rss_table(rows: list[dict]) -> str:
    """``--rss``: XLA's CPU buffer assignment (temporaries + new outputs) against the resident
    bytes one call added, per program."""
    return "\n".join(_markdown(["step", "chip", "jax.jit XLA MiB", "hlofuse XLA MiB", "ratio",
                                "jax.jit RSS MiB", "hlofuse RSS MiB", "RSS ratio",
                                "same direction", "kernels"], rows, _rss_line))


# ----------------------------------------------------------------------------------------------
# The table
# ----------------------------------------------------------------------------------------------
def _ratio(a, b) -> str:
    return f"{a / b:.2f}" if a and b else "-"


def _markdown(header: list[str], rows: list[dict], line: Callable[[dict], str]) -> list[str]:
    """A Markdown table's lines: ``header``, then ``line(row)`` per row; a row of a step that
    failed shows its step, chip and error, the other cells empty."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        lines.append(f"| {r['step']} | {r['chip']} | error: {r['error']} |"
                     + "|" * (len(header) - 3) if "error" in r else line(r))
    return lines


def _peak_line(r: dict) -> str:
    j, h = r["jax"], r["hlofuse"]
    chip = f"{r['chip']} x{r['devices']}" if r.get("devices", 1) > 1 else r["chip"]
    hf = h["flops"] + (r["kernel_flops"] if r.get("target") == "tpu" else 0)
    return (f"| {r['step']} | {chip} | {j['peak'] / MIB:.0f} | {h['peak'] / MIB:.0f} | "
            f"{_ratio(h['peak'], j['peak'])} | {j['temp'] / MIB:.0f} | {h['temp'] / MIB:.0f} | "
            f"{_ratio(hf, j['flops'])} | {r['kernels']} |")


def table(rows: list[dict]) -> str:
    lines = _markdown(["step", "chip", "jax.jit peak MiB", "hlofuse peak MiB", "peak ratio",
                       "jax.jit temp MiB", "hlofuse temp MiB", "flops ratio", "kernels"],
                      rows, _peak_line)
    ok = [r for r in rows if "error" not in r]
    if ok:
        ratios = sorted(r["hlofuse"]["peak"] / r["jax"]["peak"] for r in ok)
        worst = max(ok, key=lambda r: r["hlofuse"]["peak"] / r["jax"]["peak"])
        lines.append("")
        lines.append(f"median peak ratio {ratios[len(ratios) // 2]:.2f} over {len(ok)} rows; "
                     f"highest {worst['hlofuse']['peak'] / worst['jax']['peak']:.2f} "
                     f"({worst['step']} on {worst['chip']})")
    return "\n".join(lines)


def _batch_line(r: dict) -> str:
    j, h = r["jax"], r["hlofuse"]
    shown = [("" if x["exact"] else ">=") + str(x["batch"]) for x in (j, h)]
    ratio = f"{h['batch'] / j['batch']:.2f}" if j["batch"] else "-"
    return (f"| {r['step']} | {r['chip']} | {r['capacity'] / (1 << 30):.1f} | {shown[0]} "
            f"| {shown[1]} | {ratio} | {len(j['tried'])} + {len(h['tried'])} |")


def batch_table(rows: list[dict]) -> str:
    """The largest batches that fit (``--largest-batch``); ``>=`` where the search ran out of
    compiles before the next batch was seen not to fit."""
    return "\n".join(_markdown(["step", "chip", "memory GiB", "jax.jit largest batch",
                                "hlofuse largest batch", "ratio", "compiles"], rows, _batch_line))


def _plot(rows: list[dict], path: str) -> None:
    from bench import png
    ok = [r for r in rows if "error" not in r]
    png.bar_chart(path, [f"{r['step']}/{r['chip']}" for r in ok],
                  [r["hlofuse"]["peak"] / r["jax"]["peak"] for r in ok],
                  title="peak device memory, hlofuse.jit / jax.jit (deviceless compiles)")


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--worker"]:
        return _worker_main(argv[1:])
    ap = argparse.ArgumentParser(prog="python -m bench --memory", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--memory", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true", help="small sizes on h100 and v5e")
    ap.add_argument("--chips", default=None, help=f"comma-separated (default {','.join(CHIPS)}; "
                                                  f"--quick: {','.join(QUICK_CHIPS)})")
    ap.add_argument("--steps", nargs="+", default=None, choices=sorted(STEPS) + sorted(FSDP_STEPS),
                    help="default: the single-chip steps; the *_fsdp ones are sharded rows")
    ap.add_argument("--json", default=None)
    ap.add_argument("--markdown", default=None)
    ap.add_argument("--plot", default=None, help="write a PNG bar chart of the peak ratios")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per chip")
    ap.add_argument("--largest-batch", action="store_true",
                    help="instead: the largest batch that fits each chip's memory, per program")
    ap.add_argument("--capacity", default=None,
                    help="with --largest-batch: the memory to fit instead of the chip's "
                         "(bytes, or a size such as 8GiB)")
    ap.add_argument("--rss", action="store_true",
                    help="instead: on this CPU, XLA's buffer assignment of each step against "
                         "the resident memory one call adds (the sanity check of the method)")
    a = ap.parse_args(argv)
    if a.rss:
        return _rss_main(a)
    from hlofuse.runtime import aot
    chips = aot.parse_chips(a.chips or ",".join(QUICK_CHIPS if a.quick else CHIPS))
    steps = a.steps or list(STEPS)
    missing = [m for m in (aot.missing_packages(c) for c in chips) if m] \
        if aot._python() == sys.executable else []
    if missing:
        print(f"bench --memory: {missing[0]}", file=sys.stderr)
        return 2
    rows = []
    mode = "largest-batch" if a.largest_batch else "peaks"
    if a.largest_batch and a.capacity:
        from hlofuse.runtime.memory import resolve_limit
        mode += f":{resolve_limit(a.capacity, 'cpu')}"
    for c in chips:
        t0 = time.perf_counter()
        got = run_chip(c, steps, a.quick, a.timeout, mode=mode)
        print(f"# {c}: {len(got)} steps ({mode}) in {time.perf_counter() - t0:.0f}s", flush=True)
        rows += got
    _output(a, rows, batch_table(rows) if a.largest_batch else table(rows))
    if a.plot and not a.largest_batch:
        _plot(rows, a.plot)
    return 1 if any("error" in r for r in rows) else 0


def _output(a, rows: list[dict], text: str) -> None:
    """Print the table; write ``--json`` (the rows) and ``--markdown`` (the table) if asked."""
    print(text)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"quick": a.quick, "rows": rows}, fh, indent=1)
    if a.markdown:
        with open(a.markdown, "w") as fh:
            fh.write(text + "\n")


def _rss_main(a) -> int:
    why = rss_unavailable()
    if why:
        print(f"bench --memory --rss: {why}", file=sys.stderr)
        return 2
    rows = run_rss(a.steps or list(STEPS), a.quick, a.timeout)
    _output(a, rows, rss_table(rows))
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
