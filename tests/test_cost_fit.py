"""The learned part of the cost model: per-kind constants fitted on measurement records.

Synthetic records only (no timing): the fit recovers known constants, respects its bounds,
shrinks towards "no difference" with little evidence, and a kind predicted slower than XLA's
code on this device is not proposed there (the report says why).
"""

import dataclasses
import math

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import hlofuse
from hlofuse.passes.fusion import cost
from hlofuse.runtime import autotune as at


def _rec(kind, ratio, mf=10.0, mu=20.0, dtype="f32"):
    return {"kind": kind, "ratio": ratio, "modeled_us_fused": mf, "modeled_us_unfused": mu,
            "dtype": dtype}


def test_fit_recovers_constants():
    rng = np.random.default_rng(0)
    recs = []
    for _ in range(200):
        mf, mu = rng.uniform(1, 100), rng.uniform(1, 100)
        x = math.log(mf / mu)
        recs.append(_rec("elementwise", math.exp(0.4 + 0.5 * x), mf, mu))
        recs.append(_rec("reduction", math.exp(-0.2 + 0.5 * x), mf, mu))
    m = cost.fit(recs, ridge=1e-6)
    assert m.slope == pytest.approx(0.5, abs=1e-3)
    assert m.offsets["elementwise"] == pytest.approx(0.4, abs=1e-3)
    assert m.offsets["reduction"] == pytest.approx(-0.2, abs=1e-3)
    assert m.counts == {"elementwise": 200, "reduction": 200}
    assert m.residual < 1e-3
    assert m.predict("elementwise", 10, 10) == pytest.approx(math.exp(0.4), rel=1e-3)
    assert m.predict("attention", 10, 10) is None


def test_fit_bounds_and_shrinkage():
    # a wildly slow measurement is clipped; the offset stays within its bound
    m = cost.fit([_rec("elementwise", 1e9, 10, 10)] * 50)
    assert m.offsets["elementwise"] <= cost.OFFSET_BOUND + 1e-12
    # a negative slope in the data is clipped to the lower bound
    recs = [_rec("reduction", math.exp(-2 * math.log(mf / 10)), mf, 10) for mf in (1, 3, 10, 30, 100)]
    assert cost.fit(recs).slope == cost.SLOPE_BOUNDS[0]
    # one measurement moves the offset only half way (ridge towards 0: no evidence = equal)
    one = cost.fit([_rec("elementwise", math.e, 10, 10)])
    assert one.offsets["elementwise"] == pytest.approx(0.5, abs=0.05)
    # garbage rows are skipped, nothing usable gives no model; a record without its dtype
    # (written before dtypes were kept) does not say which constant it belongs to
    assert cost.fit([{"kind": "x"}, _rec("x", -1), _rec("x", float("nan")),
                     _rec("x", 2.0, dtype=None)]) is None


def _cost():
    return cost.RegionCost(bytes_unfused=4096, bytes_fused=1024, flops=100, kernels_unfused=3)


def test_decide_refuses_kinds_predicted_slower():
    slow = cost.fit([_rec("horizontal", 2.0)] * 5 + [_rec("reduction", 0.9)] * 5)
    assert cost.decide("horizontal", _cost(), "cpu").fuse  # no model in force: the rules
    with cost.learned_model("cpu", slow):
        d = cost.decide("horizontal", _cost(), "cpu")
        assert not d.fuse and "predicted" in d.reason and "fitted on 5 measurements" in d.reason
        assert cost.decide("reduction", _cost(), "cpu").fuse
        assert cost.decide("horizontal", _cost(), "gpu").fuse   # another target's model
    few = cost.fit([_rec("horizontal", 2.0)] * (cost.MIN_RECORDS - 1))
    with cost.learned_model("cpu", few):
        assert cost.decide("horizontal", _cost(), "cpu").fuse   # too little evidence
    assert cost.decide("horizontal", _cost(), "cpu").fuse       # restored after the block


