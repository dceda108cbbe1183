"""base: the policy's starting model and tokenizer -> models/base/; the closed-book reference -> models/reference/.

    dvc repro base
    python -m stages.base --tasks data/tasks.parquet --corpus data/corpus.parquet \\
        --out models/base --reference models/reference --metrics metrics/base.json

`base.kind`: smollm2 (SmolLM2-135M-Instruct, the embedded default), hf (a local model folder under
`base.model_dir`), or tiny (the test suite's smoke runs: a tokenizer trained on the corpus and the sft/rl
questions, never the eval split, and a Qwen2 model with a seeded random init).
`base.reference: smollm2` converts SmolLM2-135M-Instruct for the difficulty filter.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import torch

from coa import model as M
from coa.config import derive_seed, to_dict
from coa.device import compute_facts
from coa.format import TAGS
from coa.io import read_table
from coa.prompts import system_prompt
from schemas import Document, Task
from stages._stage import Stage

log = logging.getLogger("coa")


def tokenizer_texts(tasks: pl.DataFrame, corpus: pl.DataFrame) -> Iterator[str]:
    """What the tokenizer learns from: pages, and sft/rl questions, answers and tests (no eval), and each
    training task's system text, as often as training shows it (once per task): its words become whole
    tokens (at vocab 4,096 a math example, system text to answer, drops from 613 to 508 tokens; code 701 -> 603,
    web 1,392 -> 1,262)."""
    yield from corpus["title"]
    yield from corpus["text"]
    train = tasks.filter(pl.col("split") != "eval")
    yield from train["question"]
    yield from (system_prompt(domain) for domain in train["domain"])
    for answers, tests in zip(train["answers"], train["tests"], strict=True):
        yield from answers
        yield from tests
    # the format's own scaffolding, so its frequent neighbours (newlines, fences) merge well
    yield "\n".join(f"<{t}>\n</{t}>" for t in TAGS) + "\n```python\nprint()\n```\n"


def main(argv: list[str] | None = None) -> None:
    inputs = {"tasks": "curated tasks (parquet)", "corpus": "documents (parquet)"}
    outputs = {"out": "the starting policy (HF folder)", "reference": "closed-book reference (HF folder)",
               "metrics": "figures (JSON)"}
    with Stage("base", argv, outputs=outputs, inputs=inputs) as st:
        cfg, seed = st.params.base, st.params.common.seed
        resolved = {"common": to_dict(st.params.common), "base": to_dict(cfg)}
        out = Path(st.args.out)
        shutil.rmtree(out, ignore_errors=True)
        if cfg.kind == "tiny":
            tasks = read_table(st.args.tasks, Task)
            corpus = read_table(st.args.corpus, Document)
            tok = M.train_tokenizer(tokenizer_texts(tasks, corpus), cfg.tokenizer.vocab_size, cfg.tokenizer.min_frequency)
            model = M.build_tiny_model(tok, cfg.tiny, derive_seed(seed, "base", "init"))
        elif cfg.kind == "hf":
            model, tok = M.load_pretrained(Path(cfg.model_dir) / cfg.hf_path)
        else:
            model, tok = M.load_smollm2()
        st.compute = compute_facts(next(model.parameters()).dtype)  # the dtype of the weights written
        M.save_pretrained(model, tok, out, resolved)
        metrics = {"params": M.n_params(model), "vocab_size": len(tok), "kind": cfg.kind}
        log.info("base: %s model, %.2fM parameters, vocabulary %d", cfg.kind, metrics["params"] / 1e6, len(tok))

        ref = Path(st.args.reference)
        shutil.rmtree(ref, ignore_errors=True)
        if cfg.reference == "smollm2":
            if cfg.kind == "smollm2":
                shutil.copytree(out, ref)
            else:
                ref_model, ref_tok = M.load_smollm2()
                # bf16 halves the checkpoint; the reference only ever samples
                M.save_pretrained(ref_model.to(torch.bfloat16), ref_tok, ref, resolved)
                metrics["reference_params"] = M.n_params(ref_model)
        else:
            ref.mkdir(parents=True)
            (ref / "README.md").write_text("No reference model: params base.reference is none.\n")
        st.finish({k: v for k, v in metrics.items() if not isinstance(v, str)})


if __name__ == "__main__":
    main()
