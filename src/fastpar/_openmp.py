"""How long llama.cpp's CPU threads spin before they sleep, set before OpenMP starts.

llama.cpp's threads (OpenMP, GNU libgomp) meet at a barrier after every operation of a
forward pass, and between calls. A thread that arrives first spins, by default about
300,000 rounds (milliseconds) before it sleeps. On a machine shared with other busy
processes a spinning thread takes the CPU from the very partner it waits for: a call took
more than ten times as long as with short spins while other work kept the cores busy
(docs/performance.md, "On a shared machine").
libgomp reads its settings once, when it is loaded, so they are set in the environment
before that: GOMP_SPINCOUNT=SPIN_COUNT, unless the user set OMP_WAIT_POLICY or
GOMP_SPINCOUNT. Once the CPU backend is loaded (the first Model) the variable goes again,
so that processes started later get the environment as it was.
"""

from __future__ import annotations

import os

# About 300 microseconds of spinning (libgomp's estimate: 100 rounds a microsecond), a
# tenth of libgomp's default. Alone, a partner that arrives within that saves a sleep and a
# wake-up at each of a forward pass's hundreds of barriers (two cores: 1.10x raw llama.cpp
# with it, 0.92-0.95x with 30 microseconds). Where other work takes the cores the thread
# governor drops the threads that wait for a CPU, and beside busy processes a call took about
# as long as with 30 microseconds (docs/internals.md, "Threads on a shared machine").
SPIN_COUNT = "30000"

_ours = False


def choose() -> None:
    """Before fastpar's native modules load: the spin count, unless the user chose."""
    global _ours
    if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
        os.environ["GOMP_SPINCOUNT"] = SPIN_COUNT
        _ours = True


def settled() -> None:
    """After a Model is loaded (llama.cpp's CPU backend, and with it libgomp, has started)."""
    global _ours
    if _ours:
        _ours = False
        if os.environ.get("GOMP_SPINCOUNT") == SPIN_COUNT:
            del os.environ["GOMP_SPINCOUNT"]
