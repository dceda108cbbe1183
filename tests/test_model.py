from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from coa import model as M
from coa.config import load_params

TEXTS = ["Marta Kellon was born in Varnholt in 1961.", "Orvane Labs is headquartered in Tesk."] * 50


def test_tokenizer_keeps_tags_whole_and_round_trips():
    tok = M.train_tokenizer(TEXTS, vocab_size=600, min_frequency=2)
    text = "<think>plan it</think>\n<code>```python\nprint(1)\n```</code><observation>1</observation>"
    ids = tok(text)["input_ids"]
    assert tok.decode(ids) == text
    for tag in ("<think>", "</think>", "<code>", "</observation>"):
        assert tok.convert_ids_to_tokens(tok.convert_tokens_to_ids(tag)) == tag
        assert tok.convert_tokens_to_ids(tag) in ids
    assert len(tok) <= 600
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True,
                                   tokenize=False) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_tokenizer_training_is_deterministic():
    a = M.train_tokenizer(TEXTS, vocab_size=600, min_frequency=2)
    b = M.train_tokenizer(TEXTS, vocab_size=600, min_frequency=2)
    assert a.get_vocab() == b.get_vocab()


def test_tiny_model_size_seed_and_save_load(repo_root, tmp_path):
    cfg = load_params(repo_root / "params.yaml").base.tiny
    tok = M.train_tokenizer(TEXTS, vocab_size=4096, min_frequency=2)
    model = M.build_tiny_model(tok, cfg, seed=3)
    assert 5e5 < M.n_params(model) < 8e6  # tiny: ~1.3M at the default vocab of 4,096, less on this small one
    same = M.build_tiny_model(tok, cfg, seed=3)
    other = M.build_tiny_model(tok, cfg, seed=4)
    w = "model.layers.0.self_attn.q_proj.weight"
    assert torch.equal(model.state_dict()[w], same.state_dict()[w])
    assert not torch.equal(model.state_dict()[w], other.state_dict()[w])
    M.save_pretrained(model, tok, tmp_path / "m", {"base": {"kind": "tiny"}})
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "m")
    loaded_tok = AutoTokenizer.from_pretrained(tmp_path / "m")
    assert json.loads((tmp_path / "m" / M.RESOLVED_CONFIG).read_text()) == {"base": {"kind": "tiny"}}
    sample = "Marta Kellon was born in 1961.\n<think>so 1961</think> it's 42 o'clock"
    assert loaded_tok(sample)["input_ids"] == tok(sample)["input_ids"]  # the reloaded tokenizer is the trained one
    assert [t for t in tok.tokenize(" in 1961") if t.strip("Ġ")] == ["Ġin", "1", "9", "6", "1"]  # digits one by one
    ids = torch.tensor([loaded_tok("Marta Kellon")["input_ids"]])
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, loaded(ids).logits, atol=1e-6)
    assert loaded.config.eos_token_id == loaded_tok.convert_tokens_to_ids(M.IM_END)


@pytest.mark.slow
def test_smollm2_converts_to_a_loadable_checkpoint_that_answers(tmp_path):
    model, tok = M.load_smollm2()
    M.save_pretrained(model.to(torch.bfloat16), tok, tmp_path / "ref", {})
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "ref", dtype=torch.float32)
    loaded_tok = AutoTokenizer.from_pretrained(tmp_path / "ref")
    saved = json.loads((tmp_path / "ref" / "config.json").read_text())
    assert "quantization_config" not in saved  # a plain checkpoint: reloads unpacked, vLLM takes it
    assert 130e6 < M.n_params(loaded) < 140e6
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    inputs = loaded_tok.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = loaded.generate(**inputs, max_new_tokens=12, do_sample=False)
    assert "Paris" in loaded_tok.decode(out[0][inputs["input_ids"].shape[1]:])
