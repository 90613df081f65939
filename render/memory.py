"""Hands the heap freed by model loading back to the OS (glibc keeps it otherwise).

Parsing a tokenizer.json builds the whole vocabulary, merge list and added-token table two or three
times over (serde's intermediate maps, the BPE builder, our own spec and tiktoken ranks) and keeps a
fraction of that. glibc's malloc does not return the freed middle of its heap to the kernel by
itself, so a process that loaded a big vocabulary (Gemma 3: 262k ids) would keep several times its
live data as RSS. ``malloc_trim(0)`` releases those free pages; later allocations simply fault
pages back in.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys


def release_freed_heap() -> bool:
    """Return free heap pages to the OS; False where libc cannot (not glibc).

    No ``gc.collect()`` here: loading leaves no cyclic garbage worth it, and collecting would
    finalise whatever unrelated garbage the host process holds (the router's, a test's) at a
    moment that has nothing to do with it.
    """
    if not sys.platform.startswith("linux"):
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        trim = libc.malloc_trim  # glibc only: musl and others have no such symbol
    except (OSError, AttributeError):
        return False
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    trim(0)
    return True
