"""The direct call path: an inference graph whose every computing op runs as a kernel.

At decode shapes a norm or an attention kernel takes a few microseconds, less than the
machinery around it: AOT-autograd's runtime wrappers (~30 µs a call), the dispatcher of the
``tuner::kernel`` op and its argument handling (~15 µs).  Where a graph Dynamo hands over is
all kernels (after capture, only kernel calls, views and dtype conversions depend on the
graph's inputs) and no gradient is wanted, none of that is needed: the ATen graph is rewritten
into a plain Python function (FX code generation) that

- computes the graph's constants once (a causal mask built from ``ones`` and ``triu``), at
  compile time, with real tensors;
- calls each kernel through its ctypes entry (``CpuKernel.entry``) with the tensors'
  addresses, outputs allocated with ``torch.empty``, no checks per call: Dynamo's guards already
  fix every input's dtype, shape and strides, and this module checked at compile time that
  each kernel input is a contiguous tensor of the kernel's dtype and shape;
- runs the remaining views and conversions as ATen ops, as the graph says.

Anything else (a graph under autograd, an input mutated, an op that fell back, a kernel input
that would need a copy) keeps the general path: ``tuner::kernel`` calls inside Inductor.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from typing import Any

import torch

from .aten import FREE_OPS, meta, op_name

_KERNEL_OP = "tuner.kernel.default"
# ops that only relabel memory or convert it: free beside the kernels, and safe to run as ATen
_PASSIVE = FREE_OPS | {"logical_not.default", "clone.default", "contiguous.default",
                       "alias.default", "detach.default", "lift_fresh_copy.default"}


class KernelCall:
    """One kernel called with its tensors' addresses, outputs allocated in fixed shapes: a
    function written for its numbers of inputs and outputs (a loop costs a microsecond).
    The pointer arrays are made per call: ctypes lets go of the GIL during the kernel, so
    arrays shared between calls would let two threads overwrite each other's addresses."""

    def __init__(self, key: str, kernel: Any, shapes: list[tuple[int, ...]],
                 dtype: torch.dtype) -> None:
        fn, ins_type, outs_type = kernel.entry()
        n_in, n_out = ins_type._length_, len(shapes)
        xs = ", ".join(f"x{i}" for i in range(n_in))
        lines = [f"def call({xs}):"]
        lines += [f"    y{j} = empty({shapes[j]!r}, dtype=dtype)" for j in range(n_out)]
        ptrs_in = ", ".join(f"x{i}.data_ptr()" for i in range(n_in))
        ptrs_out = ", ".join(f"y{j}.data_ptr()" for j in range(n_out))
        lines += [f"    fn(Ins({ptrs_in}), Outs({ptrs_out}))",
                  f"    return [{', '.join(f'y{j}' for j in range(n_out))}]"]
        scope = {"empty": torch.empty, "dtype": dtype, "fn": fn, "Ins": ins_type,
                 "Outs": outs_type}
        exec("\n".join(lines), scope)  # noqa: S102 - our own text, numbers only
        self.call = scope["call"]
        # FX names the node after it and keeps it in the generated code's globals
        self.call.__name__ = self.call.__qualname__ = f"kernel_{key}"
        self.call.__module__ = __name__


def why_not_direct(aten: torch.fx.GraphModule, kernels: dict[str, Any]) -> str:
    """'' when every op of ``aten`` that depends on its inputs is a kernel call or passive
    (and each kernel's inputs can be handed over as they are), else why not."""
    live = _live(aten.graph)
    calls = 0
    for n in aten.graph.nodes:
        if n.op != "call_function" or n not in live:
            continue
        name = op_name(n)
        if name == _KERNEL_OP:
            calls += 1
            key, xs = n.args
            if key not in kernels or not hasattr(kernels[key][0], "entry"):
                return f"kernel {key} cannot be called by address"
            _kernel, shapes, dtype = kernels[key]
            for i, x in enumerate(xs):
                if x in live and _dtype(x) not in (None, dtype):
                    return f"kernel {key}'s input {i} is not a {dtype} tensor"
        elif name not in _PASSIVE and name != "getitem":
            return f"{name} runs outside the kernels"
    return "" if calls else "no kernel in the graph"