def test_constants_are_per_dtype():
    """f32 matmul kernels measured slower than XLA:CPU's f32 GEMM do not refuse bf16 matmul
    kernels, which beat XLA's bf16 path (a bench run refused mlp_bf16_train's eight bf16
    matmul kernels on three f32 measurements of other workloads: 0.78 of jax.jit, 0.63 with
    them); bf16 measurements judge bf16 regions."""
    f32_slow = cost.fit([_rec("matmul_epilogue", 1.3)] * 5)
    bf16 = dataclasses.replace(_cost(), dtype="bf16")
    with cost.learned_model("cpu", f32_slow):
        assert not cost.decide("matmul_epilogue", _cost(), "cpu").fuse
        assert cost.decide("matmul_epilogue", bf16, "cpu").fuse
    both = cost.fit([_rec("matmul_epilogue", 1.3)] * 5
                    + [_rec("matmul_epilogue", 1.5, dtype="bf16")] * 5)
    with cost.learned_model("cpu", both):
        d = cost.decide("matmul_epilogue", bf16, "cpu")
        assert not d.fuse and "bf16 matmul_epilogue kernels predicted" in d.reason
    assert both.counts == {"matmul_epilogue": 5, "matmul_epilogue[bf16]": 5}


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(at.ENV_CACHE_DIR, str(tmp_path))
    at.cache().clear_memory()
    yield tmp_path
    at.cache().clear_memory()


def _ln(x, g, b):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) * jax.lax.rsqrt(v + 1e-5) * g + b


def test_records_on_this_device_stop_proposing_the_kind(cache_dir):
    args = (jnp.ones((64, 128)), jnp.ones((128,)), jnp.zeros((128,)))
    dev = at.device_key()
    rule = at.record_rule()
    recs = [dict(_rec("reduction", 3.0), target="cpu", device=dev, rule=rule, created=i)
            for i in range(4)]
    recs += [dict(_rec("reduction", 0.02), target="cpu", device="other:device", rule=rule,
                  created=20 + i) for i in range(8)]   # another device's: not fitted
    recs += [dict(_rec("reduction", 0.02), target="cpu", device=dev, rule="jax-0.0|v0",
                  created=10 + i) for i in range(8)]   # another version's: not fitted
    at.cache().put_regions({}, recs)
    f = hlofuse.jit(_ln, autotune="cached")
    rep = f.report(*args)
    assert not rep.kernels
    assert "reduction kernels predicted" in rep.regions[0].reason
    assert len(hlofuse.jit(_ln, autotune="off").report(*args).kernels) == 1


def test_measured_decision_shows_the_prediction(cache_dir, monkeypatch):
    """Once the model has records, a new measurement's reason carries its prediction."""
    dev, rule = at.device_key(), at.record_rule()
    at.cache().put_regions({}, [dict(_rec("reduction", 1.02), target="cpu", device=dev,
                                     rule=rule, created=i) for i in range(4)])
    monkeypatch.setattr(at, "MIN_CALL_S", 0.0)
    monkeypatch.setattr(at, "time_calls", lambda fn, args, reps, kwargs=None, cpu=None: 1e-3)
    args = (jnp.ones((64, 128)), jnp.ones((128,)), jnp.zeros((128,)))
    f = hlofuse.jit(_ln, autotune="on")
    f(*args)
    f(*args)
    (c,) = f.autotune_decision(*args).regions.values()
    assert "cost model predicted" in c["reason"] and c["predicted"] > 0


@pytest.mark.parametrize("busy", [False, True])
def test_disturbed_measurements_do_not_teach_the_model(cache_dir, monkeypatch, busy):
    """A measurement other processes disturbed still decides its own program's regions (in
    memory), but adds no record to the fit: one noisy tuning must not refuse a kind for every
    later program of the process."""
    monkeypatch.setattr(at, "MIN_CALL_S", 0.0)
    monkeypatch.setattr(at, "time_calls", lambda fn, args, reps, kwargs=None, cpu=None: 1e-3)
    monkeypatch.setattr(at, "BUSY_SHARE", -1.0 if busy else 2.0)   # every / no measurement busy
    before = len(at.cache().records())
    args = (jnp.ones((64, 128)), jnp.ones((128,)), jnp.zeros((128,)))
    f = hlofuse.jit(_ln, autotune="on")
    f(*args)
    f(*args)
    d = f.autotune_decision(*args)
    assert d.regions, "no region was measured"
    added = len(at.cache().records()) - before
    assert added == (0 if busy else len(d.regions))
