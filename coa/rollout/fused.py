"""The hf engine's forward step in few operations: a Llama-family decoder layer as four matmuls and three C calls.

    decoder = FusedDecoder.build(model)          # None where the model is not supported (the engine keeps transformers)
    decoder.load()                               # (re)read the weights: at every rollout call (RL updates them)
    hidden = decoder.forward(chunks, step)       # [S, H]: the final norm's output at each row's last new token

Why. A decode step feeds one token per row, so its matmuls are small ([S, 576] x [576, N] for SmolLM2) and a
transformers layer spends as long again on the operations around them: RMS norm as seven tensor operations
with dtype round trips, rotary embeddings as slices, negations and concatenations, the cache write as an
index_put, the attention function's own reshapes, SiLU and a multiply. Here a layer is

    h = rms_norm(x)                    C (the residual add of the previous layer fused in)
    qkv = h @ W_qkv (+ b)              one matmul: q, k and v projections concatenated
    a = attention(qkv)                 C: RoPE on q and k, k and v written into the paged cache, attention
    x += a @ W_o                       (the add happens in the next norm)
    h = rms_norm(x)                    C
    gu = h @ W_gate_up                 one matmul: gate and up concatenated
    x += silu(gu_gate) * gu_up @ W_down  C for the SiLU-and-multiply

The weights are the model's own, with the q/k/v and gate/up matrices concatenated into copies (in the
model's dtype) and, where torch has oneDNN, every matrix (the output head's too) packed once into oneDNN's
blocked layout: a matmul then skips re-packing its weights on every call, which is most of a decode step's
small matmuls (1.7x at one row, 1.1x at 128; the same results in bf16). :meth:`load` rebuilds them, so an
engine whose model an RL step updated reads the new weights.
Ingest steps (chunks of prompt or observation for some rows) run the same layer over every new token of the
step at once (no padding to the longest chunk), attending row by row; the final norm runs only on each
row's last token, the one whose logits the engine samples from.

Supported: decoder-only models whose layers are ``self_attn.{q,k,v,o}_proj`` (q/k/v bias allowed, no o bias),
``mlp.{gate,up,down}_proj`` without bias and SiLU, RMS norms ``input_layernorm``/``post_attention_layernorm``
and the final ``model.norm``, default RoPE applied as rotate-half (Llama, Qwen2, Mistral without a sliding
window), on the CPU with the C kernels built, in a dtype and at head shapes they take
(coa.rollout.kernel.unsupported). Anything else returns None from :meth:`build`, which logs why once: the
engine then runs transformers' layers, decided before the rollout, never an error in the middle of one.
Numerics: the same operations as transformers up to rounding (norms, RoPE and SiLU are computed in float32
and rounded once; transformers rounds to the model's dtype between some of them).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from coa.rollout.kernel import CpuKernels, cpu_kernels, fallback
from coa.rollout.kernel import unsupported as kernel_unsupported
from coa.rollout.paged import PagedCache, PagedStep

SUPPORTED = ("llama", "qwen2", "mistral")
PACK_HINT = 64  # the batch size oneDNN's weight layout is chosen for (any batch runs on it)


def _packing(dtype: torch.dtype = torch.float32) -> bool:
    """Whether this torch can pack linear weights of ``dtype`` for oneDNN (CPU builds with mkldnn; bf16 only
    where the CPU has oneDNN's bf16 path: AVX512BW/VL/DQ or AVX-NE-CONVERT, not a plain AVX2 laptop)."""
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")):
        return False
    if dtype == torch.bfloat16:
        check = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
        return bool(check()) if check is not None else False
    return dtype == torch.float32


class Linear:
    """One matmul ``x @ w.T (+ b)`` whose weight is packed for oneDNN once (see the module docstring), or
    plain ``F.linear`` where torch cannot pack it. x: [M, K] contiguous; w: [N, K]."""

    def __init__(self, w: torch.Tensor, b: torch.Tensor | None = None, pack: bool = True):
        self.b = b
        self.packed = pack and _packing(w.dtype)
        self.w = torch.ops.mkldnn._reorder_linear_weight(w.detach().contiguous(), PACK_HINT) if self.packed else w

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed:
            return torch.ops.mkldnn._linear_pointwise(x, self.w, self.b, "none", [], "")
        return F.linear(x, self.w, self.b)


def heads(config: Any) -> tuple[int, int, int]:
    """(query heads, KV heads, head dim) of a Llama-family config."""
    n = config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or n
    return n, kv, getattr(config, "head_dim", None) or config.hidden_size // n


def unsupported(model: Any) -> str | None:
    """Why :class:`FusedDecoder` cannot run ``model`` (None: it can)."""
    config = getattr(model, "config", None)
    if config is None or getattr(config, "model_type", None) not in SUPPORTED:
        return f"model type {getattr(config, 'model_type', None)!r} is not one of {SUPPORTED}"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"hidden_act {config.hidden_act!r} is not silu"
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return "sliding-window attention"
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        return f"rope type {rope.get('rope_type')!r} is not the default"
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None or not len(layers):
        return "no model.model.layers"
    attn, mlp = layers[0].self_attn, layers[0].mlp
    if getattr(attn.o_proj, "bias", None) is not None or any(getattr(getattr(mlp, n), "bias", None) is not None
                                                             for n in ("gate_proj", "up_proj", "down_proj")):
        return "o_proj or MLP biases"
    param = next(model.parameters())
    if param.device.type != "cpu":
        return "not on the CPU"
    if cpu_kernels() is None:
        return "the C kernels are not built"
    return kernel_unsupported(param.dtype, *heads(config))


class FusedDecoder:
    """See the module docstring. Use :meth:`build`."""

    def __init__(self, model: Any, ops: CpuKernels):
        self.model, self.ops = model, ops
        self.n_heads, self.n_kv, self.head_dim = heads(model.config)
        self.scale = self.head_dim ** -0.5
        self.eps = float(model.model.norm.variance_epsilon)
        rotary = model.model.rotary_emb
        self.inv_freq = rotary.inv_freq.float()  # [D/2]
        self.rope_scale = float(getattr(rotary, "attention_scaling", 1.0))
        self.layers: list[dict[str, Any]] = []

    @classmethod
    def build(cls, model: Any) -> FusedDecoder | None:
        """A decoder for ``model``, or None where it is not supported (:func:`unsupported`: logged once)."""
        reason = unsupported(model)
        if reason is not None:
            fallback("the fused decoder", reason)
            return None
        return cls(model, cpu_kernels())

    @torch.no_grad()
    def load(self) -> None:
        """(Re)build the concatenated (and packed) weights from the model's current parameters."""
        self.layers = []
        for layer in self.model.model.layers:
            a, m = layer.self_attn, layer.mlp
            biases = [p.bias for p in (a.q_proj, a.k_proj, a.v_proj)]
            self.layers.append({
                "ln1": layer.input_layernorm.weight.detach(),
                "qkv": Linear(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]),
                              torch.cat(biases).contiguous() if all(b is not None for b in biases) else None),
                "o": Linear(a.o_proj.weight),
                "ln2": layer.post_attention_layernorm.weight.detach(),
                "gate_up": Linear(torch.cat([m.gate_proj.weight, m.up_proj.weight])),
                "down": Linear(m.down_proj.weight),
            })
        self.norm = self.model.model.norm.weight.detach()
        self.embed = self.model.get_input_embeddings().weight.detach()
        self.head = Linear(self.model.get_output_embeddings().weight)

    @torch.no_grad()
    def own(self) -> None:
        """Hold copies of every weight :meth:`load` took from the model (packed weights and concatenations
        already are copies) and drop the model: nothing here then refers to its parameters, so a frozen engine
        can let the model, and the checkpoint file its parameters may map, go (coa.rollout.hf.HFEngine's
        ``frozen``). Tied input and output embeddings stay one tensor."""
        tied = not self.head.packed and self.head.w.data_ptr() == self.embed.data_ptr()
        for w in self.layers:
            w["ln1"], w["ln2"] = w["ln1"].clone(), w["ln2"].clone()
            for name in ("o", "down"):
                if not w[name].packed:
                    w[name].w = w[name].w.clone()
        self.norm, self.embed = self.norm.clone(), self.embed.clone()
        if not self.head.packed:
            self.head.w = self.embed if tied else self.head.w.clone()
        self.inv_freq = self.inv_freq.clone()
        self.model = None

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The output head: hidden [S, H] (from :meth:`forward`) -> logits [S, V]."""
        return self.head(hidden.contiguous())

    def forward(self, chunks: list[list[int]], step: PagedStep, keep: int | None = None) -> torch.Tensor:
        """Feed row s the tokens ``chunks[s]`` (the engine's step: ``step`` holds the rows' blocks, reserved for
        the new positions, and ``step.cached`` their positions so far). Returns the final norm's output at each
        row's last new token, [S, H] in the model's dtype. Call under torch.inference_mode().

        A decode step (one token per row) attends in C (:meth:`CpuKernels.decode_attention`); an ingest step
        writes its keys and values in C and attends row by row with torch (the row's cached positions and its
        new tokens up to each one), so no batch is padded to its longest row. With ``keep`` = L the residual
        stream entering layer L of every new token is left in ``self.kept`` ([N, H], rows in order)."""
        cache: PagedCache = step.cache
        lens = [len(c) for c in chunks]
        ids = torch.tensor([t for c in chunks for t in c], dtype=torch.long)
        x = self.embed[ids].contiguous()  # [N, H]: the residual stream of every new token
        n_tok, width = x.shape
        dtype = x.dtype
        decode = max(lens) == 1
        cached = step.cached.tolist()
        positions = torch.tensor([p + j for p, n in zip(cached, lens, strict=True) for j in range(n)])
        freqs = positions.float()[:, None] * self.inv_freq[None, :]  # [N, D/2]
        cos, sin = (freqs.cos() * self.rope_scale).contiguous(), (freqs.sin() * self.rope_scale).contiguous()
        pos32 = step.cached.to(torch.int32)
        like = torch.empty((1, self.n_kv, 1, self.head_dim), dtype=dtype)
        h = torch.empty_like(x)
        pending = None  # the previous sub-layer's output, added into x by the next norm
        for i, w in enumerate(self.layers):
            self.ops.add_rms_norm(x, pending, w["ln1"], self.eps, h)
            if i == keep:  # x is now the residual stream entering layer i
                self.kept = x.clone()
            qkv = w["qkv"](h)
            k_pool, v_pool = cache.pools(i, like)
            if decode:
                attn = self.ops.decode_attention(qkv, cos, sin, k_pool, v_pool, step.table, pos32, self.n_heads,
                                                 self.scale, max(cached) + 1)
            else:
                q = self.ops.rope_write(qkv, cos, sin, k_pool, v_pool, step.dest_block, step.dest_offset,
                                        self.n_heads)
                attn = self._attend_rows(q, k_pool, v_pool, step.table, cached, lens)
            pending = w["o"](attn)
            self.ops.add_rms_norm(x, pending, w["ln2"], self.eps, h)
            gu = w["gate_up"](h)
            inner = gu.shape[1] // 2
            act = torch.empty((n_tok, inner), dtype=dtype)
            if not self.ops.silu_mul(gu, act):
                act = F.silu(gu[:, :inner]) * gu[:, inner:]
            pending = w["down"](act)
        if keep is not None and keep >= len(self.layers):
            raise ValueError(f"keep={keep}: the model has {len(self.layers)} layers")
        last = torch.tensor(lens).cumsum(0) - 1  # each row's last new token
        x_last, out = x[last].contiguous(), torch.empty((len(lens), width), dtype=dtype)
        self.ops.add_rms_norm(x_last, pending[last].contiguous(), self.norm, self.eps, out)
        return out

    def _attend_rows(self, q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, table: torch.Tensor,
                     cached: list[int], lens: list[int]) -> torch.Tensor:
        """Ingest attention: row s's ``lens[s]`` queries (q [N, H*D], rows in order) over its ``cached[s]``
        positions and its new ones up to each query; rows feeding one token (decoding rows riding along) in one
        call of the C kernel, the others row by row with torch. Returns [N, H*D]."""
        d, bs = self.head_dim, k_pool.shape[2]
        out = torch.empty_like(q)
        starts = [0]
        for t in lens[:-1]:
            starts.append(starts[-1] + t)
        single = [s for s, t in enumerate(lens) if t == 1]
        if single:
            at = torch.tensor([starts[s] for s in single])
            seen = torch.tensor([cached[s] + 1 for s in single], dtype=torch.int32)
            o = self.ops.attention(q[at].view(len(single), self.n_heads, d), k_pool, v_pool,
                                   table[torch.tensor(single)].contiguous(), seen, self.scale)
            out[at] = o.view(len(single), -1).to(q.dtype)
        for s, (n, t) in enumerate(zip(cached, lens, strict=True)):
            if t == 1:
                continue
            width, at = n + t, starts[s]
            blocks = table[s, : -(-width // bs)].long()
            k = k_pool[blocks].transpose(0, 1).reshape(self.n_kv, -1, d)[:, :width]  # [Hk, W, D]
            v = v_pool[blocks].transpose(0, 1).reshape(self.n_kv, -1, d)[:, :width]
            qs = q[at : at + t].view(t, self.n_heads, d).transpose(0, 1)  # [H, t, D]
            if n == 0:
                o = F.scaled_dot_product_attention(qs[None], k[None], v[None], is_causal=True, scale=self.scale,
                                                   enable_gqa=True)
            else:
                mask = torch.arange(width)[None, :] <= (n + torch.arange(t))[:, None]  # [t, W]
                o = F.scaled_dot_product_attention(qs[None], k[None], v[None], attn_mask=mask, scale=self.scale,
                                                   enable_gqa=True)
            out[at : at + t] = o[0].transpose(0, 1).reshape(t, -1)
        return out
