"""Flink's operator id of a uid, as ``StreamGraphHasherV2.generateUserSpecifiedHash`` computes it:
Guava's ``murmur3_128`` (MurmurHash3 x64 128-bit, seed 0) of the uid's UTF-8 bytes. The 16 hash
bytes are the ``OperatorID`` (its hex string is the bytes in order), so an operator named by uid
can be found in metadata that stores no uids (versions 3 and 4, Flink 1.x).
"""

from __future__ import annotations

_MASK = (1 << 64) - 1
_C1 = 0x87C37B91114253D5
_C2 = 0x4CF5AD432745937F


def _rotl(value: int, shift: int) -> int:
    return ((value << shift) | (value >> (64 - shift))) & _MASK


def _fmix(k: int) -> int:
    k ^= k >> 33
    k = (k * 0xFF51AFD7ED558CCD) & _MASK
    k ^= k >> 33
    k = (k * 0xC4CEB9FE1A85EC53) & _MASK
    return k ^ (k >> 33)


def murmur3_128(data: bytes, seed: int = 0) -> bytes:
    """MurmurHash3_x64_128, as Guava's ``Hashing.murmur3_128(seed).hashBytes(data).asBytes()``."""
    h1 = h2 = seed & _MASK
    whole = len(data) - len(data) % 16
    for i in range(0, whole, 16):
        k1 = int.from_bytes(data[i : i + 8], "little")
        k2 = int.from_bytes(data[i + 8 : i + 16], "little")
        h1 ^= _rotl((k1 * _C1) & _MASK, 31) * _C2 & _MASK
        h1 = (_rotl(h1, 27) + h2) & _MASK
        h1 = (h1 * 5 + 0x52DCE729) & _MASK
        h2 ^= _rotl((k2 * _C2) & _MASK, 33) * _C1 & _MASK
        h2 = (_rotl(h2, 31) + h1) & _MASK
        h2 = (h2 * 5 + 0x38495AB5) & _MASK
    tail = data[whole:]
    k1 = int.from_bytes(tail[:8], "little")
    k2 = int.from_bytes(tail[8:], "little")
    if len(tail) > 8:
        h2 ^= _rotl((k2 * _C2) & _MASK, 33) * _C1 & _MASK
    if tail:
        h1 ^= _rotl((k1 * _C1) & _MASK, 31) * _C2 & _MASK
    h1 ^= len(data)
    h2 ^= len(data)
    h1 = (h1 + h2) & _MASK
    h2 = (h2 + h1) & _MASK
    h1, h2 = _fmix(h1), _fmix(h2)
    h1 = (h1 + h2) & _MASK
    h2 = (h2 + h1) & _MASK
    return h1.to_bytes(8, "little") + h2.to_bytes(8, "little")


def operator_id_of_uid(uid: str) -> str:
    """The 32-hex-digit OperatorID Flink gives an operator with this uid. Its bytes are Java's
    ``String.getBytes(UTF_8)``: a surrogate pair is one character, a lone surrogate ``?``."""
    java = uid.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")
    return murmur3_128(java.encode("utf-8", "replace")).hex()
