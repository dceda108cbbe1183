"""vLLM's weight sync started as on a CUDA node: vLLM's processes spawned, not forked, from a module run with
``python -m`` (how the stages run), for tests/rollout/test_vllm.py. With CUDA initialised in the parent vLLM forces
``spawn`` (vllm/utils/system_utils.py, ``_maybe_force_spawn``: a CUDA context does not survive a fork); a spawned
process imports the parent's main module again (as ``__mp_main__``), so it must import without side effects and
everything the workers run must be importable by name (the worker extension coa.rollout.vllm_worker.WeightSync).

    python -m tests.rollout.vllm_spawn OUT       # in .venv-vllm; writes OUT/spawn.json
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
from pathlib import Path


def main(out: Path) -> None:
    os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"  # what CUDA forces, on vLLM's CPU build
    from coa.model import save_pretrained
    from coa.rollout import Limits, Sampling
    from tests.rollout.conftest import Recorder, make_requests, vllm_engine
    from tests.rollout.scripted import ANSWER_SCRIPT, WEB_SCRIPT, make_tokenizer, scripted_qwen2

    tok = make_tokenizer()
    web, answer = scripted_qwen2(tok, WEB_SCRIPT), scripted_qwen2(tok, ANSWER_SCRIPT)
    save_pretrained(web, tok, out / "web", {})
    engine = vllm_engine(out / "web")
    try:
        greedy, limits = Sampling(temperature=0.0), Limits(max_turns=3, max_tool_calls=2, max_turn_tokens=16)
        before = engine.weight_checksum()
        searched = [r.n_tool_calls for r in engine.rollout(make_requests(tok, 2), greedy, limits, Recorder())]
        engine.sync(answer)
        answered = [r.n_tool_calls == 0 and bool(r.answer)
                    for r in engine.rollout(make_requests(tok, 2, prefix="s"), greedy, limits, Recorder())]
        report = {"method": os.environ["VLLM_WORKER_MULTIPROC_METHOD"], "main": sys.modules["__main__"].__spec__.name,
                  "start_method": multiprocessing.get_start_method(allow_none=True), "searched": searched,
                  "answered": answered, "moved": engine.weight_checksum() != before}
    finally:
        engine.close()
    (out / "spawn.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
