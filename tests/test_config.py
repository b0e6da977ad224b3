"""hlofuse.core.config: every HLOFUSE_* variable declared once and read through one parser; the
settings that change a program are in the module-cache keys; docs/settings.md is generated
from the declarations (issue 47, item 4)."""

from __future__ import annotations

import os
import re

import pytest

from hlofuse.core import config
from hlofuse.runtime import program as runtime
from hlofuse.core.target import CPU

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCES = ("hlofuse", "passes", "kernels")
DOCS = os.path.join(REPO, "docs", "settings.md")

#: a value other than the default, per program setting
OTHER = {"HLOFUSE_DISABLE_PASSES": "cse", "HLOFUSE_CPU_ATTENTION_PARTS": "2",
         "HLOFUSE_CPU_ELEMENTWISE_KERNELS": "1", "HLOFUSE_GRAD_REMAT": "0"}


def _source_files():
    for top in SOURCES:
        for d, _, files in os.walk(os.path.join(REPO, top)):
            for f in files:
                if f.endswith(".py"):
                    yield os.path.join(d, f)


def test_every_variable_the_code_names_is_declared():
    named = set()
    for path in _source_files():
        named |= set(re.findall(r"HLOFUSE_[A-Z0-9_]*[A-Z0-9]", open(path).read()))
    assert named - set(config.SETTINGS) == set()


def test_no_module_reads_the_environment_for_a_setting_but_config():
    """``os.environ.get("HLOFUSE_...")`` / ``os.environ[...]`` reads live in config.py only
    (writes, and passing the environment on to a child process, are not reads)."""
    read = re.compile(r"os\.(environ\.get|getenv)\(\s*[\"']?HLOFUSE_|os\.(environ\.get|getenv)\(\s*[A-Z_]*ENV")
    offenders = [p for p in _source_files() if not p.endswith("config.py")
                 and read.search(open(p).read())]
    assert offenders == []


def test_program_settings_change_the_module_cache_key(monkeypatch):
    for name in config.SETTINGS:
        monkeypatch.delenv(name, raising=False)
    key = lambda: runtime._optimization_key(runtime.Options(None), CPU, "f", (), None, {})
    base = key()
    program = {s.name for s in config.SETTINGS.values() if s.program}
    assert program == set(OTHER), "a new program setting needs a value here"
    for name, value in OTHER.items():
        monkeypatch.setenv(name, value)
        assert key() != base, name
        monkeypatch.delenv(name)
    assert key() == base
    # a setting that does not change programs does not miss the cache
    monkeypatch.setenv("HLOFUSE_AUTOTUNE_BUDGET_S", "3")
    assert key() == base


@pytest.mark.parametrize("name, raw, want", [
    ("HLOFUSE_TIERED", "off", False), ("HLOFUSE_TIERED", " Yes ", True), ("HLOFUSE_TIERED", "", True),
    ("HLOFUSE_AUTOTUNE_BUDGET_S", "2.5", 2.5), ("HLOFUSE_AUTOTUNE", "Cached", "cached"),
    ("HLOFUSE_RECHECK_S", "inf", float("inf")), ("HLOFUSE_RECHECK_S", "0", 0.0),
    ("HLOFUSE_DISABLE_PASSES", "cse, constant-fold,", ("cse", "constant-fold")),
    ("HLOFUSE_CPU_ATTENTION_PARTS", "cores", "cores"), ("HLOFUSE_CPU_ATTENTION_PARTS", "3", 3),
])
def test_values_parse_by_type(monkeypatch, name, raw, want):
    monkeypatch.setenv(name, raw)
    assert config.get(name) == want


def test_a_path_setting_expands_the_home_directory(monkeypatch, tmp_path):
    """``HLOFUSE_CACHE_DIR='~/x'`` (quoted in a .env file or a Docker ENV, so no shell expanded
    it) made a folder literally named '~' in the working directory (adversarial round)."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("HLOFUSE_CACHE_DIR", "~/hlofuse-cache")
    assert config.get("HLOFUSE_CACHE_DIR") == str(tmp_path / "hlofuse-cache")
    from hlofuse.runtime import module_cache
    assert module_cache.directory().startswith(str(tmp_path / "hlofuse-cache"))


@pytest.mark.parametrize("name, raw, expected", [
    ("HLOFUSE_TIERED", "maybe", "expected one of 1, true, yes, on, 0, false, no, off"),
    ("HLOFUSE_AUTOTUNE_BUDGET_S", "ten", "expected a finite number of at least 0"),
    ("HLOFUSE_AUTOTUNE", "sometimes", "expected one of"),
    ("HLOFUSE_CPU_ATTENTION_PARTS", "many", "expected an integer of at least 1 or cores"),
    # NaN passed float() and broke tuning with "cannot convert float NaN to integer", or
    # (HLOFUSE_RECHECK_S) meant "never" through max(nan, ...); negative values were taken
    # silently (adversarial round)
    ("HLOFUSE_AUTOTUNE_BUDGET_S", "nan", "expected a finite number of at least 0"),
    ("HLOFUSE_AUTOTUNE_BUDGET_S", "-5", "expected a finite number of at least 0"),
    ("HLOFUSE_AUTOTUNE_BUDGET_S", "inf", "expected a finite number of at least 0"),
    ("HLOFUSE_RECHECK_S", "NaN", "expected a number of at least 0"),
    ("HLOFUSE_RECHECK_S", "-1", "expected a number of at least 0"),
    ("HLOFUSE_CPU_ATTENTION_PARTS", "0", "expected an integer of at least 1"),
    ("HLOFUSE_CPU_ATTENTION_PARTS", "-3", "expected an integer of at least 1"),
])
def test_a_bad_value_names_the_variable_the_value_and_what_it_takes(monkeypatch, name, raw, expected):
    monkeypatch.setenv(name, raw)
    with pytest.raises(config.SettingError, match=re.escape(f"{name}={raw!r}: {expected}")):
        config.get(name)


def test_cache_dir_default_and_override(monkeypatch, tmp_path):
    monkeypatch.delenv("HLOFUSE_CACHE_DIR", raising=False)
    assert config.get("HLOFUSE_CACHE_DIR") == os.path.join(os.path.expanduser("~"), ".cache", "hlofuse")
    monkeypatch.setenv("HLOFUSE_CACHE_DIR", str(tmp_path))
    from hlofuse.runtime import autotune
    from hlofuse.runtime import module_cache
    assert autotune.default_cache_path() == str(tmp_path / "autotune.json")
    assert module_cache.directory() == str(tmp_path / "modules")


def test_the_settings_page_is_generated_from_the_declarations():
    """docs/settings.md is written by ``python -m hlofuse.cli.settings``; rerun it after changing a
    declaration."""
    assert open(DOCS).read() == config.page()
