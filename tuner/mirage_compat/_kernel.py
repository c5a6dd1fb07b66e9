"""Mirage's kernel graph: the native ``search.KernelGraph`` builder with Mirage's spellings,
``customized`` kernels, ``superoptimize`` and calling the graph as it stands."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from search import DTYPES, BlockGraph, KernelGraph, ShapeError, Tensor

from ._block import MirageUnsupported

if TYPE_CHECKING:
    from ._superoptimize import Optimized

# Mirage's dtype names; the tuner's dtypes are plain strings.
float16 = "float16"
bfloat16 = "bfloat16"
float32 = "float32"


class KNGraph(KernelGraph):
    """A kernel graph with Mirage's builder spellings, ``superoptimize`` and ``__call__``."""

    def new_input(self, dims: Sequence[int] | None = None, *args: Any,  # type: ignore[override]
                  strides: Sequence[int] | None = None, dtype: str | None = None,
                  name: str | None = None, shape: Sequence[int] | None = None,
                  layout: str | None = None) -> Any:
        """Mirage's ``new_input(dims, strides=None, dtype=float16)`` and the native
        ``new_input(shape, dtype="float16", name=None)``, told apart by the second positional
        argument (a dtype string is native).  Strides are row-major (the default) or, for an
        input, those of the contiguous transpose of its last two dims (layout "transposed",
        e.g. ``strides=(1, 768)`` for dims (768, 3072))."""
        dims = dims if dims is not None else shape
        rest = list(args)
        if rest and isinstance(rest[0], str):  # native: (shape, dtype, name)
            dtype = rest.pop(0)
            name = rest.pop(0) if rest else name
        elif rest:  # Mirage: (dims, strides, dtype)
            strides = rest.pop(0)
            dtype = rest.pop(0) if rest else dtype
        if rest:
            raise TypeError("new_input: too many positional arguments")
        if dims is None:
            raise TypeError("new_input: give dims=(...) (Mirage) or a shape (native)")
        dims = tuple(int(d) for d in dims)
        from_strides = check_strides(dims, strides, transposed_ok=True)
        if layout is not None and strides is not None and layout != from_strides:
            raise ShapeError(f"new_input: layout {layout!r} contradicts strides {strides}")
        layout = layout or from_strides
        dtype = mirage_dtype(dtype if dtype is not None else float16)
        if name is None:
            name = f"I{len(self.input_ids)}"
        return super().new_input(dims, dtype, name, layout=layout)

    def mark_output(self, tensor: Any, strides: Sequence[int] | None = None) -> None:
        check_strides(tuple(int(d) for d in tensor.shape), strides)
        super().mark_output(tensor)

    def rms_norm(self, tensor: Any, normalized_shape: Sequence[int] | None = None,
                 **kw: Any) -> Any:
        """RMS normalisation over the last dim (Mirage's ``normalized_shape`` must name it:
        the tuner's rms_norm has no weight and normalises the last dim only)."""
        if normalized_shape is not None:
            want = tuple(int(d) for d in tensor.shape[-len(tuple(normalized_shape)):])
            if tuple(int(d) for d in normalized_shape) != want or len(want) != 1:
                raise ShapeError(f"rms_norm: normalized_shape {tuple(normalized_shape)} must "
                                 f"be the last dim of {tuple(tensor.shape)}, i.e. "
                                 f"({tensor.shape[-1]},)")
        return self.apply("rms_norm", tensor, **kw)

    def reduction(self, tensor: Any, dim: int) -> Any:
        """Mirage's ``reduction(A, dim)``: the sum over ``dim``, kept with size 1."""
        return self.apply("sum", tensor, int(dim))

    def customized(self, *args: Any) -> list[Tensor]:
        """Mirage's ``customized(inputs, tb_graph)`` (the native ``customized(tb_graph)`` too):
        a kernel running the thread-block graph; returns its outputs, in ``new_output`` order.
        ``inputs`` must be the kernel tensors the block graph's ``new_input`` calls read."""
        if len(args) == 1:
            return self.graph_kernel(args[0])
        if len(args) != 2:
            raise TypeError("customized(inputs, tb_graph): give the input tensors and the "
                            "thread-block graph")
        inputs, tb = list(args[0]), args[1]
        if not isinstance(tb, BlockGraph):
            raise TypeError("customized: the second argument must be a thread-block graph "
                            "(mi.new_threadblock_graph(...))")
        if [t.id for t in inputs] != [t.id for t in tb.sources] or \
                any(t.graph is not self for t in inputs):
            raise ShapeError(
                f"customized: inputs {[str(t) for t in inputs]} must be, in order, the tensors "
                f"of this graph the thread-block graph reads with new_input "
                f"({[str(t) for t in tb.sources]})")
        return self.graph_kernel(tb)

    def concat(self, *args: Any, **kw: Any) -> Tensor:
        raise MirageUnsupported("concat: the op table has no concatenation")

    def reduction_max(self, *args: Any, **kw: Any) -> Tensor:
        raise MirageUnsupported("reduction_max: the op table has no max reduction")

    def clamp(self, *args: Any, **kw: Any) -> Tensor:
        raise MirageUnsupported("clamp: the op table has no clamp")

    # --- Mirage's other kernel-graph calls -------------------------------------------------
    @property
    def cygraph(self) -> KNGraph:
        """Mirage's handle on the C++ graph, passed to ``generate_cuda_program``: the graph."""
        return self

    def get_input_dtensors(self) -> list[Tensor]:
        """Mirage's ``cygraph.get_input_dtensors()``: the input tensors, in order."""
        return [Tensor(self, t) for t in self.input_ids]

    def get_input_dtensor_shape_and_stride(self, tensor: Tensor) -> tuple[tuple, tuple]:
        """(dims, strides) of an input: row-major, the only layout here."""
        dims = tuple(int(d) for d in tensor.shape)  # type: ignore[arg-type]
        strides: list[int] = []
        step = 1
        for d in reversed(dims):
            strides.insert(0, step)
            step *= d
        return dims, tuple(strides)

    def get_input_dtensor_layout(self, tensor: Tensor) -> tuple:
        """An input's strides (Mirage's layout): row-major."""
        return self.get_input_dtensor_shape_and_stride(tensor)[1]

    def visualize(self, name: str) -> Path:
        """Mirage draws the graph; here its text form goes to ``<name>.txt`` (the path)."""
        path = Path(f"{name}.txt")
        path.write_text(repr(self) + "\n")
        return path

    def __call__(self, *arrays: Any, inputs: Sequence[Any] | None = None,
                 outputs: Sequence[Any] | None = None, **options: Any) -> list:
        """Run the graph as it stands (Mirage's ``graph(inputs=[...])``): its customized
        kernels as written, no search (``tuner.mirage_compat.run_graph``)."""
        from ._run import run_graph

        return run_graph(self, arrays, inputs, outputs, options)

    def superoptimize(self, *args: Any, db: str | None = None, device: str | None = None,
                      name: str | None = None, trials: int = 8, structures: int = 3,
                      time_budget_s: float | None = 120.0,
                      search_time_limit_s: float | None = 120.0, workers: int = 1,
                      verbose: bool = True, **mirage_options: Any) -> Optimized:
        """Search, verify, tune on this machine's device (``cuda`` where a GPU is usable,
        else ``cpu``; or ``device=``), store in ``db`` (default ``sqlite:///./tuner.db``) and
        return the best kernel (or the library path, where it is faster) as a callable.
        Progress goes to stderr unless ``verbose=False``.

        Mirage's own options (``config=``, ``imaps=``, ``griddims=``, ``backend=``,
        ``warmup_iters=``, ...) are accepted and not used: the search here enumerates its
        own grids and maps, and the tuner times every candidate itself."""
        from ._superoptimize import superoptimize

        if args:
            raise TypeError("superoptimize takes keyword arguments only")
        return superoptimize(self, db=db, device=device, name=name, trials=trials,
                             structures=structures, time_budget_s=time_budget_s,
                             search_time_limit_s=search_time_limit_s, workers=workers,
                             verbose=verbose, ignored=sorted(mirage_options))


