"""A search shard runs at the priority of the process that launched the search: Ray's
workers (started at nice 15) are raised to it, and a shard run in that process itself (the
local executor) leaves it as it is.  `nice -n 10 pytest` used to be raised to nice 0 by the
first in-process shard, so "niced" test runs on a shared 2-core machine ran at full
priority beside other sessions' timings."""

from __future__ import annotations

import os
import subprocess
import sys

CODE = """
import os
from cluster import LocalExecutor, search_program
from cluster.search_tasks import _normal_priority
from search import Limits
from search.ir import load_program

before = os.nice(0)
program = load_program("softmax_rows", {"rows": 16, "cols": 16})
limits = Limits(max_block_ops=4, block_ops=("exp", "div", "sum", "accum"), max_extra_ops=None)
found = search_program(program, limits, executor=LocalExecutor()).verified
after = os.nice(0)
os.nice(5)  # a worker below the launching process, as Ray starts its workers
try:
    _normal_priority(before)
    raised = os.nice(0)
except OSError:
    raised = None
print(before, after, len(found) > 0, raised)
"""


def test_a_search_keeps_the_niceness_of_the_process_that_runs_it():
    res = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True,
                         timeout=300, preexec_fn=lambda: os.nice(7))
    assert res.returncode == 0, res.stderr[-2000:]
    before, after, found, raised = res.stdout.split()
    assert int(before) >= 7 and after == before and found == "True", res.stdout
    assert raised in (before, "None", str(int(before) + 5)), res.stdout  # unprivileged: stays
