"""PyTorch in: model blocks as their authors write them, compiled with ``backend="tuner"``.

Each block's outputs equal eager's; the report says which ATen ops were captured into which
programs and why the rest fell back.  Coverage follows the op table: a block is asserted
captured whole when ``search.OPS`` holds every op its translation needs, and otherwise its
uncaptured ops must say which op the table lacks (so these tests tighten by themselves when
ops are added).  Kernels are tuned for two small blocks (``tune="now"``, a temporary database
per module); every other block runs with no kernel and must fall back, never error.
"""

from __future__ import annotations

import importlib.util
import re
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import tuner  # noqa: E402
import tuner.pytorch as tp  # noqa: E402
from search import OPS, parse_program  # noqa: E402
from tuner.jobfile import load_job  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("torch_blocks", REPO / "examples/torch_blocks.py")
blocks = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
_spec.loader.exec_module(blocks)  # type: ignore[union-attr]

# the op-table ops each block's translation needs, beyond matmul, the pointwise ops and sums
NEEDS = {"rmsnorm": {"add_scalar", "rsqrt"}, "llama_mlp": set(),
         "llama_mlp_layer": {"add_scalar", "rsqrt"},
         "gpt2_mlp": {"add_scalar", "tanh"}, "attention": set(),
         "layernorm": {"add_scalar", "rsqrt"}, "residual_rmsnorm": {"add_scalar", "rsqrt"}}
TOL = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 5e-2}


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> str:
    return f"sqlite:///{tmp_path_factory.mktemp('torchdb') / 'tuner.db'}"


