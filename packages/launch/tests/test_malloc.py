"""Huge pages for malloc: the tunable is added once, never over a user's own, and takes effect."""

import os
import subprocess
import sys

from t5x.launch._malloc import TUNABLE, add_malloc_defaults, hugepages_supported

# Allocates 64 MiB with libc's malloc (numpy would ask for huge pages itself), writes it,
# and prints the process's anonymous huge-page total in KiB.
_TOUCH_AND_REPORT = """
import ctypes, re
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
size = 64 << 20
ctypes.memset(libc.malloc(size), 1, size)
text = open("/proc/self/smaps_rollup").read()
print(re.search(r"AnonHugePages:\\s+(\\d+) kB", text).group(1))
"""


def _run(code: str, tunables: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    if tunables is not None:
        env["GLIBC_TUNABLES"] = tunables
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120, check=True
    )


def test_the_tunable_is_added_after_others_and_only_once():
    env = {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}
    assert add_malloc_defaults(env)
    assert env["GLIBC_TUNABLES"] == f"glibc.malloc.arena_max=2:{TUNABLE}=1"
    assert not add_malloc_defaults(env)
    assert env["GLIBC_TUNABLES"] == f"glibc.malloc.arena_max=2:{TUNABLE}=1"
    empty: dict[str, str] = {}
    assert add_malloc_defaults(empty)
    assert empty == {"GLIBC_TUNABLES": f"{TUNABLE}=1"}


def test_a_users_own_setting_wins():
    env = {"GLIBC_TUNABLES": f"{TUNABLE}=0"}
    assert not add_malloc_defaults(env)
    assert env == {"GLIBC_TUNABLES": f"{TUNABLE}=0"}


def test_the_launcher_restarts_itself_with_the_tunable():
    # `-c` code runs again after the re-exec: the first line is printed before, the second after.
    code = (
        "import os, sys; print(os.environ.get('GLIBC_TUNABLES')); sys.argv = ['t5x-launch', '--help']; "
        "from t5x.launch._cli import main; main()"
    )
    lines = _run(code, None).stdout.splitlines()
    if hugepages_supported():
        assert lines[:2] == ["None", f"{TUNABLE}=1"]
    else:
        assert lines[0] == "None" and lines[1] != f"{TUNABLE}=1"
    assert any("usage:" in line for line in lines)
    # With the user's own choice in place it runs once, unchanged.
    lines = _run(code, f"{TUNABLE}=0").stdout.splitlines()
    assert lines[0] == f"{TUNABLE}=0" and lines[1] != f"{TUNABLE}=0"


def test_large_allocations_get_huge_pages_with_the_tunable():
    with_tunable = int(_run(_TOUCH_AND_REPORT, f"{TUNABLE}=1").stdout)
    without = int(_run(_TOUCH_AND_REPORT, f"{TUNABLE}=0").stdout)
    if hugepages_supported():
        assert with_tunable >= 32 << 10, (with_tunable, without)
        assert without < with_tunable
    else:
        assert with_tunable == without
