"""Job files: the YAML a user hands to ``tuner launch`` (schema: docs/job-file.md).

Validation walks the composed YAML node tree rather than the loaded data so every error can
name ``FILE:LINE: key.path: what is wrong; how to fix`` — the launch must refuse a bad job
before it touches the database, and a one-line error is what a user can act on.  Parsing
only reads files (the job and the program files it names); it never writes anything.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from db import DEFAULT_URL
from kernels import parse_device_name
from search import (
    Program,
    ProgramError,
    builtin_names,
    builtin_program,
    load_program_file,
    parse_program,
)

from ..samplers.registry import SAMPLERS, unknown_sampler
from ._nodes import NodeReader, Pairs
from .schema import (
    BLOCK_LEVEL_OPS,
    ENTRY_KEYS,
    KERNEL_LEVEL_OPS,
    TOP_KEYS,
    ClusterSpec,
    DatabaseSpec,
    JobError,
    JobSpec,
    ProgramEntry,
    SearchSpec,
    TuningSpec,
)


def load_job(path: str | Path) -> JobSpec:
    """Read and validate a job file; program files resolve against its directory."""
    path = Path(path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        why = getattr(err, "strerror", None) or str(err)
        raise JobError(str(path), None, "job", f"cannot read the job file ({why}); check the "
                       "path (examples/quickstart.yaml is a starting point)") from None
    return parse_job(text, str(path), path.parent)


def parse_job(text: str, source: str = "<string>", base_dir: str | Path | None = None) -> JobSpec:
    """Validate job-file text; ``base_dir`` (default: ``source``'s directory) anchors
    relative program file paths."""
    if base_dir is None:
        base_dir = Path(source).parent if not source.startswith("<") else Path.cwd()
    return _Parser(text, source, Path(base_dir)).job()


class _Parser(NodeReader):
    """The sections of a job file, each checked at its node."""

    # --- sections ------------------------------------------------------------------------

    def job(self) -> JobSpec:
        try:
            root = self.loader.get_single_node()
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
            raise JobError(self.source, mark.line + 1 if mark else 1, "yaml",
                           f"not valid YAML: {getattr(err, 'problem', None) or err}; fix the "
                           "indentation, colons or quotes there") from None
        finally:
            self.loader.dispose()
        if root is None or self.is_null(root):
            raise JobError(self.source, 1, "job", "the job file is empty; it needs at least "
                           "'programs:' (see examples/quickstart.yaml)")
        top = self.mapping(root, "", TOP_KEYS, "a job file")
        if "programs" not in top:
            raise self.fail(root, "programs", "missing; list the programs to tune, e.g. "
                            "'programs: [rmsnorm_matmul]'")

        def get(key: str) -> yaml.Node | None:
            return top[key][1] if key in top else None

        def count(node: yaml.Node, path: str) -> int | None:
            return self.integer(node, path, 1)

        def count_or_null(node: yaml.Node, path: str) -> int | None:
            return self.integer(node, path, 1, null=True)

        programs = self.programs(top["programs"][1])
        devices, device_places = self.devices(get("devices"))
        self.check_replay(programs, devices, top)
        return JobSpec(
            source=self.source,
            programs=programs,
            search=self.section(get("search"), "search", SearchSpec, {
                "max_kernel_ops": count, "max_block_ops": count,
                "max_block_inputs": count_or_null,
                "max_grid_dims": lambda n, p: self.integer(n, p, 1, 3),
                "block_ops": lambda n, p: self.op_list(n, p, BLOCK_LEVEL_OPS, "block"),
                "kernel_ops": lambda n, p: self.op_list(n, p, KERNEL_LEVEL_OPS, "kernel"),
                "time_limit_s": self.seconds, "partition_above": count_or_null,
                "max_piece_ops": count}),
            tuning=self.section(get("tuning"), "tuning", TuningSpec, {
                "trials_per_structure": count, "structures": count,
                "time_budget_s": self.seconds,
                "trial_timeout_s": lambda n, p: self.seconds(n, p, null=False),
                "confirm": lambda n, p: self.integer(n, p, 0),
                "sampler": self.sampler,
                "seed": lambda n, p: self.integer(n, p, 0, null=True)}),
            devices=devices,
            cluster=self.section(get("cluster"), "cluster", ClusterSpec,
                                 {"address": self.address, "workers": count}),
            database=self.database(get("database")),
            device_places=device_places,
        )

    def check_replay(self, programs: tuple[ProgramEntry, ...], devices: tuple[str, ...],
                     top: Pairs) -> None:
        """Kernel Tuner spaces run only on ``replay``; ``replay`` runs only them."""
        spaces = [i for i, e in enumerate(programs) if e.kind == "kernel_tuner"]
        node = top["programs"][1]
        if spaces and "replay" not in devices:
            i = spaces[0]
            raise self.fail(node.value[i], f"programs[{i}].kernel_tuner", "a Kernel Tuner "
                            "space is answered from its file by the replay device; add "
                            "'replay' to devices")
        if "replay" in devices and not spaces:
            dev = top["devices"][1] if "devices" in top else None
            j = devices.index("replay")
            item = dev.value[j] if isinstance(dev, yaml.SequenceNode) else dev
            raise self.fail(item, f"devices[{j}]" if item is not dev else "devices",
                            "replay answers Kernel Tuner spaces only; add a program "
                            "'- kernel_tuner: FILE.json.gz' or remove replay")

    def section(self, node: yaml.Node | None, name: str, cls: type,
                rules: dict[str, Callable[[yaml.Node, str], Any]]) -> Any:
        """A flat section: each present key checked by its rule, the rest at cls's defaults."""
        m = self.mapping(node, name, tuple(rules), name) if node is not None else {}
        return cls(**{k: rules[k](v, f"{name}.{k}") for k, (_, v) in m.items()})

    def programs(self, node: yaml.Node) -> tuple[ProgramEntry, ...]:
        if not isinstance(node, yaml.SequenceNode) or not node.value:
            raise self.fail(node, "programs", "must be a non-empty list; write one '- NAME' "
                            "(or '- {file: ...}' / '- program: ...') line per program")
        entries: list[ProgramEntry] = []
        seen: dict[tuple, int] = {}
        for i, item in enumerate(node.value):
            entry = self.entry(item, f"programs[{i}]")
            p = entry.program
            if p is None:
                sp = entry.space
                key: tuple = ("kernel_tuner", sp.kernel, sp.device, sp.problem_size)
                if key in seen:
                    raise self.fail(item, f"programs[{i}]", f"{sp.kernel} on {sp.device} is "
                                    f"already programs[{seen[key]}]; list each cache once")
                seen[key] = i
                entries.append(entry)
                continue
            key = (p.name, p.dtype, tuple(sorted(p.inputs.items())))
            if key in seen:
                raise self.fail(item, f"programs[{i}]", f"{p.name} at these shapes is already "
                                f"programs[{seen[key]}]; remove one or give it a different set")
            seen[key] = i
            entries.append(entry)
        return tuple(entries)

    def builtin(self, node: yaml.Node, path: str) -> Program:
        name = self.string(node, path, "write a built-in program name")
        if name not in builtin_names():
            close = difflib.get_close_matches(name, builtin_names(), n=1)
            raise self.fail(node, path, f"no built-in program {name!r}; "
                            + (f"did you mean {close[0]!r}? " if close else "")
                            + "built-ins: " + ", ".join(builtin_names())
                            + " (or use 'file:' for a program file)")
        return builtin_program(name)

    def entry(self, node: yaml.Node, path: str) -> ProgramEntry:
        line = node.start_mark.line + 1
        if isinstance(node, yaml.ScalarNode):
            program = self.builtin(node, path)
            return ProgramEntry(program, "builtin", program.name, {}, line)
        if not isinstance(node, yaml.MappingNode):
            raise self.fail(node, path, "a program entry is a built-in name or a mapping with "
                            "one of name, file or program (plus an optional set)")
        m = self.mapping(node, path, ENTRY_KEYS, "a program entry")
        forms = [k for k in ("name", "file", "program", "kernel_tuner") if k in m]
        if len(forms) != 1:
            got = " and ".join(forms) if forms else "none of them"
            raise self.fail(node, path, f"give exactly one of name (a built-in), file (a "
                            f"program file), program (inline) or kernel_tuner (a Kernel Tuner "
                            f"cache file); got {got}")
        form, value = forms[0], m[forms[0]][1]
        sub = f"{path}.{form}"
        if form == "kernel_tuner":
            if "set" in m:
                raise self.fail(m["set"][0], f"{path}.set", "a Kernel Tuner space is tuned at "
                                "the problem size it was recorded at; remove 'set'")
            ref, space = self.kernel_tuner(value, sub)
            return ProgramEntry(None, "kernel_tuner", ref, {}, line, space)
        if form == "name":
            program = self.builtin(value, sub)
            ref = program.name
        elif form == "file":
            program, ref = self.program_file(value, sub)
        else:
            program, ref = self.inline(value, sub), "inline"
        overrides: dict[str, Any] = {}
        if "set" in m:
            program, overrides = self.overrides(m["set"][1], program, f"{path}.set")
        kind = {"name": "builtin", "file": "file", "program": "inline"}[form]
        return ProgramEntry(program, kind, ref, overrides, line)

    def kernel_tuner(self, node: yaml.Node, path: str) -> tuple[str, Any]:
        """A Kernel Tuner cache file (relative to the job file), read now: a missing or
        malformed one is an error at its line."""
        rel = self.string(node, path, "write the path of a Kernel Tuner cache file "
                          "(FILE.json or FILE.json.gz)")
        file = (self.base_dir / rel).resolve()
        if not file.is_file():
            raise self.fail(node, path, f"no file {rel!r} (looked at {file}); paths are "
                            "relative to the job file's directory")
        from costmodel import CacheFormatError, read_kernel_tuner  # torch-free, but slow

        try:
            space = read_kernel_tuner(file)
        except CacheFormatError as err:
            raise self.fail(node, path, f"{err}; give a Kernel Tuner cache file (format in "
                            "docs/job-file.md)") from None
        bad = [k for k in space.keys
               if not all(isinstance(c[k], int) and not isinstance(c[k], bool)
                          for c in space.configs)]
        if bad:
            raise self.fail(node, path, f"{rel}: parameter {bad[0]!r} has values that are not "
                            "whole numbers; only integer-valued Kernel Tuner spaces replay")
        if all(math.isnan(t) for t in space.times_s):
            raise self.fail(node, path, f"{rel}: every configuration failed on "
                            f"{space.device}; there is nothing to replay")
        return str(file), space

    def program_file(self, node: yaml.Node, path: str) -> tuple[Program, str]:
        rel = self.string(node, path, "write the path of a program .yaml file")
        target = (self.base_dir / rel).resolve()
        if not target.is_file():
            raise self.fail(node, path, f"no program file {str(target)!r} (paths are relative "
                            f"to the job file's directory {str(self.base_dir)!r}); fix the path")
        try:
            return load_program_file(target), str(target)
        except ProgramError as err:
            raise self.fail(node, path, f"the program file is invalid: {err}; fix it there "
                            "(docs/ir.md describes program files)") from None

    def inline(self, node: yaml.Node, path: str) -> Program:
        if not isinstance(node, yaml.MappingNode):
            raise self.fail(node, path, "an inline program is a mapping with name, dtype, "
                            "params, inputs, body and outputs; indent them under 'program:'")
        # Hand parse_program the program's own text at its own place in the file, so the
        # lines it reports (a body error included) are lines of the job file.
        start, end = node.start_mark, node.end_mark
        text = "\n" * start.line + " " * start.column + self.text[start.index:end.index]
        try:
            return parse_program(text, self.source)
        except ProgramError as err:
            line = err.line or start.line + 1
            key = path
            for k, v in node.value:
                last = v.end_mark.line + (1 if v.end_mark.column else 0)
                if k.start_mark.line + 1 <= line <= max(last, k.start_mark.line + 1):
                    key = f"{path}.{k.value}"
            raise JobError(self.source, line, key, f"{err.reason}; fix the inline program "
                           "(docs/ir.md describes the language)") from None

    def overrides(self, node: yaml.Node, program: Program,
                  path: str) -> tuple[Program, dict[str, Any]]:
        m = self.mapping(node, path, None, "set")
        known = [*program.params, *program.inputs]
        values: dict[str, Any] = {}
        for name, (k, v) in m.items():
            sub = f"{path}.{name}"
            if name not in known:
                raise self.fail(k, sub, f"{program.name} has no parameter or input {name!r}; "
                                f"it has {', '.join(known)}")
            value = self.value(v)
            if name in program.params:
                if type(value) is not int or value < 1:
                    raise self.fail(v, sub, f"got {value!r}; parameter {name} takes a whole "
                                    "number at least 1")
            else:
                if isinstance(value, bool) or not isinstance(value, str | int | list):
                    value = None
                try:
                    program.with_overrides({name: "" if value is None else value})
                except ProgramError as err:
                    raise self.fail(v, sub, f"{err.reason.split(': ', 1)[-1]}; input {name} "
                                    f"takes a shape such as 16x1024 or [16, 1024]") from None
            values[name] = value
        try:
            program = program.with_overrides(values)
            program.build()
        except ProgramError as err:
            raise self.fail(node, path, f"these shapes do not fit {program.name}: "
                            f"{err.reason}; change the set values so the shapes agree") from None
        return program, values

    def op_list(self, node: yaml.Node, path: str, allowed: tuple[str, ...],
                level: str) -> tuple[str, ...]:
        if not isinstance(node, yaml.SequenceNode) or not node.value:
            raise self.fail(node, path, f"must be a non-empty list of {level} ops, e.g. "
                            f"[{', '.join(allowed[:3])}]")
        ops: list[str] = []
        for i, item in enumerate(node.value):
            op = self.value(item)
            if op not in allowed:
                raise self.fail(item, f"{path}[{i}]", f"{op!r} is not a {level} op; "
                                f"{level} ops: {', '.join(allowed)}")
            if op in ops:
                raise self.fail(item, f"{path}[{i}]", f"{op} is listed twice; remove one")
            ops.append(op)
        return tuple(ops)

    def sampler(self, node: yaml.Node, path: str) -> str:
        name = self.string(node, path, "write one of " + ", ".join(SAMPLERS)).lower()
        why = unknown_sampler(name)
        if why is not None:
            raise self.fail(node, path, why)
        return name

    def devices(self, node: yaml.Node | None
                ) -> tuple[tuple[str, ...], tuple[tuple[str, int], ...]]:  # (key, line) each
        if node is None:
            return ("cpu",), ()
        items = [node] if isinstance(node, yaml.ScalarNode) else node.value \
            if isinstance(node, yaml.SequenceNode) else None
        if not items:
            raise self.fail(node, "devices", "must be a non-empty list of cpu, cuda (every "
                            "GPU) or cuda:N, e.g. [cpu]")
        devices: list[str] = []
        places: list[tuple[str, int]] = []
        for i, item in enumerate(items):
            sub = f"devices[{i}]" if item is not node else "devices"
            dev = self.value(item)
            try:
                kind, index = parse_device_name(dev.strip().lower() if isinstance(dev, str)
                                                 else "")
            except ValueError:
                raise self.fail(item, sub, f"unknown device {dev!r}; write cpu, cuda (every "
                                "GPU), cuda:N (GPU number N) or replay (Kernel Tuner "
                                "spaces)") from None
            dev = dev.strip().lower()
            # a kind listed without a number (cuda: every GPU) overlaps each of its devices
            overlap = dev in devices or any(
                k == kind and (i is None or index is None)
                for k, i in map(parse_device_name, devices))
            if overlap:
                raise self.fail(item, sub, f"{dev} repeats a device already listed (cuda means "
                                "every GPU); list each device once")
            devices.append(dev)
            places.append((sub, self.line(item)))
        return tuple(devices), tuple(places)

    def address(self, node: yaml.Node, path: str) -> str | None:
        if self.is_null(node):
            return None
        address = self.string(node, path, "write a Ray address such as 10.0.0.5:6379 or auto, "
                              "or null for an embedded Ray")
        if any(c.isspace() for c in address):
            raise self.fail(node, path, f"{address!r} contains spaces; write HOST:PORT, "
                            "ray://HOST:PORT or auto")
        return address

    def database(self, node: yaml.Node | None) -> DatabaseSpec:
        if node is None:
            return DatabaseSpec()
        if isinstance(node, yaml.ScalarNode) and not self.is_null(node):
            url_node, path = node, "database"
        else:
            m = self.mapping(node, "database", ("url",), "database")
            if "url" not in m:
                return DatabaseSpec()
            url_node, path = m["url"][1], "database.url"
        url = self.string(url_node, path, f"write a database URL such as {DEFAULT_URL}")
        from db import normalize_url  # db is slow to import; only needed here

        try:
            normalize_url(url)
        except ValueError as err:
            what = str(err).split(": use ")[0].split(": expected ")[0]
            raise self.fail(url_node, path, f"{what}; write a SQLite or PostgreSQL URL such "
                            f"as {DEFAULT_URL} or postgresql+psycopg://USER@HOST:5432/DB") from None
        return DatabaseSpec(url)
