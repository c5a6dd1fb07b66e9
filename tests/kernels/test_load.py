"""A checked cpu kernel called in this process (``Device.load``, what ``tuner.load`` returns):
numpy arrays, DLPack arrays and torch tensors in place, ``out=``, clear errors; half-precision
programs take and give arrays of their dtype as they are."""

from __future__ import annotations

import dataclasses
import sys
import warnings

import numpy as np
import pytest

from kernels import get_device, random_inputs
from kernels.devices import from_storage, reference, to_storage, tolerance
from search import handwritten, load_program


@pytest.fixture(scope="module")
def loaded():
    program = load_program("softmax_rows", {"rows": 32, "cols": 64})
    cpu = get_device("cpu")
    plan = cpu.lower(handwritten(program), None, "sm")
    res = cpu.check(plan, program.build())
    assert res.ok, res.message
    xs = random_inputs(program.build(), seed=3)
    return cpu.load(plan, res.source), xs, reference(program.build(), xs)[0]


class DLPackOnly:
    """An array that offers nothing but the DLPack protocol."""

    def __init__(self, a: np.ndarray) -> None:
        self.a = a

    def __dlpack__(self, **kwargs):
        return self.a.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


def test_numpy_in_and_out(loaded):
    kernel, (x,), want = loaded
    (y,) = kernel(x)
    np.testing.assert_allclose(y, want, rtol=1e-5)
    out = np.full_like(x, np.nan)
    assert kernel(x, out=out)[0] is out
    np.testing.assert_allclose(out, want, rtol=1e-5)
    x2 = x * 2  # a new array at a new address: the identity fast path must not reuse the old
    np.testing.assert_allclose(kernel(x2, out=out)[0], reference(
        load_program("softmax_rows", {"rows": 32, "cols": 64}).build(), [x2])[0], rtol=1e-5)


def test_dlpack_and_converted_inputs(loaded):
    kernel, (x,), want = loaded
    np.testing.assert_allclose(kernel(DLPackOnly(x))[0], want, rtol=1e-5)
    with pytest.warns(UserWarning, match="converted to the program's float32 on every call"):
        np.testing.assert_allclose(kernel(x.astype(np.float64))[0], want, rtol=1e-5)
    np.testing.assert_allclose(kernel(np.asfortranarray(x))[0], want, rtol=1e-5)


def test_bad_calls_say_what_and_how(loaded):
    kernel, (x,), _ = loaded
    with pytest.raises(ValueError, match="expected 1 inputs, got 2"):
        kernel(x, x)
    with pytest.raises(ValueError, match=r"input 0 has shape \(64, 32\), expected \(32, 64\)"):
        kernel(x.T.copy())
    with pytest.raises(ValueError, match="output 0 must be a C-contiguous, writable float32"):
        kernel(x, out=np.empty((32, 64), np.float64))


def test_torch_tensors_in_place_and_resized():
    torch = pytest.importorskip("torch", reason="torch is the bench extra")
    program = load_program("softmax_rows", {"rows": 32, "cols": 64})
    cpu = get_device("cpu")
    plan = cpu.lower(handwritten(program), None, "sm")
    kernel = cpu.load(plan, cpu.render(plan))
    x = torch.from_numpy(random_inputs(program.build())[0])
    (y,) = kernel(x)
    assert isinstance(y, torch.Tensor)
    want = reference(program.build(), [x.numpy()])[0]
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-5)
    out = torch.empty(32, 64)
    kernel(x, out=out)
    out.resize_(64, 64)  # same object, new storage: must not be written at the old address
    with pytest.raises(ValueError, match="output 0 must be a contiguous float32 CPU tensor"):
        kernel(x, out=out)


@pytest.fixture(scope="module", params=["float16", "bfloat16"])
def half(request):
    """softmax_rows and a matmul program built as a half program: (dtype, [(kernel, inputs
    rounded to the dtype as float32, float64 reference)])."""
    cpu = get_device("cpu")
    out = []
    for name, shapes in (("softmax_rows", {"rows": 32, "cols": 64}),
                         ("rmsnorm_matmul", {"X": "4x256", "W": "256x128"})):
        program = dataclasses.replace(load_program(name, shapes), dtype=request.param)
        plan = cpu.lower(handwritten(program), None, name)
        assert [b.dtype for b in (*plan.inputs, *plan.outputs)] == \
            [request.param] * (len(plan.inputs) + len(plan.outputs))
        res = cpu.check(plan, program.build())
        assert res.ok, res.message
        xs = [from_storage(to_storage(x, request.param), request.param)
              for x in random_inputs(program.build(), seed=5)]
        out.append((cpu.load(plan, res.source), xs, reference(program.build(), xs)))
    return request.param, out


