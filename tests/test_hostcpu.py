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
    assert prof.split()[0] == arch and set(prof.split()[3:]) <= set(hostcpu.RELEVANT)
    assert prof.split()[1] == f"l2={hostcpu.l2_per_core() >> 10}k"
    assert prof.split()[2] == f"v{hostcpu.vector_bits()}"
    assert ("amx_int8" in prof) == ("amx_int8" in flags)


def test_this_host_is_read_and_rows_are_checked():
    assert isinstance(hostcpu.flags(), frozenset) and hostcpu.arch() and hostcpu.model()
    assert hostcpu.profile().startswith(hostcpu.arch())
    hostcpu.check_rows(0)
    hostcpu.check_rows(2)
    with pytest.raises(ValueError, match="'gemv_rows' must be 0"):
        hostcpu.check_rows(1)


@pytest.mark.parametrize("flags,bits", [(ZEN4, 512), (ARROW_LAKE, 256), (["asimd"], 128), ([], 128)])
def test_vector_width(monkeypatch, flags, bits):
    monkeypatch.setattr(hostcpu, "flags", lambda: frozenset(flags))
    assert hostcpu.vector_bits() == bits and f" v{bits}" in hostcpu.profile()


def _fake_sysfs(root, entries):
    for i, (level, kind, size) in enumerate(entries):
        d = root / f"index{i}"
        d.mkdir(parents=True)
        (d / "level").write_text(f"{level}\n")
        (d / "type").write_text(f"{kind}\n")
        (d / "size").write_text(f"{size}\n")


def test_caches_are_read_from_sysfs(monkeypatch, tmp_path):
    _fake_sysfs(tmp_path, [(1, "Data", "48K"), (1, "Instruction", "32K"), (2, "Unified", "2048K"),
                           (3, "Unified", "105M")])
    (tmp_path / "index9").mkdir()                      # unreadable entries are left out
    monkeypatch.setattr(hostcpu, "CACHE_DIR", str(tmp_path))
    hostcpu.caches.cache_clear()
    try:
        assert hostcpu.caches() == {(1, "Data"): 48 << 10, (1, "Instruction"): 32 << 10,
                                    (2, "Unified"): 2 << 20, (3, "Unified"): 105 << 20}
        assert hostcpu.l2_per_core() == 2 << 20 and "l2=2048k" in hostcpu.profile()
        monkeypatch.setattr(hostcpu, "CACHE_DIR", str(tmp_path / "absent"))
        hostcpu.caches.cache_clear()
        assert hostcpu.caches() == {} and hostcpu.l2_per_core() == hostcpu.DEFAULT_L2
    finally:
        hostcpu.caches.cache_clear()


def test_this_hosts_caches():
    c = hostcpu.caches()
    if c:                                              # Linux with sysfs (these machines)
        assert (2, "Unified") in c and c[(2, "Unified")] >= 256 << 10
    assert hostcpu.l2_per_core() >= 256 << 10