def _close(got: object, want: object, dtype: torch.dtype) -> None:
    gots = got if isinstance(got, tuple) else (got,)
    wants = want if isinstance(want, tuple) else (want,)
    for g, w in zip(gots, wants, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        scale = max(1.0, float(w.float().abs().max()))
        err = float((g.float() - w.float()).abs().max())
        assert err <= TOL[dtype] * scale, f"max |error| {err} (scale {scale})"


def _assert_coverage(name: str, report: tp.Report) -> None:
    assert report.total > 0
    if NEEDS[name] <= set(OPS):
        assert report.captured == report.total, str(report)
        assert len(report.regions) >= 1
    else:
        missing = NEEDS[name] - set(OPS)
        assert report.uncaptured, str(report)
        for _op, why in report.uncaptured:
            assert any(f"op {m} not in the op table" in why for m in missing), str(report)


@pytest.mark.parametrize("name", blocks.BLOCKS)
def test_every_block_runs_without_a_kernel_and_says_why(name: str, tmp_path: Path) -> None:
    """No database at all: every region falls back, outputs equal eager, the report is whole."""
    model, args = blocks.block(name, hidden=64, rows=4)
    with torch.no_grad():
        compiled = tuner.compile(model, db=f"sqlite:///{tmp_path / 'none.db'}",
                                 fallback="eager")
        _close(compiled(*args), model(*args), torch.float32)
    report = compiled.report()
    _assert_coverage(name, report)
    assert not report.kernels and all(r.reason for r in report.fallbacks)
    assert all("\n" not in why for _op, why in report.uncaptured)
    assert f"of {report.total} ATen ops captured" in str(report)


def test_a_decoder_layers_mlp_half_is_cut_where_the_down_projection_starts(
        tmp_path: Path) -> None:
    """RMSNorm, gate, up and SwiGLU (10 µGraph ops) are one program and the down projection
    with the residual add another: regions end where a matmul would contract the result of
    one streaming a weight (search.costly_contraction), not at the 8th op, which put the gate
    and the up projection in two programs that each lost to PyTorch; max_ops still bounds a
    region.  (Hidden 512: 2 MB weights; the cut is for weights of 1 MiB or more.)"""
    model, args = blocks.block("llama_mlp_layer", hidden=512, rows=4)
    with torch.no_grad():
        compiled = tuner.compile(model, db=f"sqlite:///{tmp_path / 'none.db'}",
                                 fallback="eager")
        _close(compiled(*args), model(*args), torch.float32)
        small = tuner.compile(model, db=f"sqlite:///{tmp_path / 'none.db'}",
                              fallback="eager", max_ops=8)
        _close(small(*args), model(*args), torch.float32)
    assert compiled.report().captured == compiled.report().total
    assert [r.ops for r in compiled.report().regions] == [10, 2]
    assert [r.ops for r in small.report().regions] == [8, 2, 2]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_blocks_fall_back_through_inductor(dtype: torch.dtype, url: str) -> None:
    model, args = blocks.block("gpt2_mlp", hidden=64, rows=4, dtype=dtype)
    with torch.no_grad():
        compiled = tuner.compile(model, db=url)
        _close(compiled(*args), model(*args), dtype)


@pytest.mark.parametrize("name,dtype", [("rmsnorm", torch.float32),
                                        ("residual_rmsnorm", torch.bfloat16)])
def test_tuned_now_the_block_runs_as_kernels(name: str, dtype: torch.dtype, url: str) -> None:
    """tune="now" searches and tunes every captured region here, stores it, runs it as a
    kernel; a second compile with the default tune="cached" finds the same programs.  A graph
    that is all kernels under no_grad is called directly (no AOT wrappers, no dispatcher).
    (The race against PyTorch's ops is off: these kernels are asserted used, whatever a
    loaded machine's timings say; test_a_kernel_slower_than_pytorch_is_not_used has it.)"""
    model, args = blocks.block(name, hidden=64, rows=4, dtype=dtype)
    opts = {"db": url, "budget_s": 30, "trials": 4, "structures": 1, "fallback": "eager",
            "race": False}
    with torch.no_grad():
        compiled = tuner.compile(model, tune="now", **opts)
        _close(compiled(*args), model(*args), dtype)
    report = compiled.report()
    _assert_coverage(name, report)
    assert report.regions and not report.fallbacks, str(report)
    with torch.no_grad():
        again = tuner.compile(model, **{**opts, "fallback": "inductor"})
        _close(again(*args), model(*args), dtype)
    assert [r.program for r in again.report().kernels] == [r.program for r in report.kernels]
    assert [g.path for g in again.report().graphs] == ["direct"], str(again.report())
    assert "runs directly" in str(again.report())
    other = blocks.block(name, hidden=64, rows=4, dtype=dtype, seed=1)[1]  # new inputs
    with torch.no_grad():
        _close(again(*other), model(*other), dtype)
    # the report's program name is enough to query the database (no program file exists)
    from tuner.cli import main

    program = report.kernels[0].program
    assert main(["best", program, "--db", url]) == 0
    assert tuner.best(program, url=url) is not None
    assert main(["best", "torch_000000000000", "--db", url]) == 2
    assert main(["best", program, "--set", "I0=3x5", "--db", url]) == 2  # not stored there


def test_under_autograd_the_kernels_stay_inside_aot(url: str) -> None:
    """With gradients wanted the direct path is not taken: outputs and gradients equal
    eager's (the forward graph's regions are other programs: they fall back or run as
    ``tuner::kernel`` ops inside AOT-autograd's graph)."""
    model, args = blocks.block("rmsnorm", hidden=64, rows=4)
    x = args[0].clone().requires_grad_(True)
    compiled = tuner.compile(model, db=url, fallback="eager", race=False)
    got = compiled(x)
    got.square().sum().backward()
    grad = x.grad.clone()
    x.grad = None
    want = model(x)
    want.square().sum().backward()
    _close(got.detach(), want.detach(), torch.float32)
    _close(grad, x.grad, torch.float32)
    assert all(g.path != "direct" for g in compiled.report().graphs), str(compiled.report())


def test_a_graph_without_kernels_is_the_fallbacks_own(tmp_path: Path) -> None:
    """Nothing to run as a kernel: the graph goes to Inductor as ``torch.compile`` would
    give it (no AOT graph of ours around it), and the report says so."""
    model, args = blocks.block("layernorm", hidden=64, rows=4)
    with torch.no_grad():
        compiled = tuner.compile(model, db=f"sqlite:///{tmp_path / 'e.db'}")
        _close(compiled(*args), model(*args), torch.float32)
    assert [g.path for g in compiled.report().graphs] == ["inductor"]
    assert "runs through Inductor" in str(compiled.report())


def test_a_kernel_slower_than_pytorch_is_not_used(caplog: pytest.LogCaptureFixture) -> None:
    """The race before use: a region's ATen ops as a function equal the region, and a kernel
    slower than them is refused, with both times in the reason."""
    import time

    from torch.fx.experimental.proxy_tensor import make_fx

    from tuner.pytorch.backend import _race
    from tuner.pytorch.race import region_function
    from tuner.pytorch.regions import partition

    x = torch.randn(4, 32)
    gm = make_fx(lambda x: torch.exp(x * 2.0) + 1.0)(x)
    (region,) = partition(gm.graph).regions
    fn, inputs = region_function(region.nodes)
    assert len(inputs) == 1
    torch.testing.assert_close(fn(x)[0], torch.exp(x * 2.0) + 1.0)

    def slow(*xs: object) -> None:  # a stand-in kernel that takes 20 ms
        time.sleep(2e-2)

    entry = tp.RegionReport("p", [], 2, "fallback")
    with caplog.at_level("DEBUG", logger="tuner.pytorch"):
        why = _race(slow, region, [(4, 32)], "float32", entry)
    assert why.startswith("PyTorch's own ops ran the region faster here"), caplog.text
    assert entry.kernel_us is not None and entry.kernel_us >= 20000 > entry.torch_us


def test_tune_job_writes_a_launchable_job(tmp_path: Path) -> None:
    model, args = blocks.block("llama_mlp", hidden=64, rows=4)
    job = tmp_path / "jobs" / "torch_job.yaml"
    with torch.no_grad():
        compiled = tuner.compile(model, tune="job", job_file=str(job),
                                 db=f"sqlite:///{tmp_path / 't.db'}", fallback="eager")
        _close(compiled(*args), model(*args), torch.float32)
    report = compiled.report()
    spec = load_job(job)  # what `tuner launch` reads
    names = {e.name for e in spec.programs}
    assert names == {r.program for r in report.regions} and names
    for r in report.regions:
        assert str(job) in r.reason
        program = parse_program((job.parent / f"{r.program}.yaml").read_text())
        assert program.name == r.program


def test_the_backend_is_registered_as_tuner(tmp_path: Path) -> None:
    """The entry point pip installs (pyproject), and `torch.compile(backend="tuner")`."""
    text = (REPO / "pyproject.toml").read_text()
    found = re.search(r'^\[project\.entry-points\.torch_dynamo_backends\]\ntuner = "([^"]+)"',
                      text, re.M)
    assert found, "pyproject.toml: the torch_dynamo_backends entry point is missing"
    value = found.group(1)
    assert EntryPoint("tuner", value, "torch_dynamo_backends").load() is tp.backend
    installed = [e for e in entry_points(group="torch_dynamo_backends") if e.name == "tuner"]
    assert all(e.value == value for e in installed)  # an install of this checkout agrees
    tp.register()
    model, args = blocks.block("rmsnorm", hidden=32, rows=2)
    with torch.no_grad():
        compiled = torch.compile(model, backend="tuner", dynamic=False,
                                 options={"db": f"sqlite:///{tmp_path / 'x.db'}"})
        _close(compiled(*args), model(*args), torch.float32)
    assert tp.last_report().total > 0


def test_a_graph_of_symbolic_shapes_falls_back_whole(tmp_path: Path) -> None:
    """Kernels are tuned at fixed shapes: a graph Dynamo made for many shapes runs through
    the fallback, and the report says why and what to do."""
    tp.register()
    model, args = blocks.block("rmsnorm", hidden=32, rows=3)
    with torch.no_grad():
        compiled = torch.compile(model, backend="tuner", dynamic=True,
                                 options={"db": f"sqlite:///{tmp_path / 'x.db'}"})
        _close(compiled(*args), model(*args), torch.float32)
    (graph,) = tp.last_report().graphs
    assert not graph.regions and "dynamic=False" in graph.uncaptured[0][1]


def test_bad_options_are_refused_at_once() -> None:
    with pytest.raises(ValueError, match="tune='later'"):
        tuner.compile(torch.nn.Identity(), tune="later")
    with pytest.raises(TypeError, match="unknown option"):
        tuner.compile(torch.nn.Identity(), budget=3)


def test_a_transformers_llama_layer(tmp_path: Path) -> None:
    """A model nobody here wrote: its outputs equal eager's; RoPE (cat, slices) falls back."""
    transformers = pytest.importorskip("transformers", reason="pip install transformers "
                                       "(the dev extra) to compile a real Llama layer")
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128,
                                   num_attention_heads=4, num_key_value_heads=2,
                                   num_hidden_layers=1, vocab_size=128)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    layer, rope = LlamaDecoderLayer(cfg, 0).eval(), LlamaRotaryEmbedding(cfg)
    x = torch.randn(1, 6, 64)
    with torch.no_grad():
        pos = rope(x, torch.arange(6)[None])
        want = layer(x, position_embeddings=pos, attention_mask=None)
        compiled = tuner.compile(layer, db=f"sqlite:///{tmp_path / 'l.db'}", fallback="eager")
        got = compiled(x, position_embeddings=pos, attention_mask=None)
    want = want[0] if isinstance(want, tuple) else want
    got = got[0] if isinstance(got, tuple) else got
    _close(got, want, torch.float32)
    report = compiled.report()
    assert 0 < report.captured < report.total, str(report)
    assert any(op.startswith("cat") for op, _ in report.uncaptured), str(report)


