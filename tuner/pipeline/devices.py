"""The job's devices: refused before anything runs when this machine or the cluster cannot
measure on them, and a measurement pool of slots for each."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from kernels import device_kind

if TYPE_CHECKING:
    from cluster import SlotPool

    from ..jobfile import JobSpec


def check_devices(job: JobSpec, address: str | None = None) -> None:
    """Refuse a device this machine cannot measure on, before anything runs, as a job-file
    error at the device's line (``JobSpec.device_error``).  With a cluster ``address`` the
    GPUs are the cluster's: ``check_cluster_gpus`` runs once Ray is joined."""
    if address:
        return
    for i, device in enumerate(job.devices):
        if device_kind(device) == "cuda":
            from kernels import cuda_available

            ok, why = cuda_available()
            if not ok:
                raise job.device_error(i, f"{device}: the cuda device is unavailable ({why}); "
                                       "use 'devices: [cpu]' or run on a GPU machine")


def check_cluster_gpus(job: JobSpec) -> None:
    """The joined Ray cluster must have a GPU for every cuda device of the job."""
    import ray

    gpus = int(ray.cluster_resources().get("GPU", 0))
    for i, device in enumerate(job.devices):
        if device_kind(device) == "cuda" and gpus < 1:
            raise job.device_error(i, f"{device}: the Ray cluster has no GPU resource; start "
                                   "its nodes with GPUs (ray start --num-gpus N) or use "
                                   "'devices: [cpu]'")


def make_pools(devices: tuple[str, ...], log: Callable[[str], None]) -> dict[str, SlotPool]:
    """A slot pool per device of the job (``replay`` gets one per Kernel Tuner space, from
    its pipeline: ``tuner.pipeline.recorded``)."""
    from cluster import SlotPool, cpu_slot_nodes
    from kernels import device_key

    pools = {}
    for device in devices:
        if device == "replay":
            continue
        if device == "cpu" and len(nodes := cpu_slot_nodes()) > 1:  # one per CPU node
            pool = SlotPool("cpu", pin=nodes, prefer_key=device_key("cpu"))
            for node, key in pool.left_out:
                log(f"cpu: node {node[:12]} times as {key}, not {pool.key}: "
                    "it searches but does not time this job's cpu trials")
            log(f"cpu: {len(pool.slots)} measurement slot(s), one per CPU node")
            pools[device] = pool
            continue
        pools[device] = SlotPool("cpu" if device == "cpu" else "cuda", slots(device))
    return pools


def slots(device: str) -> int:
    """Measurement slots for a device entry: one per GPU of the Ray cluster for ``cuda``,
    one for ``cuda:N`` (Ray picks the GPU) and one for ``cpu`` on one node (a cpu kernel uses
    every core of its node, so two slots there would time each other; a cluster of several
    CPU nodes gets one pinned slot on each, see ``make_pools``)."""
    if device != "cuda":
        return 1
    import ray

    return max(1, int(ray.cluster_resources().get("GPU", 1)))
