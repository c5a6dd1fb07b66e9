"""Job files: the schema's entry forms, defaults, and one-line errors at the right line."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from support import MALFORMED

from search import Limits
from tuner.jobfile import JobError, JobSpec, load_job, parse_job

ROOT = Path(__file__).resolve().parents[2]

PROGRAM_FILE = """\
name: my_norm
dtype: float32
params: {rows: 4}
inputs:
  X: [rows, 64]
body: |
  O = rms_norm(X)
outputs: [O]
"""


def write(tmp_path: Path, text: str, name: str = "job.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_examples_load() -> None:
    quick = load_job(ROOT / "examples" / "quickstart.yaml")
    assert [e.ref for e in quick.programs] == ["rmsnorm_matmul", "softmax_rows", "rmsnorm_residual"]
    assert quick.programs[0].program.inputs == {"X": (16, 256), "W": (256, 256)}
    assert quick.programs[1].program.inputs == {"X": (256, 256)}
    assert quick.devices == ("cpu",)
    assert quick.database.url == "sqlite:///./tuner.db"
    suite = load_job(ROOT / "examples" / "paper_suite.yaml")
    assert [e.ref for e in suite.programs] == ["rmsnorm_matmul", "gated_mlp", "lora", "gqa",
                                               "qknorm_gqa", "mha", "mqa", "ntrans"]
    assert suite.search.limits().max_block_inputs == 4
    assert suite.programs[2].program.inputs["W"] == (256, 4096)  # paper shapes untouched
    cpu = load_job(ROOT / "examples" / "cpu_suite.yaml")
    assert [e.ref for e in cpu.programs] == [e.ref for e in suite.programs]
    assert cpu.devices == ("cpu",) and cpu.search.limits().max_block_inputs == 4


def test_every_entry_form_and_defaults(tmp_path: Path) -> None:
    (tmp_path / "progs").mkdir()
    write(tmp_path, PROGRAM_FILE, "progs/my_norm.yaml")
    job = load_job(write(tmp_path, """\
        programs:
          - gated_mlp
          - name: rmsnorm_matmul
            set: {batch: 8}
          - name: rmsnorm_matmul
            set: {X: 16x1024, W: [1024, 512]}
          - file: progs/my_norm.yaml
            set: {rows: 32}
          - program:
              name: scaled_exp
              dtype: float32
              inputs:
                X: [64, 128]
              body: |
                O = exp(X) * 0.5
              outputs: [O]
            set: {X: 8x16}
        """))
    kinds = [(e.kind, e.line) for e in job.programs]
    assert kinds == [("builtin", 2), ("builtin", 3), ("builtin", 5), ("file", 7),
                     ("inline", 9)]
    b, p, s, f, i = (e.program for e in job.programs)
    assert b.name == "gated_mlp"
    assert p.inputs["X"] == (16, 4096) and job.programs[1].overrides == {"batch": 8}
    assert s.inputs == {"X": (16, 1024), "W": (1024, 512)}
    assert f.name == "my_norm" and f.inputs == {"X": (32, 64)}
    assert job.programs[3].ref == str((tmp_path / "progs" / "my_norm.yaml").resolve())
    assert i.name == "scaled_exp" and i.inputs == {"X": (8, 16)} and i.dtype == "float32"
    assert len(i.build().ops_of("exp")) == 1
    # every other section at its default
    assert job.search.limits() == Limits()
    assert (job.tuning.trials_per_structure, job.tuning.sampler) == (30, "auto")
    assert job.tuning.time_budget_s is None and job.devices == ("cpu",)
    assert (job.cluster.address, job.cluster.workers) == (None, 1)
    assert job.database.url == "sqlite:///./tuner.db"


def test_sqlite_default_matches_db_and_validation_creates_no_database(tmp_path: Path) -> None:
    from db import DEFAULT_URL
    from tuner.jobfile import DatabaseSpec

    assert DatabaseSpec().url == DEFAULT_URL
    db_file = tmp_path / "jobs.db"
    job = parse_job(f"programs: [lora]\ndatabase: {{url: 'sqlite:///{db_file}'}}\n", "j.yaml")
    assert job.database.url == f"sqlite:///{db_file}" and not db_file.exists()
    assert type(job.tuning.make_sampler()).__name__ == "TPESampler"


def test_sections_map_onto_limits_and_samplers() -> None:
    job = parse_job(textwrap.dedent("""\
        programs: [softmax_rows]
        search:
          max_kernel_ops: 2
          max_block_ops: 6
          max_block_inputs: 2
          max_grid_dims: 3
          kernel_ops: [exp, sum]
          block_ops: [exp, sum, div, accum]
          time_limit_s: 12.5
          partition_above: 9
          max_piece_ops: 3
        tuning: {trials_per_structure: 4, time_budget_s: 30, sampler: GRID, seed: 7}
        devices: [cpu, cuda:1]
        cluster: {address: auto, workers: 3}
        database: postgresql://tuner@db:5432/tuner
        """), "job.yaml")
    assert job.search.limits() == Limits(max_kernel_ops=2, max_block_ops=6, max_block_inputs=2,
                                         max_grid_dims=3, kernel_ops=("exp", "sum"),
                                         block_ops=("exp", "sum", "div", "accum"),
                                         time_limit_s=12.5, partition_above=9,
                                         max_piece_ops=3)
    assert job.tuning.sampler == "grid" and job.tuning.seed == 7
    assert type(job.tuning.make_sampler()).__name__ == "BruteForceSampler"
    assert job.devices == ("cpu", "cuda:1")
    assert (job.cluster.address, job.cluster.workers) == ("auto", 3)
    assert job.database.url == "postgresql://tuner@db:5432/tuner"
    assert isinstance(job, JobSpec)


def test_the_schema_in_docs_loads_as_written(tmp_path: Path) -> None:
    """docs/job-file.md's full example, nulls included, is a valid job at the defaults it
    names (``max_block_inputs: null`` and ``partition_above`` once were refused)."""
    doc = (ROOT / "docs" / "job-file.md").read_text()
    example = doc.split("```yaml\n", 1)[1].split("```", 1)[0]
    (tmp_path / "programs").mkdir()
    write(tmp_path, PROGRAM_FILE, "programs/my_norm.yaml")
    job = load_job(write(tmp_path, example))
    assert job.search.limits() == Limits()
    assert job.search.max_block_inputs is None and job.search.time_limit_s is None
    assert job.tuning.time_budget_s is None and job.tuning.trial_timeout_s == 60
    assert job.tuning.seed is None and job.cluster.address is None
    assert parse_job("programs: [lora]\nsearch: {partition_above: null}\n",
                     "j.yaml").search.partition_above is None


@pytest.mark.parametrize("text,line,key,fragment", MALFORMED,
                         ids=[f"{m[2]}-{i}" for i, m in enumerate(MALFORMED)])
def test_malformed_job_gives_one_line_error(tmp_path: Path, text: str, line: int, key: str,
                                            fragment: str) -> None:
    path = write(tmp_path, text, "bad.yaml")
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(JobError) as info:
        load_job(path)
    err = info.value
    message = str(err)
    assert "\n" not in message
    assert (err.file, err.line, err.key) == (str(path), line, key)
    assert message.startswith(f"{path}:{line}: {key}: ")
    assert fragment in message
    assert "; " in err.reason  # what is wrong; how to fix
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written


def test_inline_program_body_error_points_into_job_file() -> None:
    text = textwrap.dedent("""\
        programs:
          - softmax_rows
          - program:
              name: broken
              dtype: float32
              inputs:
                X: [4, 8]
              body: |
                Y = exp(X)
                Z = Y @ Y
              outputs: [Z]
        """)
    with pytest.raises(JobError) as info:
        parse_job(text, "job.yaml")
    err = info.value
    assert (err.line, err.key) == (10, "programs[1].program.body")
    assert str(err).startswith("job.yaml:10: programs[1].program.body: matmul")
    # a key error inside the inline program names that key's line
    bad_key = text.replace("    outputs: [Z]", "    outputz: [Z]")
    with pytest.raises(JobError) as info:
        parse_job(bad_key, "job.yaml")
    assert (info.value.line, info.value.key) == (11, "programs[1].program.outputz")


def test_program_file_error_is_reported_at_the_job_entry(tmp_path: Path) -> None:
    write(tmp_path, PROGRAM_FILE.replace("rms_norm(X)", "frobnicate(X)"), "bad_prog.yaml")
    path = write(tmp_path, "programs:\n  - lora\n  - file: bad_prog.yaml\n")
    with pytest.raises(JobError) as info:
        load_job(path)
    err = info.value
    assert (err.line, err.key) == (3, "programs[1].file")
    assert f"{tmp_path / 'bad_prog.yaml'}:7: unknown op 'frobnicate'" in str(err)


def test_unreadable_job_file(tmp_path: Path) -> None:
    with pytest.raises(JobError) as info:
        load_job(tmp_path / "missing.yaml")
    assert info.value.line is None and "cannot read the job file" in str(info.value)


def test_a_device_refused_at_launch_is_an_error_at_its_line(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Whether this machine has the GPU a job lists is checked after validation (by the
    launch); its refusal names the file, the line of the devices entry and the key, like
    every other job-file error, exits 2 and creates no database."""
    from support import one_line_error

    from kernels import cuda_available
    from tuner import cli
    from tuner.pipeline import check_devices

    ok, why = cuda_available()
    if ok:
        pytest.skip("this machine has a usable GPU: a cuda device is not refused")
    listed = write(tmp_path, "programs: [lora]\ndevices:\n  - cpu\n  - cuda\n", "listed.yaml")
    scalar = write(tmp_path, "programs: [lora]\n\ndevices: cuda:0\n", "scalar.yaml")
    for path, line, key, dev in ((listed, 4, "devices[1]", "cuda"),
                                 (scalar, 3, "devices", "cuda:0")):
        with pytest.raises(JobError) as info:
            check_devices(load_job(path))
        assert (info.value.file, info.value.line, info.value.key) == (str(path), line, key)
        reason = f"{dev}: the cuda device is unavailable ({why}); use 'devices: [cpu]'"
        assert str(info.value).startswith(" ".join(f"{path}:{line}: {key}: {reason}".split()))
    database = tmp_path / "tuner.db"
    assert cli.main(["launch", str(listed), "--db", f"sqlite:///{database}"]) == 2
    err = one_line_error(capsys.readouterr().err, "launch")
    assert err.startswith(f"tuner launch: error: {listed}:4: devices[1]: cuda: the cuda "
                          "device is unavailable (")
    assert not database.exists()
    # a cluster's GPUs are checked once Ray is joined: check_cluster_gpus, same error
    assert check_devices(load_job(listed), address="ray://head:10001") is None
