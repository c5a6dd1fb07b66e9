"""Trial statuses: the one vocabulary of what a measurement came to.

Defined here, in the devices room, because the devices and their isolated worker produce
them; ``db`` stores them (its CHECK constraint and writes read ``MEASUREMENT_STATUSES`` from
here: the one arrow db -> kernels, to this leaf, which imports nothing), ``cluster`` adds
``node_lost`` for a trial whose node died, and the tuner counts them.  Every other module
imports these names instead of writing the strings.
"""

from __future__ import annotations

OK = "ok"
COMPILE_ERROR = "compile_error"
RUNTIME_ERROR = "runtime_error"
TIMEOUT = "timeout"
WRONG_RESULT = "wrong_result"
INVALID = "invalid"  # the config does not lower for the device: nothing was built or run
NODE_LOST = "node_lost"  # the trial's Ray node (and slot) died under it: cluster's verdict

# what an isolated job, and so a device's check or timing, comes back with
STATUSES = (OK, COMPILE_ERROR, RUNTIME_ERROR, TIMEOUT, WRONG_RESULT)
# what Device.run_trial answers: STATUSES, or INVALID before anything ran
TRIAL_STATUSES = (*STATUSES, INVALID)
# what the database stores for a measurement (an invalid config is no measurement)
MEASUREMENT_STATUSES = (*STATUSES, NODE_LOST)

__all__ = ["COMPILE_ERROR", "INVALID", "MEASUREMENT_STATUSES", "NODE_LOST", "OK",
           "RUNTIME_ERROR", "STATUSES", "TIMEOUT", "TRIAL_STATUSES", "WRONG_RESULT"]