def test_a_kernel_that_fails_its_check_is_never_used(url: str) -> None:
    """The check before use: a real tuned kernel, of another region of the same shapes
    (``exp(2x)`` standing in for ``exp(3x)``), is refused with a reason."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from tuner.pytorch.backend import check_kernel, program_of
    from tuner.pytorch.regions import partition

    def region(c: float) -> object:
        gm = make_fx(lambda x: torch.exp(x * c))(torch.randn(4, 32))
        (r,) = partition(gm.graph).regions
        return r.emitted

    two, three = region(2.0), region(3.0)
    with torch.no_grad():
        compiled = tuner.compile(lambda x: torch.exp(x * 2.0), tune="now", db=url, budget_s=30,
                                 trials=4, structures=1, fallback="eager", race=False)
        compiled(torch.randn(4, 32))
    assert compiled.report().kernels, str(compiled.report())
    kernel = tuner.load(program_of(two), device="cpu", url=url)  # type: ignore[arg-type]
    assert check_kernel(kernel, two) == ""  # type: ignore[arg-type]
    assert "failed its check" in check_kernel(kernel, three)  # type: ignore[arg-type]


def test_a_region_undefined_on_normal_inputs_is_checked_on_positive_ones(url: str) -> None:
    """A region fed a square computed elsewhere (a norm's mean of x² in the next region)
    gives rsqrt of a negative mean on N(0, 1) inputs: the check draws positive inputs
    instead, as the launch's checks do, and the kernel is used (it was refused as "failed
    its check against the float64 reference")."""
    def norm_rest(sq: torch.Tensor) -> torch.Tensor:
        return torch.rsqrt(sq.mean(-1, keepdim=True) + 1e-6) * sq

    sq = torch.rand(4, 64) + 0.5
    with torch.no_grad():
        compiled = tuner.compile(norm_rest, tune="now", db=url, budget_s=30, trials=4,
                                 structures=1, fallback="eager", race=False)
        _close(compiled(sq), norm_rest(sq), torch.float32)
    report = compiled.report()
    assert report.kernels and not report.fallbacks, str(report)


def test_tuner_compile_gives_each_shape_its_graph_and_keeps_hooks(tmp_path: Path) -> None:
    """tuner.compile calls a module's forward under Dynamo, but a forward hook added later
    still runs; a second and third shape get static graphs of their own (never the
    symbolic graph Dynamo would make on its own, which could not use a kernel)."""
    class Scaled(torch.nn.Module):  # a code object of its own: Dynamo's cache is per code
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.randn(32))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * x * self.weight

    model = Scaled()
    compiled = tuner.compile(model, db=f"sqlite:///{tmp_path / 'h.db'}", fallback="eager")
    with torch.no_grad():
        for rows in (2, 3, 5, 2):
            x = torch.randn(1, rows, 32)
            _close(compiled(x), model(x), torch.float32)
        seen: list = []
        handle = model.register_forward_hook(lambda m, i, o: seen.append(o.shape))
        _close(compiled(x), model(x), torch.float32)
        handle.remove()
    assert len(seen) == 2  # the compiled call and the eager one
    graphs = compiled.report().graphs
    assert all(not g.uncaptured for g in graphs), str(compiled.report())
    assert len(graphs) == 4  # rows 2, 3 and 5, and the module itself while hooked
