"""``hlofuse.core.hostcpu``: which int8 form and how many matrix-vector rows each kind of CPU gets."""

from __future__ import annotations

import pytest

from hlofuse.core import hostcpu

ZEN4 = "avx2 avx512f avx512_vnni avx512_bf16 fma".split()
SAPPHIRE_RAPIDS = ZEN4 + "avx_vnni amx_bf16 amx_int8 amx_tile".split()
ARROW_LAKE = "avx2 avx_vnni avx_vnni_int8 fma".split()


@pytest.mark.parametrize("arch,flags,native,rows", [
    ("x86_64", ZEN4, None, 2),                          # VNNI only: the u8 x s8 form
    ("x86_64", SAPPHIRE_RAPIDS, "amx_int8", 8),         # AMX: signed dots, 8-row products
    ("x86_64", ARROW_LAKE, "avx_vnni_int8", 2),
    ("aarch64", ["asimd", "asimddp"], "aarch64", 2),    # sdot: signed as written
    ("x86_64", [], None, 2),                            # features unknown: VNNI's choice
    ("riscv64", [], None, 2),
])
def test_choices_per_cpu(monkeypatch, arch, flags, native, rows):
    monkeypatch.setattr(hostcpu, "arch", lambda: arch)
    monkeypatch.setattr(hostcpu, "flags", lambda: frozenset(flags))
    assert hostcpu.int8_signed_native() == native
    assert hostcpu.gemv_rows() == rows
    assert hostcpu.rows_option(0) == rows and hostcpu.rows_option(4) == 4
    prof = hostcpu.profile()
    assert prof.split()[0] == arch and set(prof.split()[1:]) <= set(hostcpu.RELEVANT)
    assert ("amx_int8" in prof) == ("amx_int8" in flags)


def test_this_host_is_read_and_rows_are_checked():
    assert isinstance(hostcpu.flags(), frozenset) and hostcpu.arch() and hostcpu.model()
    assert hostcpu.profile().startswith(hostcpu.arch())
    hostcpu.check_rows(0)
    hostcpu.check_rows(2)
    with pytest.raises(ValueError, match="'gemv_rows' must be 0"):
        hostcpu.check_rows(1)
