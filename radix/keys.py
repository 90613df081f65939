"""Block keys: a prefix's key is a secret-keyed polynomial hash of its tokens modulo N = p1 * p2.

The key of a prompt's block i identifies the whole prefix up to and including it, chained from a
root that is distinct per (block size, namespace)::

    key_0 = root(block_size, namespace)        key_i = (key_{i-1} * x + v_i) mod N

where v_i is block i's token ids read as one little-endian integer of 32-bit digits.  p1 and p2
are random primes in [2**29, 2**30) and x a random base, drawn per :class:`KeySpace` (per index,
per process) from the OS's random source, so N < 2**60: every key is a two-digit CPython int (32
bytes; the index holds millions).

Two ways to compute the same keys:
- per block in Python (``int.from_bytes`` then one multiply-add-mod): ingest, where an event
  usually carries few blocks, and short extensions;
- vectorised with numpy for long runs (a 32k-token prompt is 2,048 blocks): by the CRT the chain
  splits into one chain per prime, whose terms fit uint64; ``v_i mod p`` is a matrix product of
  the tokens with ``2**(32 j) mod p``, and the linear recurrence is a prefix sum,
  ``key_i = x**i * (key_0 + sum_{k<=i} v_k * x**-k)``.  Recombined by the CRT, bit-identical to
  the Python path (asserted by tests/test_radix_prompt.py).

Threat model (keys only route; a collision never corrupts output, it sends a request to an
engine that lacks its prefix, i.e. costs one prefill):
- Users choose prompts, namespaces (cache_salt) and token ids, and may know this code.  They do
  not know p1, p2, x or the root seed, which never leave the process.
- For any two different prompts fixed in advance, their keys at a block collide with probability
  at most ``blocks / 2**29 + f / 2**24.6`` per prime over the secret draw: a nonzero polynomial
  of degree <= blocks has at most that many roots mod a prime, and a nonzero difference of two
  block ints (32 x block_size bits) has at most f = 32 x block_size / 29 prime factors among the
  ~2**24.6 primes in [2**29, 2**30) (f = 17 at block size 16).  Both primes: ~2**-35 for a
  2,048-block prompt.  Unlike polynomial hashing mod 2**64, there is
  no secret-independent collision (Thue-Morse prompts collide mod 2**64 for every odd base: see
  tests/test_radix_prompt.py).
- Keys are not observable from outside except through routing decisions, so a user cannot search
  for collisions offline; each online try (a prompt sent, its routing inferred from latency)
  succeeds with probability ~2**-35 or less.
- What a user CAN do: fill engines with their own prefixes (as any client can), and pick token
  ids >= 2**32 or < 0, which are rejected (the array conversion raises), never aliased.
- Random (non-adversarial) collisions: keys are near uniform in [0, N), N >= 2**58: with a
  million indexed blocks the chance of any collision is ~ 1e-6.
"""

from __future__ import annotations

import random
import sys
from array import array
from collections.abc import Hashable, Sequence
from struct import Struct
from typing import TYPE_CHECKING, Any

import xxhash

try:  # radix needs only the stdlib and xxhash; numpy, when installed, hashes long prompts faster
    import numpy as np

    HAVE_NUMPY = True
except ImportError:  # pragma: no cover - exercised by tests/test_radix_prompt.py in a subprocess
    HAVE_NUMPY = False

if TYPE_CHECKING:
    import numpy.typing as npt

    U64 = npt.NDArray[np.uint64]

# vLLM's own block hashes are cut to this many bits (see index._norm): small ints, like our keys.
KEY_MASK = (1 << 60) - 1

# Runs at least this long are hashed with numpy (fixed cost ~20 array ops; per block far cheaper).
NUMPY_MIN_BLOCKS = 64
# The matrix product sums block_size products t_j * (2**32j mod p) < 2**24 * 2**30 in uint64:
# larger token ids or blocks take the Python path (same keys, slower).
_NUMPY_MAX_TOKEN = 1 << 24
_NUMPY_MAX_BLOCK = 512
# Roots remembered per KeySpace (see KeySpace.root).
ROOT_MEMO = 4096


def token_array(tokens: Sequence[int]) -> array[int]:
    """Token ids as native uint32 (raises OverflowError outside [0, 2**32), TypeError if not int).

    ``array('I')`` is the cheapest list -> uint32 conversion CPython has (numpy's from a list
    is dearer).
    """
    return array("I", tokens)


