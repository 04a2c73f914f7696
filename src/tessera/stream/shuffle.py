"""Counter-based randomness for the epoch plan: keys, keyed hashes and keyed permutations.

Everything here is a pure function of its arguments, so any worker can recompute any part of an epoch
order without state and without talking to other workers:

- `derive_key(seed, *words)` turns a seed and a tuple of small integers (a domain tag, the epoch, a
  lane, ...) into a 64-bit key through `numpy.random.SeedSequence`. Different tuples give independent
  keys; there is no seed+epoch arithmetic anywhere.
- `hash_words(key, *arrays)` extends a key by per-element integers (block index, unit index), vectorised.
- `feistel_permute(x, n, key)` is a keyed bijection of ``[0, n)`` evaluated pointwise: the image of one
  index costs O(1) and no memory, so a block or a shard can be shuffled without materialising its
  permutation. It is a balanced Feistel network (6 rounds of a splitmix64 round function) on the
  smallest even bit width covering ``n``, restricted to ``[0, n)`` by cycle walking.
- `philox(seed, *words)` is a `numpy.random.Generator` on the Philox counter-based bit generator, for the
  O(shards) draws (unit permutations, stream sampling).
"""

from __future__ import annotations

import numpy as np

# Domain tags: each random decision of the plan draws from its own key space.
TAG_STREAM_SHORTFALL = 1
TAG_REMAINDER_COUNTS = 2
TAG_REMAINDER_SUBSET = 3
TAG_RUN_UNITS = 4
TAG_LANE_ORDER = 5
TAG_UNIT_ORDER = 6
TAG_BLOCK = 7
TAG_STAGGER = 8

FEISTEL_ROUNDS = 6

_U64 = np.uint64
_MIX1 = _U64(0xBF58476D1CE4E5B9)
_MIX2 = _U64(0x94D049BB133111EB)
_GOLDEN = _U64(0x9E3779B97F4A7C15)
_S27, _S30, _S31 = _U64(27), _U64(30), _U64(31)
_ROUND_CONSTANTS = tuple(_U64((0x632BE59BD9B4E019 * (i + 1)) & 0xFFFFFFFFFFFFFFFF) for i in range(16))


def derive_key(seed: int, *words: int) -> np.uint64:
    """A 64-bit key for (seed, *words); every word must be a non-negative integer."""
    state = np.random.SeedSequence([int(seed), *(int(w) for w in words)]).generate_state(1, np.uint64)
    return state[0]


def philox(seed: int, *words: int) -> np.random.Generator:
    """A Philox generator keyed by (seed, *words), independent of every other tuple of words."""
    return np.random.Generator(np.random.Philox(np.random.SeedSequence([int(seed), *(int(w) for w in words)])))


def mix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser, a bijection of uint64 with strong avalanche (x is not modified)."""
    x = np.asarray(x, dtype=_U64)
    x = x ^ (x >> _S30)
    x *= _MIX1
    x ^= x >> _S27
    x *= _MIX2
    x ^= x >> _S31
    return x


def hash_words(key: np.uint64 | np.ndarray, *arrays: np.ndarray | int) -> np.ndarray:
    """Chain `key` with per-element non-negative integers into per-element 64-bit keys."""
    h = np.atleast_1d(np.asarray(key, dtype=_U64))
    for a in arrays:
        h = mix64(h ^ mix64(np.atleast_1d(np.asarray(a, dtype=np.int64)).astype(_U64) + _GOLDEN))
    return h


def _bit_length(values: np.ndarray) -> np.ndarray:
    """bit_length of each non-negative int64 below 2**53, as uint64."""
    return np.frexp(values.astype(np.float64))[1].astype(_U64)


def _feistel_rounds(x: np.ndarray, half: np.ndarray, mask: np.ndarray, key: np.ndarray) -> np.ndarray:
    left = x >> half
    right = x & mask
    for c in _ROUND_CONSTANTS[:FEISTEL_ROUNDS]:
        f = right ^ key
        f ^= c
        left, right = right, left ^ (mix64(f) & mask)
    right |= left << half
    return right


def feistel_permute(x: np.ndarray, n: np.ndarray | int, key: np.ndarray | np.uint64) -> np.ndarray:
    """Image of each index ``x[i]`` under the keyed permutation of ``[0, n[i])`` named by ``key[i]``.

    `n` and `key` broadcast against `x`. For a fixed (n, key) the map is a bijection of ``[0, n)``; for
    different keys the permutations are independent for all practical purposes (round i applies
    splitmix64 to ``right ^ key ^ c_i``). Requires ``0 <= x < n`` and ``n < 2**52``.
    """
    x = np.atleast_1d(np.asarray(x, dtype=np.int64))
    if x.size == 0:
        return x.copy()
    n = np.broadcast_to(np.asarray(n, dtype=np.int64), x.shape)
    key = np.broadcast_to(np.asarray(key, dtype=_U64), x.shape)
    half = np.maximum((_bit_length(n - 1) + _U64(1)) >> _U64(1), _U64(1))
    mask = (_U64(1) << half) - _U64(1)
    limit = n.astype(_U64)
    y = _feistel_rounds(x.astype(_U64), half, mask, key)
    # Cycle walking: the domain is below 4n, so few elements need more than one extra pass.
    todo = np.flatnonzero(y >= limit)
    while todo.size:
        y[todo] = _feistel_rounds(y[todo], half[todo], mask[todo], key[todo])
        todo = todo[y[todo] >= limit[todo]]
    return y.astype(np.int64)