def test_half_programs_take_numpy_arrays_of_their_dtype_without_a_copy(half):
    dtype, kernels = half
    rtol, _ = tolerance(dtype)
    for kernel, xs, want in kernels:
        stored = [to_storage(x, dtype) for x in xs]  # float16, or bfloat16 as uint16 bits
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # arrays of the program's dtype: nothing converted
            (y,) = kernel(*stored)
            assert y.dtype == stored[0].dtype and y.shape == want[0].shape
            kernel(*stored, out=[y])
        scale = float(np.max(np.abs(want[0])))
        np.testing.assert_allclose(from_storage(y, dtype), want[0], rtol=rtol,
                                   atol=rtol * scale)
        # float32 arrays are converted on every call, and the first call says so
        kernel.warned = False
        with pytest.warns(UserWarning, match=f"converted to the program's {dtype} on every"):
            (y32,) = kernel(*xs)
        np.testing.assert_array_equal(y32, y)
        # Mirage's scripts pass a (1, 1, n) tensor for a (1, n) input: the same elements
        lead = [a.reshape(1, *a.shape) for a in stored]
        np.testing.assert_array_equal(kernel(*lead)[0], y)
        with pytest.raises(ValueError, match=f"output 0 must be a C-contiguous, writable "
                                             f".* array of shape .* \\(the program's {dtype}\\)"):
            kernel(*stored, out=[np.empty(want[0].shape, np.float32)])


def test_half_programs_take_torch_tensors_of_their_dtype_in_place(half):
    torch = pytest.importorskip("torch", reason="torch is the bench extra")
    dtype, kernels = half
    for kernel, xs, want in kernels:
        ts = [torch.from_numpy(x).to(getattr(torch, dtype)) for x in xs]
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            (y,) = kernel(*ts)
        assert y.dtype == getattr(torch, dtype)
        out = torch.full_like(y, float("nan"))
        kernel(*ts, out=out)
        assert torch.equal(out, y)
        rtol, _ = tolerance(dtype)
        np.testing.assert_allclose(y.float().numpy(), want[0], rtol=rtol,
                                   atol=rtol * float(np.max(np.abs(want[0]))))
        # float32 tensors are converted (by torch) on every call, rounded as numpy arrays are
        kernel.warned = False
        with pytest.warns(UserWarning, match=f"converted to the program's {dtype} on every"):
            (y32,) = kernel(*(torch.from_numpy(x) for x in xs))
        assert torch.equal(y32, y)
        kernel.warned = True
        (from_numpy,) = kernel(*xs)  # float32 arrays, converted by numpy (``to_storage``)
        got = torch.from_numpy(from_numpy)
        assert torch.equal(y32, got.view(torch.bfloat16) if dtype == "bfloat16" else got)
        assert torch.equal(kernel(*(torch.from_numpy(x).double() for x in xs))[0], y)


def test_the_library_path_of_a_half_program_speaks_its_dtype(half):
    """Where the library path (numpy op by op) won, ``tuner.load`` returns it: the same
    arrays in and out as the C++ kernel's."""
    from kernels import library_kernel

    dtype, _ = half
    program = dataclasses.replace(load_program("softmax_rows", {"rows": 8, "cols": 16}),
                                  dtype=dtype)
    lib = library_kernel(program.build(), "cpu")
    x = random_inputs(program.build(), seed=1)[0]
    (y,) = lib(to_storage(x, dtype))
    assert y.dtype == to_storage(x, dtype).dtype
    want = reference(program.build(), [from_storage(to_storage(x, dtype), dtype)])[0]
    rtol, _ = tolerance(dtype)
    np.testing.assert_allclose(from_storage(y, dtype), want, rtol=rtol, atol=rtol)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_float32_array_converts_to_the_same_bits_with_torch_loaded_or_not(dtype, monkeypatch):
    """Where the process has torch, numpy arrays of another dtype are converted by torch
    (numpy's float16 cast is scalar: 163 us against 6 us for 256x256); the bits are those
    of ``to_storage``'s round to nearest even, ties, overflow, subnormals and signed zeros
    included."""
    pytest.importorskip("torch", reason="torch is the bench extra")
    from kernels.devices._cpu import _converted

    rng = np.random.default_rng(0)
    ties = np.array([1 + 2.0 ** -11, 1 + 3 * 2.0 ** -11, 1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8])
    edge = [65504.0, 65520.0, 1e5, 3.4e38, 1e-8, 6e-8, -0.0, 0.0, np.inf, -np.inf]
    values = np.concatenate([rng.normal(0, 100, 4000), ties, -ties, edge]).astype(np.float32)
    x = np.zeros(2 * len(values), np.float32)[::2]  # a strided view: converted all the same
    x[:] = values
    with np.errstate(over="ignore"):  # numpy says so of 65520 and above: inf, as wanted
        want = to_storage(x, dtype)
    got = _converted(x, dtype)
    assert got.dtype == want.dtype and got.flags.c_contiguous
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
    x.flags.writeable = False  # torch.from_numpy warns of a read-only array: it is copied
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_array_equal(_converted(x, dtype).view(np.uint16),
                                      want.view(np.uint16))
    monkeypatch.delitem(sys.modules, "torch")  # a process without torch
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(_converted(x, dtype).view(np.uint16),
                                      want.view(np.uint16))
