"""hlofuse over the StableHLO project's own test modules (``../shared/corpus``): a fixed subset
across op families, every case run untransformed and through ``hlofuse.cli.corpus:corpus_transform``
(what ``hlofuse optimize --target cpu`` does), compiled by XLA and checked with the test's own
tolerance. No case may regress, and kernels must actually have been spliced into some of them.

The full corpus (about 1500 files) is run by hand, see README "Offline optimization".

The corpus lives outside the repository (``<repo>/../shared/corpus``). A clone on its own skips
this test, saying why; CI sets ``HLOFUSE_REQUIRE_CORPUS=1`` (``.ci/run``), and there a missing
corpus fails the test instead of skipping it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.normpath(os.path.join(REPO, "..", "shared", "corpus"))
RUNNER = os.path.join(CORPUS, "run_corpus.py")
REQUIRE_ENV = "HLOFUSE_REQUIRE_CORPUS"


def _require_corpus() -> None:
    """Skip (a clone on its own) or fail (CI: ``HLOFUSE_REQUIRE_CORPUS=1``) when it is absent."""
    if os.path.exists(RUNNER):
        return
    where = (f"StableHLO corpus not found at {CORPUS} (expected <repo>/../shared/corpus/"
             f"run_corpus.py beside the repository)")
    if os.environ.get(REQUIRE_ENV, "") not in ("", "0"):
        pytest.fail(f"{where}; {REQUIRE_ENV} is set, so it is required here (CI checks out "
                    f"shared/ beside the repository)", pytrace=False)
    pytest.skip(f"{where}; set {REQUIRE_ENV}=1 to make its absence an error")

# One or two files per op family: elementwise (float, bf16/f16, complex, integer), compare and
# select, reductions and scans, windows, dot/conv, shape ops, gather/scatter, sort/top_k,
# conversions, chlo ops, random bits, control flow and calls. Files marked * get a Pallas kernel.
SUBSET = """
testdata/abs_complex64_20_20.mlir
testdata/exp_float32_20_20.mlir
testdata/log1p_float32_20_20.mlir
testdata/logistic_float32_20_20.mlir *
testdata/logistic_bfloat16_20_20.mlir *
testdata/sqrt_bfloat16_20_20.mlir
testdata/sin_complex64_20_20.mlir *
testdata/acos_float32_20_20.mlir *
testdata/add_float16_20_20_float16_20_20.mlir
testdata/mul_bfloat16_20_20_bfloat16_20_20.mlir
testdata/div_float32_1_float32_1.mlir
testdata/rem_bfloat16_2_bfloat16_2.mlir
testdata/integer_pow_float32_20_30.mlir *
testdata/integer_pow_int16_20_30.mlir *
testdata/max_complex64_20_20_complex64_20_20.mlir *
testdata/eq_bfloat16_bfloat16.mlir
testdata/select_n_int32_2_3_float32_2_3_float32_2_3_float32_2_3.mlir *
testdata/clamp_float32_2_3_float32_2_3_float32.mlir
testdata/sign_uint8_20_20.mlir *
testdata/reduce_sum_complex128_2_3.mlir
testdata/reduce_max_bfloat16_2_3.mlir
testdata/argmax_bool_15.mlir
testdata/cumsum_float16_8_9.mlir
testdata/reduce_window_add_float16_4_6.mlir
testdata/dot_general_bfloat16_4_3_complex128_3_6.mlir
testdata/conv_general_dilated_float32_1_16_16_2_float32_2_3_2_2.mlir
testdata/transpose_bfloat16_2_3.mlir
testdata/reshape_bool_2_3.mlir
testdata/broadcast_in_dim_bool_2.mlir
testdata/concatenate_complex128_2_3_complex128_2_3.mlir
testdata/dynamic_slice_bool_3_int64_1.mlir
testdata/dynamic_update_slice_bool_3_bool_1_int64_1.mlir
testdata/pad_complex64_2_3_complex64.mlir
testdata/rev_bfloat16_4_5.mlir
testdata/gather_float32_10_10_10_int32_5.mlir *
testdata/scatter_add_bfloat16_1_125_bfloat16_1.mlir
testdata/sort_bfloat16_5_7.mlir
testdata/top_k_bfloat16_5_3_chlo.mlir
testdata/convert_element_type_bool_100_100.mlir
testdata/bitcast_convert_type_bool_2_3.mlir
testdata/shift_left_int32_20_20_int32_20_20.mlir
testdata/population_count_int16_4.mlir
testdata/erf_bfloat16_20_20_chlo.mlir
interpret/call.mlir
interpret/if.mlir
interpret/dot_general.mlir
interpret/reduce_window.mlir
interpret/sort.mlir
interpret/dynamic_reshape.mlir
"""
FILES = [line.split()[0] for line in SUBSET.strip().splitlines()]
KERNELIZED = [line.split()[0] for line in SUBSET.strip().splitlines() if line.endswith("*")]


def test_corpus_subset_has_no_regressions(tmp_path):
    _require_corpus()
    paths = [os.path.join(CORPUS, "testdata", f) for f in FILES]
    missing = [p for p in paths if not os.path.exists(p)]
    assert not missing, f"corpus files missing: {missing}"
    out, dump = tmp_path / "corpus.json", tmp_path / "dump"
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=REPO + os.pathsep +
               os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, RUNNER, *paths, "--transform",
                        "hlofuse.cli.corpus:corpus_transform", "--lift-inputs", "--jobs", "2",
                        "--timeout", "120", "--json", str(out), "--dump-dir", str(dump)],
                       capture_output=True, text=True, timeout=600, cwd=REPO, env=env)
    assert out.exists(), p.stderr[-3000:]
    result = json.loads(out.read_text())
    cases = result["cases"]
    assert result["summary"]["n_files"] == len(FILES)
    regressions = [c for c in cases if c["status"] == "fail" and c.get("baseline_status") == "pass"]
    assert not regressions, "\n".join(f"{c['name']}: [{c.get('kind')}] {c.get('reason', '')}"
                                      for c in regressions)
    # every file of the subset runs and passes before and after (no crash, no transform error).
    # Where this release's XLA itself misses the corpus's expected values, the unrewritten
    # module fails too ('mismatch_also_baseline': jax 0.12's complex bf16 dot_general, 4e-3 off
    # 5e4); that is the release's numerics, not hlofuse's, and the regression check above holds
    assert all(c["status"] == "pass" or c.get("kind") == "mismatch_also_baseline" for c in cases), \
        [(c["name"], c["status"], c.get("kind"), c.get("reason")) for c in cases if c["status"] != "pass"]
    # the transform really optimized: kernels were spliced where the fusion applies
    spliced = [f for f in KERNELIZED
               if "hlofuse" in (dump / (f"testdata__{f[9:-5]}.transformed.mlir")).read_text()]
    assert len(spliced) >= len(KERNELIZED) // 2, (spliced, KERNELIZED)


# ---------------------------------------------------------------------------------------------
# The corpus test in a clone without ../shared (run on a copy of this file, in a fresh pytest)
# ---------------------------------------------------------------------------------------------

def _run_alone(tmp_path, **env_extra) -> subprocess.CompletedProcess:
    """This file, copied into ``<tmp>/clone/tests`` (no ``<tmp>/shared`` beside it), run by pytest."""
    clone = tmp_path / "clone"
    (clone / "tests").mkdir(parents=True)
    (clone / "tests" / "test_corpus.py").write_text(open(__file__).read())
    env = {k: v for k, v in os.environ.items() if k != REQUIRE_ENV}
    env.update(env_extra)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                           "tests/test_corpus.py::test_corpus_subset_has_no_regressions"],
                          capture_output=True, text=True, timeout=300, cwd=clone, env=env)


def test_clone_alone_skips_with_a_reason(tmp_path):
    p = _run_alone(tmp_path)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    assert "1 skipped" in p.stdout and "StableHLO corpus not found" in p.stdout
    assert f"{REQUIRE_ENV}=1" in p.stdout


def test_missing_corpus_fails_when_required(tmp_path):
    p = _run_alone(tmp_path, **{REQUIRE_ENV: "1"})
    assert p.returncode == 1, p.stdout[-3000:] + p.stderr[-2000:]
    assert "1 failed" in p.stdout and "StableHLO corpus not found" in p.stdout
    assert f"{REQUIRE_ENV} is set" in p.stdout


def test_ci_requires_the_corpus():
    ci = open(os.path.join(REPO, ".ci", "run")).read()
    assert f"export {REQUIRE_ENV}=1" in ci
