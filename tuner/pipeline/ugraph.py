"""The pipeline of a µGraph program: search, verified structures, tuning on each device.

``prepare``: search (shards over Ray, each finished shard saved so a relaunch skips it) →
every verified structure stored with how it was verified.  ``tune`` on each device: the
op-by-op baseline timed → for each of the best-ranked structures (by the device's roofline
estimate) an Optuna study (``tuner.pipeline.tune``) whose trials run on measurement slots and
are stored as they finish → the library path as a candidate (``LibraryCandidate``) → the
fastest configs confirmed (``tuner.pipeline.confirm``) → the best kernel read back.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Generator
from functools import partial
from typing import TYPE_CHECKING, Any

import db
from cluster import VERIFY_BINDINGS
from search import KernelGraph, to_obj
from verifier import DEFAULT_TESTS

from ..api import small_instance
from ..formatting import SETTLE, ms
from ..identity import program_key
from ..samplers.factory import sampler_factory
from .base import ProgramPipeline
from .confirm import TIMINGS, ConfirmOutcome
from .library import LibraryCandidate
from .report import ProgramReport
from .tune import StudyRunner, StudyTask, study_name

if TYPE_CHECKING:
    import optuna

    from cluster import SearchResult, SlotPool
    from search import Program

SHARD_KEY_LEN = 200
# random tests per structure in the search's finite-field check (passed to it, and stored)
VERIFY_TESTS = DEFAULT_TESTS
# what cluster.verify_structure binds every grid / for-loop symbol to at the small instance
# first (then to the rest of VERIFY_BINDINGS)
VERIFY_SYMBOL = VERIFY_BINDINGS[0]


def search_notes(name: str, result: SearchResult) -> list[str]:
    """What a launch (and ``tuner search``) says about a search beyond its counts: the
    pieces a big program was searched in, and a time limit that cut the search short."""
    notes = []
    part = result.partition
    if part is not None:
        sizes = "+".join(str(p["ops"]) for p in part["pieces"])
        verdict = {True: "verified against the whole program", False: "REJECTED by the "
                   "verifier", None: "not verified as a whole"}[part["verified_whole"]]
        kernels = f"{result.best['num_kernels']} kernels, " if result.best else ""
        notes.append(f"{name}: searched in {len(part['pieces'])} pieces of {sizes} ops; "
                     f"joined structure: {kernels}{verdict} ({part['reason']})")
    if result.time_limit_hit:
        notes.append(f"{name}: the search stopped at its time limit "
                     f"({result.time_limit_s or 0:.0f} s): what it found is the best so far "
                     "(raise search.time_limit_s / --time-limit for more)")
    return notes


class UGraphPipeline(ProgramPipeline):
    """A program of the job (built-in, file or inline) through search and tuning."""

    def prepare(self, database: db.Database, job_id: int) -> None:
        from cluster import ShardResult, search_program

        program, log = self.entry.program, self.ctx.log
        self.reference = reference = program.build()
        self.key = key = program_key(program, reference)
        self.program_id = database.record_program(key.program_hash, key.shapes, key.dtype,
                                                  program.name, to_obj(reference))
        prefix = f"{key.program_hash[:16]}/"
        done = {}
        for stats in database.shard_results(job_id, prefix).values():
            res = ShardResult.from_json(stats)
            done[res.shard_id] = res

        def save(res: ShardResult) -> None:
            if res.complete:
                database.record_shard(job_id, _shard_key(prefix, res.shard_id), "finished",
                                      res.to_json())

        t0 = time.perf_counter()
        log(f"{program.name}: search ({len(done)} shards from an earlier run)")
        executor = self.ctx.executor
        if hasattr(executor, "on_reissue"):  # a Ray executor: say which stragglers it copied
            executor.on_reissue = lambda sid, out_s, limit_s: log(
                f"{program.name}: shard {sid} out {out_s:.1f} s (limit {limit_s:.1f} s): "
                "re-issued to an idle worker, the first copy to finish wins")
        job = self.ctx.job
        result = search_program(program, job.search.limits(), tests=VERIFY_TESTS,
                                executor=executor, time_limit_s=job.search.time_limit_s,
                                done=done, on_shard=save,
                                on_progress=self.ctx.search_progress(program.name))
        self.search_s = time.perf_counter() - t0
        self.found, self.reused = len(result.verified), len(done)
        self.stored = self._store_structures(database, result)
        log(f"{program.name}: {len(result.verified)} verified structure(s) in "
            f"{self.search_s:.1f} s; tuning the best "
            f"{min(len(self.stored), job.tuning.structures)}"
            " by the roofline estimate of each device"
            + (f" ({len(result.reissued)} straggling shard(s) re-issued)"
               if result.reissued else ""))
        for line in search_notes(program.name, result):
            log(line)
        self.confirmed: dict[str, ConfirmOutcome] = {}

    def devices(self, pools: dict[str, SlotPool]
                ) -> Generator[tuple[str, SlotPool], None, None]:
        yield from pools.items()

    def tune(self, database: db.Database, storage: optuna.storages.RDBStorage,
             pool: SlotPool) -> ProgramReport:
        from kernels import config_space, rank_structures

        from .confirm import confirm

        program, key, reference = self.entry.program, self.key, self.reference
        tuning = self.ctx.job.tuning
        rep = ProgramReport(program.name, key.shapes, pool.key, structures_found=self.found,
                            candidates=len(self.stored), search_s=self.search_s,
                            shards_reused=self.reused)
        t1 = time.perf_counter()
        rep.baseline_s = _baseline(pool, reference)
        factory = sampler_factory(tuning.sampler, tuning.seed, database, pool.key,
                                  self.ctx.log_once)
        rep.sampler = factory.chosen
        runner = StudyRunner(database, storage, factory, pool,
                             trials=tuning.trials_per_structure, seed=tuning.seed or 0,
                             deadline=self.ctx.deadline(),
                             timeout_s=tuning.trial_timeout_s,
                             on_trial=self.ctx.trial_progress(program.name))
        order = rank_structures([g for _, _, g in self.stored], pool.spec)
        for sid, shash, graph in [self.stored[i] for i in order[:tuning.structures]]:
            task = StudyTask(program.name, sid, shash, graph, to_obj(graph), to_obj(reference),
                             config_space(graph, pool.spec), pool.key, pool.spec,
                             study_name(program.name, key.program_hash,
                                        db.shapes_key(key.shapes), shash, pool.key),
                             rep.baseline_s)
            rep.merge(runner.run(task, key.program_hash))
            rep.structures_tuned += 1
        library = LibraryCandidate(database, self.program_id, key, reference, pool)
        lib_s = library.time(rep.baseline_s, partial(_baseline, pool, reference))
        rep.baseline_s = lib_s or rep.baseline_s  # the library's median of its timings
        conf = confirm(database, pool, key, self.program_id, tuning.confirm, to_obj(reference),
                       rep.baseline_s, seed=tuning.seed or 0,
                       timeout_s=tuning.trial_timeout_s,
                       past_deadline=runner.past_deadline)
        self.confirmed[pool.key] = conf
        rep.confirmed, rep.confirm_new, rep.best_first_s = conf.candidates, conf.new, \
            conf.first_s
        rep.library = library.compete(program.name)
        best = database.best_kernel(key.program_hash, key.shapes, key.dtype, pool.key)
        if best is not None:
            rep.best_s, rep.best_structure = best.time_s, best.structure_hash
            rep.best_config = best.config
            rep.uncertain = best.uncertain
            rep.baseline_s = rep.baseline_s or best.baseline_s
            rep.tuned_s = library.tuned_s
        rep.tune_s = time.perf_counter() - t1
        return rep

    def report(self, device: str, pool: SlotPool, rep: ProgramReport
               ) -> tuple[str, dict[str, Any]]:
        name, conf = rep.program, self.confirmed[pool.key]
        confirmed = f" (median of {conf.best_timings} timings; the fastest first timing " \
            f"{ms(conf.first_s)})" if conf.best_s is not None else ""
        if rep.library:
            self.ctx.log(f"{name} on {pool.key}: {rep.trials} trial(s); the library "
                         f"wins: numpy op by op {ms(rep.best_s)} (median of {TIMINGS} "
                         f"timings) vs the fastest tuned kernel {ms(rep.tuned_s)}")
        else:
            self.ctx.log(f"{name} on {pool.key}: {rep.trials} trial(s), best "
                         f"{ms(rep.best_s)}{confirmed} vs numpy {ms(rep.baseline_s)}")
        if rep.uncertain:
            self.ctx.log(f"{name} on {pool.key}: the best is UNCERTAIN: {rep.uncertain}; "
                         f"{SETTLE}")
        return f"{name}@{device}", {"search_s": round(self.search_s, 3),
                                    "tune_s": round(rep.tune_s, 3)}

    def _store_structures(self, database: db.Database, result: SearchResult
                          ) -> list[tuple[int, str, KernelGraph]]:
        """Store every verified structure, with how it was verified, and the reference
        program (a kernel per op, trivially equivalent: all there is when the search verified
        nothing); return them all, in the search's order, the reference last."""
        from search import structural_hash

        reference = self.reference
        instance = small_instance_shapes(self.entry.program)
        ranked = [(s["hash"], result.verified[s["hash"]], s,
                   structure_verification(result.verified[s["hash"]], instance))
                  for s in result.structures]
        h = structural_hash(reference)
        if h not in {r[0] for r in ranked}:
            # the program itself, a kernel per op, is a candidate too, ranked with the rest by
            # its estimate (lora's structures under three block inputs compute W + A·B, twice
            # the reference's multiply-adds)
            ranked.append((h, reference, {"num_kernels": len(reference.ops) - len(
                reference.input_ids) - len(reference.ops_of("output")), "bytes_moved": None},
                {"layer": "structure", "verdict": "reference",
                 "note": "the program as written, a kernel per op"}))
        out = []
        for h, graph, desc, verification in ranked:
            sid = database.record_structure(self.program_id, h, to_obj(graph), verification,
                                            int(desc.get("num_kernels") or 0),
                                            desc.get("bytes_moved"))
            out.append((sid, h, graph))
        return out


