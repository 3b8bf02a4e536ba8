"""Which partition a session lives on: Kafka's Java-compatible murmur2 partitioner."""

from __future__ import annotations

from functools import lru_cache

__all__ = ["murmur2", "partition_for"]


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (the Java client's default partitioner), so every client agrees on partitions."""
    length = len(data)
    m, r = 0x5BD1E995, 24
    h = (0x9747B28C ^ length) & 0xFFFFFFFF
    for i in range(0, length - length % 4, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = (h * m) & 0xFFFFFFFF
        h ^= k
    rest = length % 4
    tail = data[length - rest :]
    if rest == 3:
        h ^= tail[2] << 16
    if rest >= 2:
        h ^= tail[1] << 8
    if rest >= 1:
        h ^= tail[0]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h


@lru_cache(maxsize=1 << 16)  # every append and read asks; murmur2 in Python costs microseconds
def partition_for(session_id: str, partitions: int) -> int:
    """The partition of a session: Java-compatible ``toPositive(murmur2(key)) % partitions``."""
    return (murmur2(session_id.encode()) & 0x7FFFFFFF) % partitions
