"""The one prompt builder: per-domain tools and rules, rendered with the policy's chat template."""

from __future__ import annotations

import pytest

from coa.model import train_tokenizer
from coa.prompts import build_messages, render_prompt, system_prompt


def test_each_domain_names_only_its_tools():
    web, math, code = system_prompt("web"), system_prompt("math"), system_prompt("code")
    assert "<web_search>" in web and "<crawl_page>" in web and "<code>" not in web
    assert "<code>" in math and "<web_search>" not in math and "\\boxed" in math
    assert "```python" in code and "<double_check>" in web and "<double_check>" not in code
    with pytest.raises(ValueError, match="unknown domain"):
        system_prompt("chess")


def test_messages_and_rendering():
    messages = build_messages("Who founded Orvane Labs?", "web")
    assert [m["role"] for m in messages] == ["system", "user"] and messages[1]["content"] == "Who founded Orvane Labs?"
    tok = train_tokenizer(["Who founded Orvane Labs? The founder is Ada Quill."] * 20, vocab_size=300, min_frequency=1)
    text = render_prompt(tok, "Who founded Orvane Labs?", "web")
    assert text.endswith("<|im_start|>assistant\n") and "Who founded Orvane Labs?" in text
    assert system_prompt("web") in text