def plain(value: Any) -> Any:
    """Lists to tuples, recursively: msgpack hands back lists where vLLM wrote tuples."""
    if isinstance(value, list | tuple):
        return tuple(plain(v) for v in value)
    return value


def _is_prime(n: int) -> bool:
    # Deterministic Miller-Rabin for n < 2**32 (bases 2, 7, 61).
    if n < 2 or n % 2 == 0:
        return n == 2
    d, s = n - 1, 0
    while d % 2 == 0:
        d, s = d // 2, s + 1
    for a in (2, 7, 61):
        if a % n == 0:
            continue
        y = pow(a, d, n)
        if y in (1, n - 1):
            continue
        for _ in range(s - 1):
            y = y * y % n
            if y == n - 1:
                break
        else:
            return False
    return True


def _random_prime(rng: random.Random, exclude: int = 0) -> int:
    while True:
        n = rng.randrange(1 << 29, 1 << 30) | 1
        if n != exclude and _is_prime(n):
            return n


class KeySpace:
    """The secret parameters of one index's keys (see the module docstring), and the chain."""

    __slots__ = ("modulus", "base", "_seed", "_primes", "_p", "_x0", "_crt", "_digits", "_xpow",
                 "_xinv", "_splitters", "_roots")

    def __init__(self, rng: random.Random | None = None) -> None:
        rng = rng if rng is not None else random.SystemRandom()
        p1 = _random_prime(rng)
        p2 = _random_prime(rng, exclude=p1)
        x1, x2 = rng.randrange(2, p1 - 1), rng.randrange(2, p2 - 1)
        self.modulus = p1 * p2
        # The base as one residue mod N: x = x1 (mod p1), x = x2 (mod p2).
        self.base = (x2 + p2 * ((x1 - x2) * pow(p2, -1, p1) % p1)) % self.modulus
        self._seed = rng.getrandbits(64)
        self._primes = (p1, p2)
        self._x0 = (x1, x2)
        self._crt = pow(p2, -1, p1)
        self._digits: dict[int, U64] = {}  # block size -> (size, 2): 2**(32 j) mod p
        if HAVE_NUMPY:
            self._p = np.array([[p1], [p2]], dtype=np.uint64)
            self._xpow: U64 = np.empty((2, 0), dtype=np.uint64)  # x**k, k = 1.. per prime
            self._xinv: U64 = np.empty((2, 0), dtype=np.uint64)  # x**-k
        self._splitters: dict[int, Struct] = {}  # block size -> cuts a buffer into blocks
        # Roots computed so far: every routed prompt needs one (a repr and a hash of the
        # namespace), and a fleet sees few (block size, namespace) pairs; emptied when it grows
        # past ROOT_MEMO (namespaces hold client-chosen cache_salts).
        self._roots: dict[tuple[int, Hashable], int] = {}

    def root(self, block_size: int, namespace: Hashable) -> int:
        """The key before block 0, distinct per (block size, namespace) so neither matches across.

        ``namespace`` must have a stable ``repr``: str, int, bytes, None and tuples of them.
        """
        pair = (block_size, namespace)
        roots = self._roots
        key = roots.get(pair)
        if key is None:
            key = xxhash.xxh3_64_intdigest(repr(pair).encode(), self._seed) % self.modulus
            if len(roots) >= ROOT_MEMO:
                roots.clear()
            roots[pair] = key
        return key

    def extra(self, extra: Any) -> int:
        """What a block's residual extra keys (multimodal identity, embeds digest) add to it."""
        return xxhash.xxh3_64_intdigest(repr(plain(extra)).encode(),
                                        self._seed ^ 1) % self.modulus

    def chain(self, tokens: array[int], block_size: int, seed: int, first: int = 0,
              stop: int | None = None) -> list[int]:
        """Keys of the full blocks ``first`` .. ``stop - 1`` of ``tokens`` (uint32, from
        :func:`token_array`), chained from ``seed``: a root, a parent block's key, or the key of
        block ``first - 1``."""
        end = len(tokens) // block_size if stop is None else stop
        if HAVE_NUMPY and end - first >= NUMPY_MIN_BLOCKS and block_size <= _NUMPY_MAX_BLOCK:
            keys = self._chain_numpy(tokens, block_size, seed, first, end)
            if keys is not None:
                return keys
        part = tokens if first == 0 and end * block_size == len(tokens) else tokens[
            first * block_size : end * block_size]
        return self._chain_python(part.tobytes(), block_size, seed)

    def chain_with_extras(self, tokens: array[int], block_size: int, seed: int,
                          extras: Sequence[Any | None]) -> list[int]:
        """Like :meth:`chain` from block 0, adding ``extra(extras[i])`` (when not None) to block
        i: such blocks only match a chain that names the same media."""
        buf = tokens.tobytes()
        step, x, n = block_size * 4, self.base, self.modulus
        key, out = seed, list[int]()
        for i, off in enumerate(range(0, len(buf) - step + 1, step)):
            extra = extras[i] if i < len(extras) else None
            added = 0 if extra is None else self.extra(extra)
            key = (key * x + int.from_bytes(buf[off : off + step], "little") + added) % n
            out.append(key)
        return out

    def _chain_python(self, buf: bytes, block_size: int, seed: int) -> list[int]:
        x, n = self.base, self.modulus
        frm = int.from_bytes
        key, out = seed, list[int]()
        append = out.append
        # A plain loop over locals (a comprehension's walrus would make ``key`` a cell), blocks
        # cut by struct in C.
        splitter = self._splitters.get(block_size)
        if splitter is None:
            splitter = self._splitters[block_size] = Struct(f"{block_size * 4}s")
        for (block,) in splitter.iter_unpack(buf):
            key = (key * x + frm(block, "little")) % n
            append(key)
        return out

    def _chain_numpy(self, tokens: array[int], block_size: int, seed: int, first: int,
                     end: int) -> list[int] | None:
        m = end - first
        blocks = np.frombuffer(tokens, dtype=np.uint32, count=m * block_size,
                               offset=first * block_size * 4).reshape(m, block_size)
        if int(blocks.max()) >= _NUMPY_MAX_TOKEN:
            return None
        p = self._p
        # (m, B) @ (B, 2), not (2, B) @ (B, m): numpy's integer matmul (no BLAS) runs its loop
        # faster in this orientation; the copy makes each prime's row contiguous for the ops below.
        h: U64 = (blocks @ self._digit_table(block_size)).T.copy()  # v_i mod p, unreduced
        h %= p
        xpow, xinv = self._powers(m)
        h *= xinv
        h %= p
        p1, p2 = self._primes
        h[0, 0] += seed % p1
        h[1, 0] += seed % p2
        np.cumsum(h, axis=1, out=h)  # < 2**30 * (m + 1): no overflow
        h %= p
        h *= xpow
        h %= p
        # CRT: key = k2 + p2 * ((k1 - k2) * p2**-1 mod p1); (k1 + 2 p1 - k2) * c < 2**62.
        k1, k2 = h[0], h[1]
        t = k1 + np.uint64(2 * p1)
        t -= k2
        t *= np.uint64(self._crt)
        t %= np.uint64(p1)
        t *= np.uint64(p2)
        t += k2
        keys: list[int] = t.tolist()
        return keys

    def _digit_table(self, block_size: int) -> U64:
        table = self._digits.get(block_size)
        if table is None:
            p1, p2 = self._primes
            # Byte order of array('I') is native; the Python path reads it little-endian.
            js = range(block_size) if sys.byteorder == "little" else range(block_size - 1, -1, -1)
            table = self._digits[block_size] = np.array(
                [[pow(2, 32 * j, p1), pow(2, 32 * j, p2)] for j in js], dtype=np.uint64)
        return table

    def _powers(self, m: int) -> tuple[U64, U64]:
        """``x**k`` and ``x**-k`` for k = 1 .. m, per prime (tables grown by doubling)."""
        if self._xpow.shape[1] < m:
            size = max(m, 2 * self._xpow.shape[1], 256)
            rows_pow, rows_inv = [], []
            for x, p in zip(self._x0, self._primes, strict=True):
                rows_pow.append(_geometric(x, p, size))
                rows_inv.append(_geometric(pow(x, -1, p), p, size))
            self._xpow = np.array(rows_pow, dtype=np.uint64)
            self._xinv = np.array(rows_inv, dtype=np.uint64)
        return self._xpow[:, :m], self._xinv[:, :m]


def _geometric(x: int, p: int, size: int) -> list[int]:
    out, v = [], 1
    for _ in range(size):
        v = v * x % p
        out.append(v)
    return out
