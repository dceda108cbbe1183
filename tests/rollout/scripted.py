"""Small models whose behaviour the rollout tests can predict.

    tok = make_tokenizer()
    model = scripted_qwen2(tok, WEB_SCRIPT)        # a real (savable) Qwen2 that follows a bigram script
    forced = ForcedLM(tok, prompt_ids + trajectory_ids)   # emits exactly these tokens, position by position

`scripted_qwen2` is a random tiny Qwen2 (untied embeddings) whose embeddings and output matrix also hold a
bigram script: after token ``a`` the tokens ``b`` of ``script[a]`` get logit ~ ``alpha * weight``, far above
the rest. Attention and MLP still add a context-dependent part (so a wrong KV cache changes the log-probs),
and tokens outside the script continue at random. Being a plain Qwen2ForCausalLM it runs in every engine
(hf, the fake completions server, vLLM from a saved folder).
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from coa import model as M
from coa.prompts import system_prompt

TEXTS = ([system_prompt(d) for d in ("web", "math", "code")] * 20
         + ["Marta Kellon was born in Varnholt in 1961.", "Orvane Labs is headquartered in Tesk."] * 50)

# After each key the policy continues with one of the values (weights are logit offsets in units of alpha):
# think, then search (more likely) or answer; an observation ends with "\n", which starts a new think.
WEB_SCRIPT: dict[str, dict[str, float]] = {
    "\n": {"<think>": 1.0},
    "<think>": {" Kellon": 1.0},
    " Kellon": {"</think>": 1.0},
    "</think>": {"<web_search>": 1.0, "<answer>": 0.95},
    "<web_search>": {" Labs": 1.0},
    " Labs": {"</web_search>": 1.0},
    "<answer>": {" Tesk": 1.0},
    " Tesk": {"</answer>": 1.0},
}
# The same, but it answers at once.
ANSWER_SCRIPT = {**WEB_SCRIPT, "</think>": {"<answer>": 1.0}}


def make_tokenizer():
    """The tiny byte-level BPE tokenizer of coa.model (tags are single tokens), trained in a few ms."""
    return M.train_tokenizer(TEXTS, vocab_size=1200, min_frequency=2)


def tid(tokenizer, text: str) -> int:
    """The id of a text that must be one token."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == 1, f"{text!r} is not one token: {ids}"
    return ids[0]


def scripted_qwen2(tokenizer, script: dict[str, dict[str, float]], *, alpha: float = 12.0,
                   context: float = 1.0, seed: int = 0) -> Qwen2ForCausalLM:
    """A tiny Qwen2 that follows ``script`` (see the module docstring); ``context`` scales how much
    attention and MLP move the logits (0: a pure bigram)."""
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, intermediate_size=128, max_position_embeddings=4096, tie_word_embeddings=False,
        bos_token_id=None, eos_token_id=tokenizer.convert_tokens_to_ids(M.IM_END),
        pad_token_id=tokenizer.pad_token_id,
    )
    gen = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    hidden = config.hidden_size
    with torch.no_grad():
        emb = torch.randn(config.vocab_size, hidden, generator=gen)
        model.model.embed_tokens.weight.copy_(emb)
        unit = emb / emb.pow(2).mean(dim=1, keepdim=True).sqrt()  # what the final RMSNorm sees, ~norm sqrt(H)
        head = torch.randn(config.vocab_size, hidden, generator=gen) * (0.3 / hidden**0.5)
        for source, targets in script.items():
            a = tid(tokenizer, source)
            for target, weight in targets.items():
                head[tid(tokenizer, target)] += alpha * weight * unit[a] / hidden
        model.lm_head.weight.copy_(head)
        for layer in model.model.layers:  # make the context matter: outputs comparable to the embeddings
            layer.self_attn.o_proj.weight.mul_(context * 20)
            layer.mlp.down_proj.weight.mul_(context * 20)
    model.generation_config.eos_token_id = [config.eos_token_id, tokenizer.convert_tokens_to_ids(M.EOS)]
    model.generation_config.pad_token_id = config.pad_token_id
    return model.eval()


class _ForcedBase(torch.nn.Module):
    def __init__(self, script: list[int], vocab: int, pad_id: int):
        super().__init__()
        self.script, self.vocab, self.pad_id = script, vocab, pad_id
        self.anchor = torch.nn.Parameter(torch.zeros(1))  # gives the module a device and dtype
        self.fed: list[tuple[int, int]] = []  # (position, token) of every real token fed

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None, **_: object):
        b, t = input_ids.shape
        if position_ids is None:
            position_ids = torch.arange(t)[None].expand(b, t)
        out = torch.full((b, t, self.vocab), -30.0)
        for i in range(b):
            for j in range(t):
                token, pos = int(input_ids[i, j]), int(position_ids[i, j])
                if token == self.pad_id:
                    continue
                self.fed.append((pos, token))
                assert self.script[pos] == token, f"fed token {token} at position {pos}, script has {self.script[pos]}"
                if pos + 1 < len(self.script):
                    out[i, j, self.script[pos + 1]] = 0.0
        return SimpleNamespace(last_hidden_state=out)


class ForcedLM(torch.nn.Module):
    """A cache-free fake causal LM that predicts ``script[p + 1]`` at position ``p`` and asserts that every
    token it is fed sits at its script position. It has the interface HFEngine uses (base_model,
    get_output_embeddings, config, generation_config)."""

    def __init__(self, tokenizer, script: list[int]):
        super().__init__()
        self.base = _ForcedBase(list(script), len(tokenizer), tokenizer.pad_token_id)
        self.config = SimpleNamespace(_attn_implementation="eager")
        self.generation_config = SimpleNamespace(eos_token_id=[tokenizer.eos_token_id])

    @property
    def base_model(self) -> _ForcedBase:
        return self.base

    def get_output_embeddings(self) -> torch.nn.Module:
        return torch.nn.Identity()
