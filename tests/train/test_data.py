"""SFT data side: loss masks, packing, the block-diagonal mask against unpacked runs, the token loss."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from coa.model import train_tokenizer
from coa.train import data as sft

TEXTS = [
    "The capital of France is Paris, a city on the Seine.",
    "Search the web for the population of Paris and report it.",
    "The answer is forty two, which I checked twice.",
    "Paris has about two million inhabitants in the city proper.",
    "Find the capital of Germany: it is Berlin.",
] * 4


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(TEXTS, vocab_size=600, min_frequency=2)


def tiny_model(attn: str) -> Qwen2ForCausalLM:
    config = Qwen2Config(
        vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=64, max_position_embeddings=256, tie_word_embeddings=True, attn_implementation=attn,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).float().eval()
    assert model.config._attn_implementation == attn
    return model


def random_examples(lengths: list[int], seed: int = 0) -> list[sft.Example]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for n in lengths:
        ids = torch.randint(1, 128, (n,), generator=g).tolist()
        out.append(sft.Example(ids, [0] * (n // 3) + [1] * (n - n // 3), 1.0))
    return out


# --------------------------------------------------------------------------- packed == unpacked


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_logits_equal_unpacked(attn):
    model = tiny_model(attn)
    examples = random_examples([7, 19, 4, 12])
    rows = [[0, 1, 2, 3]]
    batch = sft.collate_packed(examples, rows, max_tokens=48, pad_id=0)  # 42 real tokens, 6 pad
    with torch.no_grad():
        packed = model(**batch.model_inputs(torch.float32)).logits[0]
        worst = 0.0
        at = 0
        for ex in examples:
            alone = model(input_ids=torch.tensor([ex.input_ids])).logits[0]
            worst = max(worst, (packed[at : at + len(ex)] - alone).abs().max().item())
            at += len(ex)
    assert torch.isfinite(packed).all()
    assert worst < 1e-5, worst


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_padded_logits_equal_unpacked(attn):
    model = tiny_model(attn)
    examples = random_examples([5, 11, 8], seed=1)
    batch = sft.collate_padded(examples, pad_id=0)
    with torch.no_grad():
        padded = model(**batch.model_inputs()).logits
        for r, ex in enumerate(examples):
            alone = model(input_ids=torch.tensor([ex.input_ids])).logits[0]
            assert (padded[r, : len(ex)] - alone).abs().max().item() < 1e-5


def test_packed_batch_layout():
    examples = random_examples([3, 2])
    examples[1] = sft.Example(examples[1].input_ids, [1, 1], 2.0)
    b = sft.collate_packed(examples, [[0, 1]], max_tokens=7, pad_id=0)
    assert b.input_ids.shape == b.labels.shape == b.position_ids.shape == b.weights.shape == (1, 7)
    assert b.attention_mask.shape == (1, 1, 7, 7) and b.attention_mask.dtype == torch.float32
    assert b.position_ids[0].tolist() == [0, 1, 2, 0, 1, 0, 0]
    assert b.segment_ids[0].tolist() == [0, 0, 0, 1, 1, -1, -1]
    ids0, ids1 = examples[0].input_ids, examples[1].input_ids
    # example 0: mask [0, 1, 1]; example 1: first token never a target (it follows another sample)
    assert b.labels[0].tolist() == [-100, ids0[1], ids0[2], -100, ids1[1], -100, -100]
    assert b.weights[0].tolist() == [0, 1, 1, 0, 2, 0, 0]
    allowed = (b.attention_mask[0, 0] == 0).int().tolist()
    assert allowed == [
        [1, 0, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0, 0],
        [0, 0, 0, 1, 0, 0, 0],
        [0, 0, 0, 1, 1, 0, 0],
        [0, 0, 0, 0, 0, 1, 0],
        [0, 0, 0, 0, 0, 0, 1],
    ]
    assert b.n_samples == 2
    bf16 = b.model_inputs(torch.bfloat16)["attention_mask"]
    assert bf16.dtype == torch.bfloat16 and torch.isfinite(bf16).all()


# --------------------------------------------------------------------------- tokenisation and masks


PROMPT = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
OBS = "<observation>Paris is the capital of France.</observation>"
RESPONSE = f"<think>Search it.</think><web_search>capital of France</web_search>{OBS}<answer>Paris</answer>"


def test_encode_masks_prompt_and_observations(tok):
    ex = sft.encode_example(tok, PROMPT, RESPONSE, weight=2.0)
    prompt_ids = tok(PROMPT, add_special_tokens=False)["input_ids"]
    response_ids = tok(RESPONSE, add_special_tokens=False)["input_ids"]
    # no tokenisation across the boundary: prompt ids + response ids + eos
    assert ex.input_ids == prompt_ids + response_ids + [tok.eos_token_id]
    assert len(ex.loss_mask) == len(ex.input_ids) and ex.weight == 2.0
    n = len(prompt_ids)
    assert ex.loss_mask[:n] == [0] * n
    assert ex.loss_mask[-1] == 1  # the eos is a target
    resp_mask = ex.loss_mask[n:-1]
    masked = [t for t, m in zip(response_ids, resp_mask, strict=True) if m == 0]
    kept = [t for t, m in zip(response_ids, resp_mask, strict=True) if m == 1]
    assert tok.decode(masked) == OBS
    assert tok.decode(kept) == RESPONSE.replace(OBS, "")
    # and the masked tokens are one contiguous run (the observation)
    zeros = [i for i, m in enumerate(resp_mask) if m == 0]
    assert zeros == list(range(zeros[0], zeros[-1] + 1))


def test_encode_truncates_keeping_the_start(tok):
    full = sft.encode_example(tok, PROMPT, RESPONSE)
    short = sft.encode_example(tok, PROMPT, RESPONSE, max_len=len(full) - 5)
    assert short.input_ids == full.input_ids[:-5] and short.loss_mask == full.loss_mask[:-5]


def test_encode_without_observation_all_response_targets(tok):
    ex = sft.encode_example(tok, PROMPT, "<answer>Paris</answer>")
    n = len(tok(PROMPT, add_special_tokens=False)["input_ids"])
    assert ex.loss_mask == [0] * n + [1] * (len(ex) - n)


# --------------------------------------------------------------------------- token loss


def _ce(logits: list[float], target: int) -> float:
    return -(logits[target] - math.log(sum(math.exp(x) for x in logits)))


def test_token_loss_hand_computation():
    logits = torch.tensor([[[1.0, 2.0, 0.0], [0.5, -1.0, 2.0], [0.0, 0.0, 3.0], [9.0, 9.0, 9.0]]])
    labels = torch.tensor([[-100, 2, 0, 1]])
    weights = torch.tensor([[0.0, 1.0, 1.0, 1.0]])
    expected = (_ce([1.0, 2.0, 0.0], 2) + _ce([0.5, -1.0, 2.0], 0) + _ce([0.0, 0.0, 3.0], 1)) / 3
    assert sft.token_loss(logits, labels, weights).item() == pytest.approx(expected, rel=1e-6)
    # weights: position 1 counts three times
    weights = torch.tensor([[0.0, 3.0, 1.0, 1.0]])
    expected = (3 * _ce([1.0, 2.0, 0.0], 2) + _ce([0.5, -1.0, 2.0], 0) + _ce([0.0, 0.0, 3.0], 1)) / 5
    assert sft.token_loss(logits, labels, weights).item() == pytest.approx(expected, rel=1e-6)


def test_token_loss_weights_per_sample_and_ignores_non_targets():
    examples = random_examples([6, 9], seed=3)
    examples[1] = sft.Example(examples[1].input_ids, examples[1].loss_mask, 3.0)
    batch = sft.collate_packed(examples, [[0, 1]], max_tokens=20, pad_id=0)
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(1, 20, 128, generator=g, requires_grad=True)
    loss = sft.token_loss(logits, batch.labels, batch.weights)
    # per-sample means, combined by weight x target count
    means, counts = [], []
    for i in range(2):
        seg = batch.segment_ids[0] == i
        lab = batch.labels[0].clone()
        lab[~seg] = -100
        w = torch.where(lab != -100, 1.0, 0.0)[None]
        means.append(sft.token_loss(logits.detach(), lab[None], w).item())
        counts.append(int((lab[1:] != -100).sum()))
    expected = (means[0] * counts[0] + 3 * means[1] * counts[1]) / (counts[0] + 3 * counts[1])
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    # logits that predict non-targets (prompt, sample boundaries, padding) get no gradient
    loss.backward()
    non_target = torch.cat([batch.labels[0, 1:] == -100, torch.tensor([True])])
    assert logits.grad[0, non_target].abs().max().item() == 0.0
    assert logits.grad[0, ~non_target].abs().sum(-1).min().item() > 0.0
    changed = logits.detach().clone()
    changed[0, non_target] += 100.0 * torch.randn(int(non_target.sum()), 128, generator=g)
    assert sft.token_loss(changed, batch.labels, batch.weights).item() == pytest.approx(loss.item(), rel=1e-6)


def test_token_loss_no_targets_is_zero():
    logits = torch.randn(1, 4, 5, requires_grad=True)
    loss = sft.token_loss(logits, torch.full((1, 4), -100), torch.zeros(1, 4))
    assert loss.item() == 0.0
    loss.backward()


# --------------------------------------------------------------------------- packing


LENGTHS = [50, 300, 120, 80, 260, 30]


def test_pack_covers_each_once_within_budget():
    examples = random_examples(LENGTHS)
    rows = sft.pack(examples, max_tokens=300)
    assert sorted(i for row in rows for i in row) == list(range(len(LENGTHS)))
    assert all(sum(LENGTHS[i] for i in row) <= 300 for row in rows)
    assert len(rows) == 3  # 840 tokens: 300 | 260+30 | 120+80+50
    packed = sft.collate_packed(examples, rows, max_tokens=300, pad_id=0)
    padded = sft.collate_padded(examples, pad_id=0)
    assert packed.n_samples == padded.n_samples == len(LENGTHS)
    assert sft.padding_fraction(packed) == pytest.approx(60 / 900)
    assert sft.padding_fraction(padded) == pytest.approx(960 / 1800)
    assert sft.padding_fraction(packed) < sft.padding_fraction(padded)
    # same targets either way
    assert int((packed.labels != -100).sum()) == int((padded.labels != -100).sum())


def test_pack_rejects_too_long_example():
    with pytest.raises(ValueError):
        sft.pack(random_examples([10, 40]), max_tokens=32)
    with pytest.raises(ValueError):
        sft.collate_packed(random_examples([10, 30]), [[0, 1]], max_tokens=32, pad_id=0)


def test_mask_drafts_makes_a_rejected_program_context_and_keeps_its_fix_a_target(tok):
    """A self-corrected trajectory: the failing first draft (its reflection grades tool effectiveness poor) is
    masked with mask_drafts, the fix and everything else the policy wrote stay targets."""
    from coa.format import draft_spans
    from coa.train.data import encode_example

    draft, fix = "print(1/0)", "print(1)"
    response = (f"<plan>p</plan>\n<think>t</think>\n<code>```python\n{draft}\n```</code>\n"
                "<observation>ZeroDivisionError</observation>\n<reflection>information conflict: good\n"
                "tool effectiveness: poor\ntrajectory monitoring: average\nfix it</reflection>\n"
                f"<code>```python\n{fix}\n```</code>\n<observation>1\n</observation>\n"
                "<reflection>information conflict: good\ntool effectiveness: good\ntrajectory monitoring: good\nok"
                "</reflection>\n<think>done</think>\n<answer>\\boxed{1}</answer>")
    assert len(draft_spans(response)) == 1
    plain = encode_example(tok, "P:", response)
    masked = encode_example(tok, "P:", response, mask_drafts=True)
    assert plain.input_ids == masked.input_ids
    dropped = [i for i, (a, b) in enumerate(zip(plain.loss_mask, masked.loss_mask, strict=True)) if a != b]
    text = tok.decode([plain.input_ids[i] for i in dropped])
    assert draft in text and fix not in text and "<code>" in text
    assert all(plain.loss_mask[i] == 1 and masked.loss_mask[i] == 0 for i in dropped)
