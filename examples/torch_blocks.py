"""Model blocks as their authors write them (Llama, GPT-2, a textbook attention): what
tests/tuner/test_pytorch_backend.py compiles with ``backend="tuner"`` and
benchmarks/torch_backend.py times.  Plain PyTorch, nothing of the tuner's."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class LlamaRMSNorm(nn.Module):
    """Llama's RMSNorm: the float32 upcast, eps inside the rsqrt, the weight after."""

    def __init__(self, hidden: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class LlamaMLP(nn.Module):
    """Llama's MLP: SwiGLU over bias-free linears."""

    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaMLPLayer(nn.Module):
    """The second half of a Llama decoder layer: RMSNorm, the SwiGLU MLP, the residual add."""

    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.post_attention_layernorm = LlamaRMSNorm(hidden)
        self.mlp = LlamaMLP(hidden, intermediate)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))


class GPT2MLP(nn.Module):
    """GPT-2's MLP: the tanh GELU written out (``gelu_new``), linears with bias."""

    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.c_fc = nn.Linear(hidden, intermediate)
        self.c_proj = nn.Linear(intermediate, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.c_fc(x)
        h = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * torch.pow(h, 3.0))))
        return self.c_proj(h)


class CausalAttention(nn.Module):
    """Scaled dot-product attention written out, with a causal mask (q, k, v per head)."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        s = q.shape[-2]
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        mask = torch.triu(torch.ones(s, s, dtype=torch.bool, device=q.device), diagonal=1)
        scores = scores.masked_fill(mask, float("-inf"))
        return torch.softmax(scores, dim=-1) @ v


class LayerNorm(nn.Module):
    """LayerNorm with its affine weight and bias."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


class ResidualRMSNorm(nn.Module):
    """A residual add followed by RMSNorm, returning both (the residual stream goes on)."""

    def __init__(self, hidden: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.norm = LlamaRMSNorm(hidden, eps)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = x + residual
        return h, self.norm(h)


class HFLlamaLayer(nn.Module):
    """``transformers``' own LlamaDecoderLayer (eager attention, no mask, 4 KV heads), its
    rotary embeddings computed once for ``rows`` positions: a model nobody here wrote."""

    def __init__(self, hidden: int, rows: int) -> None:
        super().__init__()
        import transformers
        from transformers.models.llama.modeling_llama import (
            LlamaDecoderLayer,
            LlamaRotaryEmbedding,
        )

        cfg = transformers.LlamaConfig(hidden_size=hidden, intermediate_size=2 * hidden,
                                       num_attention_heads=max(1, hidden // 64),
                                       num_key_value_heads=max(1, hidden // 256),
                                       num_hidden_layers=1, vocab_size=128)
        cfg._attn_implementation = "eager"
        self.layer = LlamaDecoderLayer(cfg, 0)
        cos, sin = LlamaRotaryEmbedding(cfg)(torch.zeros(1, rows, hidden),
                                             torch.arange(rows)[None])
        self.register_buffer("cos", cos)
        self.register_buffer("sin", sin)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.layer(x, position_embeddings=(self.cos, self.sin), attention_mask=None)
        return out[0] if isinstance(out, tuple) else out


def block(name: str, hidden: int, rows: int, dtype: torch.dtype = torch.float32,
          seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """One block and its inputs at real scale: activations ~N(0, 1), weights ~N(0, 1/fan_in)
    (nn.Linear's default init is of that scale), norm weights around 1."""
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)

    def act(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(dtype)

    if name == "rmsnorm":
        m: nn.Module = LlamaRMSNorm(hidden)
        args: tuple[torch.Tensor, ...] = (act(1, rows, hidden),)
    elif name == "llama_mlp":
        m, args = LlamaMLP(hidden, 2 * hidden), (act(1, rows, hidden),)
    elif name == "llama_mlp_layer":
        m, args = LlamaMLPLayer(hidden, 2 * hidden), (act(1, rows, hidden),)
    elif name == "gpt2_mlp":
        m, args = GPT2MLP(hidden, 2 * hidden), (act(1, rows, hidden),)
    elif name == "attention":
        heads, d = max(1, hidden // 64), min(64, hidden)
        m, args = CausalAttention(), tuple(act(1, heads, rows, d) for _ in range(3))
    elif name == "layernorm":
        m, args = LayerNorm(hidden), (act(rows, hidden),)
    elif name == "residual_rmsnorm":
        m, args = ResidualRMSNorm(hidden), (act(1, rows, hidden), act(1, rows, hidden))
    elif name == "hf_llama_layer":
        m, args = HFLlamaLayer(hidden, rows), (act(1, rows, hidden),)
    else:
        raise ValueError(f"unknown block {name!r}; known: {', '.join(BLOCKS + OPTIONAL)}")
    for p in m.parameters():
        if p.dim() == 1:
            with torch.no_grad():
                p.add_(0.1 * torch.randn(p.shape, generator=g))  # not exactly ones / zeros
    return m.to(dtype).eval(), args


BLOCKS = ("rmsnorm", "llama_mlp", "llama_mlp_layer", "gpt2_mlp", "attention", "layernorm",
          "residual_rmsnorm")
OPTIONAL = ("hf_llama_layer",)  # needs transformers (the dev extra)