def _baseline(pool: SlotPool, reference: KernelGraph) -> float | None:
    pool.submit("baseline", {"reference": to_obj(reference), "tag": "baseline"})
    return pool.next_done().get("baseline_s")


def small_instance_shapes(program: Program) -> dict[str, list[int]]:
    """The input shapes the search verifies ``program``'s structures at (its small
    instance: every dim capped, see ``search.ir.suite.small_instance``)."""
    return {name: [int(d) for d in shape]
            for name, shape in small_instance(program).inputs.items()}


def structure_verification(structure: KernelGraph, instance: dict[str, list[int]],
                           tests: int = VERIFY_TESTS) -> dict[str, Any]:
    """How the search verified ``structure`` (stored with it): ``tests`` random tests in the
    finite field at the small ``instance`` with every grid / for-loop symbol bound to
    ``VERIFY_SYMBOL`` (``cluster.verify_structure``'s rule; ``SearchResult`` does not carry
    the binding, so it is derived here from the structure's symbols)."""
    symbols = sorted(structure.symbols())
    return {"layer": "structure", "arithmetic": "field", "verdict": "equivalent",
            "tests": tests, "instance": instance,
            "symbols": {s: VERIFY_SYMBOL for s in symbols},
            "also_bound_to": list(VERIFY_BINDINGS[1:]) if symbols else []}


def _shard_key(prefix: str, shard_id: str) -> str:
    key = prefix + shard_id
    if len(key) > SHARD_KEY_LEN:
        key = prefix + "sha256:" + hashlib.sha256(shard_id.encode()).hexdigest()
    return key
