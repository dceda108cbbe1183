"""The paged KV cache and its decode kernel: blocks are shared, copied and returned; the kernel equals SDPA; a
sliding window is applied as transformers applies it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from coa.rollout.kernel import decode_kernel
from coa.rollout.paged import PagedCache, _dense, paged_attention


def reference(q, k_pool, v_pool, table, lens, scale):
    """Plain SDPA over each row's own positions, gathered from its blocks: [S, H, D] float32."""
    out = []
    for s in range(q.shape[0]):
        idx = table[s].long()
        k = k_pool[idx].permute(1, 0, 2, 3).reshape(k_pool.shape[1], -1, k_pool.shape[3])[:, : lens[s]]
        v = v_pool[idx].permute(1, 0, 2, 3).reshape(v_pool.shape[1], -1, v_pool.shape[3])[:, : lens[s]]
        qs = q[s].float().reshape(k.shape[0], -1, q.shape[-1])  # [Hk, R, D]
        out.append(F.scaled_dot_product_attention(qs, k.float(), v.float(), scale=scale).reshape(q.shape[1], -1))
    return torch.stack(out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim,group", [(64, 3), (32, 2), (64, 1)])  # 64: the vector path; 32: the plain loops
@pytest.mark.parametrize("bs,lens", [(4, [1, 5, 28, 13, 17]), (16, [1, 17, 112, 16, 33])])  # 16: the engine's blocks
def test_decode_kernel_equals_sdpa_over_each_rows_blocks(dtype, head_dim, group, bs, lens):
    kernel = decode_kernel()
    if kernel is None:
        pytest.skip("no C compiler: the engine uses torch's attention (tested by the engine tests)")
    gen = torch.Generator().manual_seed(0)
    rows, kv_heads, nb = 5, 2, 7
    k_pool = torch.randn(rows * nb + 3, kv_heads, bs, head_dim, generator=gen).to(dtype)
    v_pool = torch.randn(rows * nb + 3, kv_heads, bs, head_dim, generator=gen).to(dtype)
    table = torch.randperm(rows * nb + 3, generator=gen)[: rows * nb].reshape(rows, nb).to(torch.int32)
    lens = torch.tensor(lens, dtype=torch.int32)  # a lone position, partial and full blocks
    q = torch.randn(rows, kv_heads * group, head_dim, generator=gen).to(dtype)
    got = kernel(q, k_pool, v_pool, table, lens, 0.3)
    want = reference(q, k_pool, v_pool, table, lens, 0.3)
    assert got.dtype == torch.float32
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-4)
    # a row's result does not depend on the other rows of the batch
    assert torch.equal(kernel(q[2:3], k_pool, v_pool, table[2:3], lens[2:3], 0.3)[0], got[2])


def test_loading_the_kernel_keeps_subnormal_floats():
    """-ffast-math's crtfastmath.o would set flush-to-zero for the whole process (numpy, torch, hypothesis)."""
    if decode_kernel() is None:
        pytest.skip("no C compiler")
    tiny = torch.tensor(1e-40, dtype=torch.float32)  # a float32 subnormal
    assert (tiny * 1.0).item() != 0.0 and (tiny.double() / 2).item() > 0.0
    assert 5e-324 / 2 == 0.0 and 5e-324 * 1.0 > 0.0  # Python floats on the same SSE unit


def test_blocks_are_shared_copied_and_returned():
    cache = PagedCache(block_size=4, initial_blocks=2)
    keys = torch.arange(2 * 1 * 10 * 2, dtype=torch.float32).reshape(2, 1, 10, 2)
    a = cache.reserve([], 10)  # 3 blocks: the pool grows from 2
    assert len(a) == 3 and cache.capacity >= 3
    step = cache.step([a], cached=[0], lens=[10])
    k_pool, _ = step.update(keys[:1], keys[:1], 0)
    b = cache.share(a, 10)  # two full blocks by reference, the partly filled third copied
    assert b[:2] == a[:2] and b[2] != a[2]
    assert torch.equal(k_pool[b[2]], k_pool[a[2]])
    used = cache.used
    cache.release(a)
    assert cache.used == used - 1  # only a's own third block went back; the shared two are b's now
    cache.release(b)
    assert cache.used == 0 and cache.peak_blocks == 4