def direct_function(aten: torch.fx.GraphModule, kernels: dict[str, Any]) -> Callable[..., Any]:
    """``aten`` as a plain function of its inputs: constants folded, kernels called by
    address (``why_not_direct(aten, kernels)`` must be '')."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    graph = aten.graph
    live = _live(graph)
    consts: dict[Any, Any] = {}
    with unset_fake_temporarily(), torch.no_grad():
        for n in graph.nodes:
            if n.op == "call_function" and n not in live:
                args, kwargs = torch.fx.node.map_arg((n.args, n.kwargs), lambda a: consts[a])
                consts[n] = n.target(*args, **kwargs)
            elif n.op == "call_function" and op_name(n) == _KERNEL_OP:
                for x in n.args[1]:  # a constant handed to a kernel: as the kernel reads it
                    if x not in live:
                        consts[x] = consts[x].to(kernels[n.args[0]][2]).contiguous()
    out = torch.fx.Graph()
    env: dict[Any, Any] = {}
    root = torch.nn.Module()
    for n in graph.nodes:
        if n in env:
            continue
        if n.op == "call_function" and n not in live:
            if any(u in live or u.op == "output" for u in n.users):
                name = f"const_{len(env)}"
                root.register_buffer(name, consts[n])
                env[n] = out.get_attr(name)
            continue
        if n.op == "call_function" and op_name(n) == _KERNEL_OP:
            key, xs = n.args
            kernel, shapes, dtype = kernels[key]
            shapes = list(shapes)
            aliases = []
            for g in n.users:  # getitem i, only reshaped: allocate output i in that shape
                views = list(g.users)
                want = {tuple(v.args[1]) for v in views if op_name(v) in _RESHAPES}
                if views and len(want) == 1 and all(op_name(v) in _RESHAPES for v in views):
                    shape = want.pop()
                    if -1 not in shape and math.prod(shape) == math.prod(shapes[g.args[1]]):
                        shapes[g.args[1]] = shape
                        aliases += [(v, g) for v in views]
            args = []
            for x in xs:
                x = _storage(x, live)
                if x in live and not _contiguous(x):  # a strided view: copied, as it must
                    args.append(out.call_method("contiguous", (env[x],)))
                else:
                    args.append(env[x])
            call = out.call_function(KernelCall(key, kernel, shapes, dtype).call, tuple(args))
            env[n] = call
            for g in n.users:
                env[g] = out.call_function(operator.getitem, (call, g.args[1]))
            for v, g in aliases:
                env[v] = env[g]
            continue
        env[n] = out.node_copy(n, lambda a: env[a])
    out.eliminate_dead_code()
    out.lint()
    return torch.fx.GraphModule(root, out).forward


_RESHAPES = ("reshape.default", "view.default", "_unsafe_view.default")


def _storage(node: Any, live: set) -> Any:
    """A kernel input as the kernel reads it: only its address matters, so a reshape of a
    contiguous tensor (the same memory) is skipped."""
    while node in live and op_name(node) in _RESHAPES and _contiguous(node.args[0]):
        node = node.args[0]
    return node


def _contiguous(node: Any) -> bool:
    """Whether ``node``'s value is a contiguous tensor: by its example value, or, for what the
    capture inserted without one, as a kernel's output or a reshape of a contiguous tensor."""
    v = meta(node)
    if v is None and op_name(node) == "getitem" and op_name(node.args[0]) == _KERNEL_OP:
        return True
    if v is None and op_name(node) in _RESHAPES:
        return _contiguous(node.args[0])
    return isinstance(v, torch.Tensor) and v.is_contiguous()


def _dtype(node: Any) -> torch.dtype | None:
    """``node``'s dtype where it is known (through the reshapes the capture inserted)."""
    while meta(node) is None and op_name(node) in _RESHAPES:
        node = node.args[0]
    if meta(node) is None and op_name(node) == "getitem" and \
            op_name(node.args[0]) == _KERNEL_OP:
        return _dtype_of(node.args[0])
    v = meta(node)
    return v.dtype if isinstance(v, torch.Tensor) else None


def _dtype_of(kernel_node: Any) -> torch.dtype:
    from .runtime import kernel_dtype

    return kernel_dtype(kernel_node.args[0])


def _live(graph: torch.fx.Graph) -> set:
    """The nodes that depend on the graph's inputs (the rest are constants)."""
    live: set = set()
    for n in graph.nodes:
        if n.op == "placeholder" or any(a in live for a in n.all_input_nodes):
            live.add(n)
        elif n.op == "call_function" and _random(n):
            live.add(n)  # never folded: a fresh draw each call
    return live


def _random(n: Any) -> bool:
    name = op_name(n)
    return any(w in name for w in ("rand", "bernoulli", "dropout", "normal", "uniform",
                                   "multinomial", "empty"))
