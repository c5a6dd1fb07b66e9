"""Lowering: a µGraph (structure + config, or a bound graph) → a ``KernelPlan`` for a device.

Every decision that changes the generated code is made here, from the device table
(``kernels.hardware``), and recorded in the plan: the memory level of every intermediate
(AStitch's stitching schemes), the thread mapping, shared-memory offsets, which loops are
fused, how a matmul is blocked.  The renderer only prints plans.

Modules: ``_plan`` (the plan's data), ``_lower`` (assembly: kernels, phases, lifetimes,
workspace), ``_stitch`` (block ops → fused loops and levels), ``_fuse`` (loop bodies),
``_mapping`` (the AStitch rule and default configs), ``_predefined`` (predefined kernel ops as
one-op block graphs).
"""

from ._lower import concretize, lower, resolve_spec
from ._mapping import (
    KNOBS,
    ROW_OPS,
    TRITON_TILE_VALUES_PER_THREAD,
    ZERO_OK,
    astitch_rule,
    blocks_per_wave,
    default_config,
    divisibility_constraints,
    divisors,
    is_row_form,
    split_config,
    triton_default_config,
)
from ._plan import (
    DOT_MIN,
    Access,
    Buffer,
    Kernel,
    KernelPlan,
    Let,
    Level,
    Loop,
    Mapping,
    Phase,
    RowReduce,
    Store,
    View,
    pad,
)
from ._schedule import STREAM_ROW_MAX, STREAM_ROW_MIN
from ._stitch import plan_shared

__all__ = [
    "ZERO_OK", "DOT_MIN", "pad", "TRITON_TILE_VALUES_PER_THREAD",
    "KNOBS", "ROW_OPS", "STREAM_ROW_MAX", "STREAM_ROW_MIN", "Access", "Buffer", "Kernel", "KernelPlan", "Let", "Level", "Loop", "Mapping",
    "Phase", "RowReduce", "Store", "View", "astitch_rule", "blocks_per_wave", "concretize",
    "default_config", "triton_default_config", "divisibility_constraints", "divisors", "is_row_form", "lower",
    "plan_shared", "resolve_spec", "split_config",
]
