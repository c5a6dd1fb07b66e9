"""Storage dtypes of a GPU's arrays: what the cuda device and the Triton runner hand kernels."""

from __future__ import annotations

import numpy as np


def to_storage(x: np.ndarray, dtype: str) -> np.ndarray:
    """Host array in the device's storage format: float32, float16, or bfloat16 as uint16 bits
    (round to nearest even)."""
    x = np.ascontiguousarray(x, np.float32)
    if dtype == "float16":
        return x.astype(np.float16)
    if dtype == "bfloat16":
        bits = x.view(np.uint32).astype(np.uint64)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        return bits.astype(np.uint16)
    return x


def from_storage(x: np.ndarray, dtype: str) -> np.ndarray:
    """float32 host array from a storage-format one."""
    if dtype == "bfloat16":
        return (np.asarray(x, np.uint16).astype(np.uint32) << 16).view(np.float32)
    return np.asarray(x, np.float32)


STORAGE = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16}
