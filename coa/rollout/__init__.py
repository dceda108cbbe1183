"""Multi-turn agent rollouts over one Engine protocol; engines: hf (transformers), vllm, openai (HTTP), all made
in coa.rollout.engines (make_engine from arguments, engine_from from an `engine:` params section).

    from coa.rollout import make_engine, Request, Sampling, Limits
    from coa.tools.session import ToolSession, build_tools
    engine = make_engine("hf", "models/base", max_batch=32)
    tools = build_tools(params.common.tools, index_dir="data/index")
    requests = [Request(f"{t['task_id']}#{i}", render_prompt(engine.tokenizer, t["question"], t["domain"]),
                        t["domain"]) for t in tasks for i in range(4)]
    rollouts = engine.rollout(requests, Sampling(temperature=1.0, seed=0), Limits(max_turns=8),
                              tools=lambda request: ToolSession(tools, max_chars=1536))
    rollouts[0].response_ids, rollouts[0].loss_mask, rollouts[0].logprobs, rollouts[0].finish

    make_engine("vllm", "models/sft", gpu_memory_utilization=0.5)          # in-process vLLM (GPU)
    make_engine("openai", "models/sft", base_url="http://127.0.0.1:8000/v1", served="sft")  # a vLLM server

The policy continues the rendered prompt until a closing tool tag, ``</answer>`` or eos; a tool tag runs
the tool (``tools(request)``, one session per trajectory) and appends ``"\\n<observation>" + obs +
"</observation>\\n"``; the loop repeats within the limits. See :mod:`coa.rollout.loop` for the shared
state machine and :mod:`coa.rollout.types` for what comes back.
"""

from __future__ import annotations

from coa.rollout.engines import ENGINES, make_engine
from coa.rollout.types import (
    FINISH_REASONS,
    TRUNCATED,
    Engine,
    Limits,
    Request,
    Rollout,
    Sampling,
    ToolCaller,
    ToolsFactory,
)

__all__ = ["ENGINES", "FINISH_REASONS", "TRUNCATED", "Engine", "Limits", "Request", "Rollout", "Sampling",
           "ToolCaller", "ToolsFactory", "make_engine"]

