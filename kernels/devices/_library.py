"""The library path as a kernel: a program's reference graph run op by op by the device's
library (numpy, so BLAS for every matmul, on a cpu; CuPy on a GPU).

This is what every speedup is measured against (the launch's ``baseline_s``), and a
candidate of every launch: where it is faster than every tuned kernel, the best row says
``library`` and ``tuner.load`` returns this callable.  It runs the verifier's float
interpreter (``verifier.run``) over the device's arithmetic, the same code that times the
baseline, with the calling convention of a compiled kernel: positional arrays in, a list of
outputs back, ``out=`` to write into arrays the caller owns.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from kernels.device_names import device_kind
from search.ir import KernelGraph, format_graph
from verifier import FloatArith, run

from ._cpu import fits_shape
from ._storage import from_storage, to_storage

#: ``verification.verdict`` of the structure row that stands for the library path, and the
#: prefix of its ``structure_hash`` (``library:`` + the reference's hash; the reference itself,
#: compiled a kernel per op, is stored under its own hash with verdict ``reference``).
LIBRARY = "library"


class LibraryKernel:
    """``kernel(*inputs, out=None) -> [outputs]``: the reference graph op by op.

    On a cpu inputs are numpy arrays, torch CPU tensors or DLPack arrays of the program's dtype
    (bfloat16 numpy arrays as uint16 bits, as the C++ kernels take them; run in float32);
    outputs are new arrays of the program's dtype (torch tensors when the first input is one)
    or, with ``out=``, the caller's arrays, filled.
    On a GPU (``xp`` is CuPy) inputs and outputs are CuPy arrays."""

    def __init__(self, graph: KernelGraph, name: str = "library", *, arith: Any = None,
                 xp: Any = np) -> None:
        if graph.symbols():
            raise ValueError(f"{name}: the library path runs a concrete reference graph, "
                             f"this one has symbols {sorted(graph.symbols())}")
        self.graph, self.name = graph, name
        self.arith = arith if arith is not None else FloatArith()
        self.xp = xp
        self._layouts = [graph.input_layout(t) for t in graph.input_ids]
        # a transposed input is passed as stored (the compiled kernel's convention) and read
        # back through a view
        self._in_shapes = [(*s[:-2], s[-1], s[-2]) if lay == "transposed" else s for s, lay in
                           zip([tuple(int(d) for d in s) for s in graph.input_shapes()],
                               self._layouts, strict=True)]
        self._out_shapes = [tuple(int(d) for d in graph.tensors[t].shape)
                            for t in graph.output_ids]
        self.dtype = graph.tensors[graph.input_ids[0]].dtype if graph.input_ids else "float32"

    def __call__(self, *inputs: Any, out: Any = None, outputs: Any = None) -> list:
        out = out if out is not None else outputs
        if len(inputs) != len(self._in_shapes):
            raise ValueError(f"{self.name}: expected {len(self._in_shapes)} inputs, "
                             f"got {len(inputs)}")
        xs = [self._array(x, s, i) for i, (x, s) in enumerate(
            zip(inputs, self._in_shapes, strict=True))]
        xs = [self.xp.swapaxes(x, -1, -2) if lay == "transposed" else x
              for x, lay in zip(xs, self._layouts, strict=True)]
        results = run(self.graph, xs, self.arith)
        if out is None:
            torch_like = type(inputs[0]).__module__ == "torch"
            return [self._wrap(r, torch_like) for r in results]
        outs = [out] if len(self._out_shapes) == 1 and not isinstance(out, list | tuple) \
            else list(out)
        if len(outs) != len(self._out_shapes):
            raise ValueError(f"{self.name}: out= needs {len(self._out_shapes)} arrays")
        for o, r, shape in zip(outs, results, self._out_shapes, strict=True):
            if tuple(o.shape) != shape:
                raise ValueError(f"{self.name}: out= array has shape {tuple(o.shape)}, "
                                 f"expected {shape}")
            if type(o).__module__ == "torch":
                import torch

                o.copy_(torch.from_numpy(np.ascontiguousarray(r, np.float32)))
            else:
                o[...] = to_storage(r, self.dtype) if o.dtype == np.uint16 else r
        return outs

    def _array(self, x: Any, shape: Sequence[int], i: int) -> Any:
        if self.xp is np:
            if type(x).__module__ == "torch":
                x = x.detach().cpu().float().numpy()
            elif not isinstance(x, np.ndarray) and hasattr(x, "__dlpack__"):
                x = np.from_dlpack(x)
            a = from_storage(x, self.dtype) if getattr(x, "dtype", None) == np.uint16 \
                and self.dtype == "bfloat16" else np.asarray(x, np.float32)
        else:
            a = self.xp.asarray(x, self.xp.float32)
        if tuple(a.shape) != tuple(shape) and fits_shape(tuple(a.shape), tuple(shape)):
            a = a.reshape(tuple(shape))  # extra leading dims of size 1, as the kernels allow
        if tuple(a.shape) != tuple(shape):
            raise ValueError(f"{self.name}: input {i} has shape {tuple(a.shape)}, expected "
                             f"{tuple(shape)}")
        return a

    def _wrap(self, r: Any, torch_like: bool) -> Any:
        if self.xp is not np:
            return self.xp.ascontiguousarray(r, self.xp.float32)
        a = np.ascontiguousarray(r, np.float32)
        if torch_like:
            import torch  # the caller already has it loaded

            return torch.from_numpy(a).to(getattr(torch, self.dtype))
        return to_storage(a, self.dtype)


def library_kernel(graph: KernelGraph, kind: str = "cpu", name: str = "library"
                   ) -> LibraryKernel:
    """The library path of ``graph`` on a ``cpu`` (numpy) or ``cuda`` (CuPy) device (``kind``:
    a device name or key)."""
    if device_kind(kind) == "cuda":
        import cupy as cp

        from ._cuda import cupy_arith

        return LibraryKernel(graph, name, arith=cupy_arith(cp), xp=cp)
    return LibraryKernel(graph, name)


def library_source(graph: KernelGraph, program: str = "program") -> str:
    """What a best row of the library path stores as its source: what runs, in words, then
    the reference graph it runs (``tuner best --source`` prints it)."""
    return (f"# {program}: the library path, no generated kernel.\n"
            "# The reference graph below runs op by op through the device's library (numpy,\n"
            "# so BLAS for every matmul, on a cpu; CuPy on a GPU) by the verifier's float\n"
            "# interpreter; it was faster than every tuned kernel on this device.\n"
            + format_graph(graph) + "\n")
