"""composable_dra_cli.arenas: a process that set the cap keeps its threads' allocations in
that many glibc arenas (glibc's own count, from malloc_stats), where it gave each thread
one of its own before."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from composable_dra_cli import arenas

CHILD = """
import ctypes, sys, threading
from composable_dra_cli import arenas
print(arenas.limit() if sys.argv[1] == "cap" else "uncapped", flush=True)
start = threading.Barrier(8)
def work():
    start.wait()
    kept = [bytearray(64 * 1024) for _ in range(20)]  # glibc's heap, not mmap: < 128 KiB
    start.wait()  # all alive at once
threads = [threading.Thread(target=work) for _ in range(8)]
for t in threads: t.start()
for t in threads: t.join()
ctypes.CDLL(None).malloc_stats()  # glibc writes one "Arena N:" per arena to stderr
"""


def arenas_used(mode: str) -> tuple[str, int]:
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, mode],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=True,
    )
    return done.stdout.strip(), done.stderr.count("Arena ")


def test_threads_share_the_capped_arenas() -> None:
    assert arenas_used("cap") == ("True", arenas.ARENAS)
    assert arenas_used("plain")[1] > arenas.ARENAS  # each thread's own, as before


def test_the_environment_decides_when_it_says(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert arenas.limit() is False