def new_kernel_graph() -> KNGraph:
    """Start a program, as ``mirage.new_kernel_graph()`` does."""
    return KNGraph()


def set_gpu_device_id(device_id: int) -> None:
    """Mirage's ``set_gpu_device_id``: kernels run on this machine's device (``cuda`` is GPU
    0, ``superoptimize(device="cuda:N")`` another), so the id is only checked."""
    if int(device_id) < 0:
        raise ValueError(f"set_gpu_device_id: {device_id} is not a device index")


def convert_dtype_to_torch_type(dtype: str) -> Any:
    """Mirage's ``convert_dtype_to_torch_type``: ``mi.float16`` -> ``torch.float16`` etc."""
    import torch

    return getattr(torch, mirage_dtype(dtype))


def mirage_dtype(dtype: Any) -> str:
    """A dtype given as Mirage's name, a string or a torch/numpy dtype, as the tuner's."""
    text = getattr(dtype, "name", None) or str(dtype)
    text = text.removeprefix("torch.").removeprefix("mirage.")
    if text not in DTYPES:
        raise ShapeError(f"dtype {dtype!r}: use one of {', '.join(DTYPES)} "
                         "(mi.float16, mi.bfloat16, mi.float32)")
    return text


def _row_major(dims: tuple[int, ...]) -> tuple[int, ...]:
    want, step = [], 1
    for d in reversed(dims):
        want.append(step)
        step *= d
    return tuple(reversed(want))


def check_strides(dims: tuple[int, ...], strides: Sequence[int] | None,
                  transposed_ok: bool = False) -> str:
    """The layout ``strides`` give ``dims``: "row", or (inputs only) "transposed" for the
    contiguous transpose of the last two dims (``W.t()``'s strides)."""
    if strides is None:
        return "row"
    got = tuple(int(s) for s in strides)
    if got == _row_major(dims):
        return "row"
    if transposed_ok and len(dims) >= 2:
        st = _row_major((*dims[:-2], dims[-1], dims[-2]))
        if got == (*st[:-2], st[-1], st[-2]):
            return "transposed"
    raise ShapeError(f"strides {tuple(strides)}: only row-major tensors"
                     f"{' and inputs transposed in their last two dims' if transposed_ok else ''}"
                     f" are supported here (strides {_row_major(dims)} for dims {dims})")
