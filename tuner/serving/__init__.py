"""The serving API: what a database holds for a user who wants a kernel back.

``best`` (the record of the fastest verified kernel of a program at its shapes on a device),
``load`` (it as a callable), ``status`` (jobs, programs and best kernels of a database).  Only
reads; the launch (``tuner.pipeline``) is what writes.
"""

from .cache import (
    UncertainBestWarning,
    best,
    bests_at_stored_shapes,
    kernel_from_record,
    launch_hint,
    load,
    resolve_device_key,
    resolve_program,
    tuned_best,
    tuned_elsewhere,
)
from .status import status

__all__ = ["UncertainBestWarning", "best", "bests_at_stored_shapes", "kernel_from_record", "launch_hint", "load",
           "resolve_device_key", "resolve_program", "status", "tuned_best", "tuned_elsewhere"]