def test_memory_follows_the_blocks_held_not_the_capacity():
    """The pools are allocated at capacity and written only where blocks were handed out: a block is zeroed at
    its first hand-out, a returned block goes out again before a fresh one, so the written blocks [0, touched)
    are the most ever held at once; a grow copies only those."""
    cache = PagedCache(block_size=4, initial_blocks=8)
    a = cache.reserve([], 8)
    keys = torch.ones(1, 1, 8, 2)
    k_pool, v_pool = cache.step([a], cached=[0], lens=[8]).update(keys, keys, 0)
    assert cache.touched == 2 and k_pool.shape[0] == 8
    k_pool[2:], v_pool[2:] = float("nan"), float("nan")  # what never-written memory may hold
    cache.release(a)
    assert sorted(cache.reserve([], 8)) == sorted(a) and cache.touched == 2  # the returned blocks, not fresh ones
    fresh = cache.reserve([], 1)
    assert fresh == [2] and cache.touched == 3
    assert torch.equal(k_pool[2], torch.zeros(1, 4, 2)) and torch.equal(v_pool[2], torch.zeros(1, 4, 2))
    cache.reserve([], 4 * 6)  # past the capacity: the pools grow
    grown, _ = cache.pools(0, keys)
    assert grown.shape[0] > 8 and torch.equal(grown[:3], k_pool[:3]) and cache.touched == 9
    assert not grown[: cache.touched].isnan().any()


def test_dense_gather_masks_each_query_to_its_rows_past():
    cache = PagedCache(block_size=4, initial_blocks=8)
    a, b = cache.reserve([], 6), cache.reserve([], 3)
    step = cache.step([a, b], cached=[4, 0], lens=[2, 3])  # row a had 4 cached positions, row b none
    pools = torch.zeros(8, 1, 4, 2)
    _, _, allowed = _dense(step, pools, pools)
    assert allowed.shape == (2, 1, 3, 8)
    assert allowed[0, 0, 0].tolist() == [True] * 5 + [False] * 3  # position 4 sees 0..4
    assert allowed[0, 0, 2].tolist() == [True] + [False] * 7  # a pad query sees position 0 only
    assert allowed[1, 0, 1].tolist() == [True, True] + [False] * 6


def test_a_sliding_window_is_applied_as_transformers_does():
    """paged_attention with sliding_window=W (what Mistral's and Qwen2's sliding layers pass): each query sees its
    own position and the W - 1 before it (key > query - W), in ingest steps (a chunk after cached positions
    too) and in decode steps, which then run torch instead of the C kernel."""
    gen = torch.Generator().manual_seed(0)
    cache, window, n = PagedCache(block_size=4), 3, 10
    keys, values = torch.randn(2, 1, 1, n, 8, generator=gen)
    query = torch.randn(1, 2, n, 8, generator=gen)  # two query heads over one KV head
    allowed = torch.ones(n, n, dtype=torch.bool).tril() & ~torch.ones(n, n, dtype=torch.bool).tril(-window)
    want = F.scaled_dot_product_attention(query, keys, values, attn_mask=allowed, enable_gqa=True).transpose(1, 2)
    blocks = cache.reserve([], n)
    for start, end in [(0, 4), (4, 7), (7, 8), (8, 9), (9, 10)]:  # two ingest steps, then decode steps
        step = cache.step([blocks], cached=[start], lens=[end - start])
        k_pool, v_pool = step.update(keys[:, :, start:end], values[:, :, start:end], 0)
        got, _ = paged_attention(None, query[:, :, start:end], k_pool, v_pool, None, coa_paged=step,
                                 sliding_window=window)
        assert torch.allclose(got, want[:, start:end], atol=1e-6)
