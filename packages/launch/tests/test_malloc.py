"""malloc defaults: added once, never over a user's own, and in effect."""

import os
import subprocess
import sys

from t5x.launch import user_environment
from t5x.launch._malloc import DEFAULTS, HUGEPAGES, USER_TUNABLES, add_malloc_defaults, hugepages_supported

ALL_DEFAULTS = ":".join(f"{name}={value}" for name, value in DEFAULTS.items())

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


def _run(
    code: str, tunables: str | None, args: tuple[str, ...] | list[str] = (), **extra: str
) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"} | extra
    if tunables is not None:
        env["GLIBC_TUNABLES"] = tunables
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=120, check=True
    )


def test_the_tunables_are_added_after_others_and_only_once():
    env = {"GLIBC_TUNABLES": "glibc.malloc.tcache_count=10"}
    assert add_malloc_defaults(env)
    assert env["GLIBC_TUNABLES"] == f"glibc.malloc.tcache_count=10:{ALL_DEFAULTS}"
    assert env[USER_TUNABLES] == "glibc.malloc.tcache_count=10"
    assert not add_malloc_defaults(env)
    assert env["GLIBC_TUNABLES"] == f"glibc.malloc.tcache_count=10:{ALL_DEFAULTS}"
    empty: dict[str, str] = {}
    assert add_malloc_defaults(empty)
    assert empty == {"GLIBC_TUNABLES": ALL_DEFAULTS, USER_TUNABLES: ""}


def test_a_users_own_settings_win():
    env = {"GLIBC_TUNABLES": f"{HUGEPAGES}=0:glibc.malloc.arena_max=4"}
    assert add_malloc_defaults(env)
    assert env["GLIBC_TUNABLES"].split(":") == [
        f"{HUGEPAGES}=0",
        "glibc.malloc.arena_max=4",
        f"glibc.malloc.mmap_threshold={256 << 20}",
        f"glibc.malloc.trim_threshold={DEFAULTS['glibc.malloc.trim_threshold']}",
    ]
    everything = {"GLIBC_TUNABLES": ALL_DEFAULTS.replace(f"{HUGEPAGES}=1", f"{HUGEPAGES}=0")}
    assert not add_malloc_defaults(everything)


def test_peers_get_the_environment_the_user_started_with():
    for user in ({}, {"GLIBC_TUNABLES": "glibc.malloc.tcache_count=10"}):
        env = {"HOME": "/h", **user}
        assert add_malloc_defaults(env)
        assert user_environment(env) == {"HOME": "/h", **user}
    set_by_the_user = {"HOME": "/h", "GLIBC_TUNABLES": f"{HUGEPAGES}=1"}
    assert user_environment(set_by_the_user) == set_by_the_user


def _launch_code(*argv: str) -> str:
    # `-c` code runs again after a re-exec: the first line is printed before, the second after.
    return (
        f"import os, sys; print(os.environ.get('GLIBC_TUNABLES')); sys.argv = ['t5x-launch', *{argv!r}]; "
        "from t5x.launch._cli import main; main()"
    )


def test_the_launcher_restarts_a_cpu_job_with_the_tunables():
    code = _launch_code("train", "--help")
    lines = _run(code, None, JAX_PLATFORMS="cpu").stdout.splitlines()
    if hugepages_supported():
        assert lines[:2] == ["None", ALL_DEFAULTS]
    else:
        assert lines[0] == "None" and lines[1] != ALL_DEFAULTS
    assert any("usage:" in line for line in lines)
    # With the user's own choice in place it runs once, unchanged.
    lines = _run(code, ALL_DEFAULTS, JAX_PLATFORMS="cpu").stdout.splitlines()
    assert lines[0] == ALL_DEFAULTS and lines[1] != ALL_DEFAULTS


def test_accelerator_jobs_and_other_commands_keep_glibcs_defaults():
    for argv, platforms in (
        (("train", "--help"), "tpu"),
        (("train", "--help"), "cuda"),
        (("--help",), "cpu"),
    ):
        lines = _run(_launch_code(*argv), None, JAX_PLATFORMS=platforms).stdout.splitlines()
        assert lines[0] == "None" and lines[1] != ALL_DEFAULTS and "usage:" in lines[1], (argv, lines)


def test_large_allocations_get_huge_pages_with_the_tunable():
    with_tunable = int(_run(_TOUCH_AND_REPORT, f"{HUGEPAGES}=1").stdout)
    without = int(_run(_TOUCH_AND_REPORT, f"{HUGEPAGES}=0").stdout)
    if hugepages_supported():
        assert with_tunable >= 32 << 10, (with_tunable, without)
        assert without < with_tunable
    else:
        assert with_tunable == without


# Writes SIZE bytes from libc's malloc, frees them, does it again, and prints the page faults of
# the second round: the first round's pages are reused only if malloc kept them.
_REALLOCATE_AND_COUNT_FAULTS = """
import ctypes, resource, sys
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
size = int(sys.argv[1])
def round_trip():
    block = libc.malloc(size)
    ctypes.memset(block, 1, size)
    libc.free(block)
round_trip()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
round_trip()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def test_freed_buffers_below_256_mib_are_reused_without_page_faults():
    kept = int(_run(_REALLOCATE_AND_COUNT_FAULTS, ALL_DEFAULTS, args=[str(200 << 20)]).stdout)
    returned = int(_run(_REALLOCATE_AND_COUNT_FAULTS, f"{HUGEPAGES}=1", args=[str(200 << 20)]).stdout)
    # Huge pages or not, a fresh 200 MiB mapping takes at least 100 faults to write.
    assert kept < 16 and returned >= 100, (kept, returned)


def test_buffers_of_256_mib_and_more_are_given_back():
    # Kept, such a block fragments the heap: the next step's does not fit the hole it leaves.
    returned = int(_run(_REALLOCATE_AND_COUNT_FAULTS, ALL_DEFAULTS, args=[str(300 << 20)]).stdout)
    kept = int(
        _run(
            _REALLOCATE_AND_COUNT_FAULTS, f"{ALL_DEFAULTS}:glibc.malloc.mmap_max=0", args=[str(300 << 20)]
        ).stdout
    )
    assert returned >= 150 and kept < 16, (returned, kept)


# The same from a second thread, which glibc gives an arena of its own unless arena_max=1
# (XLA allocates part of a step's buffers on its worker threads).
_REALLOCATE_IN_A_THREAD = """
import ctypes, resource, threading
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
size = 128 << 20
faults = []
def round_trip():
    block = libc.malloc(size)
    ctypes.memset(block, 1, size)
    libc.free(block)
def worker():
    round_trip()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    round_trip()
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
thread = threading.Thread(target=worker)
thread.start()
thread.join()
print(faults[0])
"""


def test_a_worker_threads_large_buffers_are_kept_only_with_one_arena():
    kept = int(_run(_REALLOCATE_IN_A_THREAD, ALL_DEFAULTS).stdout)
    without_arena_max = ALL_DEFAULTS.replace("glibc.malloc.arena_max=1:", "")
    remapped = int(_run(_REALLOCATE_IN_A_THREAD, without_arena_max).stdout)
    # A fresh 128 MiB mapping takes at least 64 faults to write (2 MiB pages).
    assert kept < 16 and remapped >= 60, (kept, remapped)
