"""Typed pass options and the textual pipeline syntax (issue 13).

Each pass declares its options as a frozen dataclass; the pass manager builds one per step from
the user's ``options`` dict and the step's own ``name{opt=value}``. Unknown or mistyped options
are errors that list what is known: a misspelt option must never be silently ignored.
"""

from __future__ import annotations

import pytest

import hlofuse
from hlofuse.core import ir as hir
from hlofuse.core.pipeline import (OptionError, PassContext, PassManager, Step, parse_pipeline,
                              resolve_pipeline, split_options)

FOLD = """
func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
  %c = stablehlo.constant dense<[1.0, 2.0, 3.0, 4.0]> : tensor<4xf32>
  %e = stablehlo.exponential %c : tensor<4xf32>
  %r = stablehlo.add %x, %e : tensor<4xf32>
  return %r : tensor<4xf32>
}
"""


def _folded(opt) -> bool:
    return "stablehlo.exponential" not in opt.text


def test_parse_pipeline_steps_and_options():
    steps = parse_pipeline(" cse , constant-fold{max_bytes=16}, kernelize{no_kernels=true} ")
    assert steps == [Step("cse"), Step("constant-fold", (("max_bytes", "16"),)),
                     Step("kernelize", (("no_kernels", "true"),))]
    assert ",".join(map(str, steps)) == "cse,constant-fold{max_bytes=16},kernelize{no_kernels=true}"
    assert parse_pipeline(",".join(map(str, steps))) == steps  # round trip
    assert resolve_pipeline("cse,constant-fold{max_bytes=16}") == ["cse", "constant-fold"]


@pytest.mark.parametrize("text, match", [
    ("cse,,", "cannot read pipeline"),
    ("constant-fold{max_bytes}", "is not option=value"),
    ("constant-fold{max_bytes=lots}", "option 'max_bytes' of pass 'constant-fold': expected int"),
    ("constant-fold{max_byte=16}", r"unknown option\(s\) 'max_byte' for pass 'constant-fold'; "
                                   r"known: max_bytes \(int, default 1048576\)"),
    ("symbol-dce{x=1}", r"unknown option\(s\) 'x' for pass 'symbol-dce'; known: none"),
])
def test_bad_pipeline_text_is_an_error_naming_the_step(text, match):
    with pytest.raises(OptionError, match=match):
        PassManager(text)


def test_step_option_changes_what_the_pass_does():
    assert _folded(hlofuse.optimize(FOLD, pipeline="constant-fold"))
    small = hlofuse.optimize(FOLD, pipeline="constant-fold{max_bytes=8}")
    assert not _folded(small)  # a 16-byte result is over the 8-byte limit
    stats = {p.name: p.stats for p in small.report.passes}
    assert stats["constant-fold"]["folded"] == 0, stats


def test_dict_options_per_pass_and_by_unique_field_name():
    by_pass = hlofuse.optimize(FOLD, pipeline="constant-fold",
                               options={"constant-fold": {"max_bytes": 8}})
    by_field = hlofuse.optimize(FOLD, pipeline="constant-fold", options={"max_bytes": 8})
    assert not _folded(by_pass) and not _folded(by_field)
    # the step's own option wins over the dict
    assert _folded(hlofuse.optimize(FOLD, pipeline="constant-fold{max_bytes=64}",
                                    options={"max_bytes": 8}))


def test_unknown_option_lists_the_known_ones():
    with pytest.raises(OptionError) as e:
        hlofuse.optimize(FOLD, options={"no_kernel": True})
    msg = str(e.value)
    assert "unknown option 'no_kernel'" in msg
    assert "global: chip" in msg and "strict" in msg
    assert "kernelize: no_kernels (bool, default False)" in msg
    assert "constant-fold: max_bytes (int, default 1048576)" in msg


@pytest.mark.parametrize("options, match", [
    ({"no_kernels": "yes"}, "option 'no_kernels' of pass 'kernelize': expected bool, got 'yes'"),
    ({"conv_layout": "nchw"}, "expected one of 'channels_last', 'from_channels_first', 'keep'"),
    ({"constant-fold": 16}, r"options\['constant-fold'\]: expected a dict"),
    ({"strict": 1}, "option 'strict' of hlofuse: expected bool"),
])
def test_mistyped_option_is_an_error(options, match):
    with pytest.raises(OptionError, match=match):
        split_options(options)


def test_options_reach_the_pass_typed():
    ctx = PassContext(options={"no_kernels": True, "strict": True, "chip": "a100"})
    assert ctx.globals.strict and ctx.globals.chip == "a100" and ctx.strict
    from hlofuse.core.pipeline import get_pass
    opts = ctx.options_for(get_pass("kernelize"), Step("kernelize"))
    assert opts.no_kernels is True
    with pytest.raises(Exception):  # frozen: a pass cannot change its options
        opts.no_kernels = False


def test_no_kernels_option_leaves_every_region_to_xla_and_says_so():
    text = """
func.func @main(%x: tensor<8x128xf32>) -> tensor<8x128xf32> {
  %a = stablehlo.exponential %x : tensor<8x128xf32>
  %b = stablehlo.multiply %a, %a : tensor<8x128xf32>
  %c = stablehlo.tanh %b : tensor<8x128xf32>
  return %c : tensor<8x128xf32>
}
"""
    opt = hlofuse.optimize(text, pipeline="default", options={"kernelize": {"no_kernels": True}})
    regions = opt.report.regions
    assert regions and all(r.kernel is None for r in regions)
    assert {r.reason for r in regions} == {"kernels disabled by option"}
    assert "custom_call" not in hir.to_text(opt.module)


@pytest.mark.parametrize("how", ["dict", "text"])
def test_the_old_enabled_option_still_disables_with_a_deprecation_warning(how):
    """Nine passes had an ``enabled`` option of their own, a second spelling of ``disable=``;
    it is gone from the passes, and ``{"pass": {"enabled": False}}`` (or ``pass{enabled=false}``
    in pipeline text) still turns the pass off, with a DeprecationWarning naming the new
    spelling."""
    kw = ({"pipeline": "constant-fold", "options": {"constant-fold": {"enabled": False}}}
          if how == "dict" else {"pipeline": "constant-fold{enabled=false}"})
    # (constant-fold never had it: every pass takes the old spelling)
    with pytest.warns(DeprecationWarning, match=r"use disable=\['constant-fold'\]"):
        opt = hlofuse.optimize(FOLD, **kw)
    assert not _folded(opt) and [p.disabled for p in opt.report.passes] == [True]
    with pytest.raises(OptionError, match="option 'enabled' of pass 'constant-fold': expected bool"):
        hlofuse.optimize(FOLD, pipeline="constant-fold", options={"constant-fold": {"enabled": 0}})
