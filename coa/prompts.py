"""The one prompt builder: what the policy is shown for a task, in SFT, rollouts, filters and eval alike.

    messages = build_messages(question, "web")    # [{"role": "system", ...}, {"role": "user", ...}]
    text = render_prompt(tokenizer, question, "web")  # chat template + assistant header: what the policy continues
    system_prompt("math")

The system text names the tools of the domain and the format's rules; the user turn is the question.
"""

from __future__ import annotations

from coa.format import ALLOWED_TOOLS
from coa.tools.spec import BY_TAG, CODE

_FLOW = {
    "web": ("Start with <plan>. Think in <think>, call tools, and grade your progress in <reflection> "
            "(information conflict, tool effectiveness, trajectory monitoring: good, average or poor; any poor "
            "means a new <plan>). Propose <suggested_answer>, check it in <double_check> with score: 1-4 "
            "(3 or more: give <answer>; 2 or less: re-plan)."),
    "math": (f"Start with <plan>, then repeat <think>, <{CODE.tag}>, <observation>, <reflection>; finish with "
             "<think> and <answer> holding \\boxed{the number}."),
    "code": (f"Start with <plan>, then repeat <think>, <{CODE.tag}>, <observation>, <reflection>; finish with "
             "<think> and <answer> holding the complete function in a ```python fence."),
}


def system_prompt(domain: str) -> str:
    if domain not in _FLOW:
        raise ValueError(f"unknown domain {domain!r}; expected one of {sorted(_FLOW)}")
    tools = "\n".join(f"- {BY_TAG[t].usage}" for t in ALLOWED_TOOLS[domain])
    return f"You are an agent that solves tasks step by step with tools.\nTools:\n{tools}\n{_FLOW[domain]}"


def build_messages(question: str, domain: str) -> list[dict[str, str]]:
    """The chat messages of a task's prompt: the domain's system text and the question."""
    return [{"role": "system", "content": system_prompt(domain)}, {"role": "user", "content": question}]


def render_prompt(tokenizer, question: str, domain: str) -> str:
    """The prompt as text the policy continues: the tokenizer's chat template with the assistant header."""
    return tokenizer.apply_chat_template(build_messages(question, domain), tokenize=False, add_generation_prompt=True)
