"""What the training stages (sft, rl) share beyond every stage's Stage: the ranks, the model loaded for ZeRO-3,
the step log, and the trained model written, registered and its checkpoints dropped.

    st = TrainingStage("sft", argv, inputs=..., outputs=...)    # argv without a launcher's --local_rank
    with st:                                                     # rank 0 alone opens the MLflow run
        model, tok = st.load(st.args.base, zero_settings(cfg))   # ZeRO-3: each rank loads its shard
        result = train_sft(..., log_fn=st.log_fn)                # None on the other ranks
        if not st.main_rank:
            return
        out = st.save(result, tok, st.args.base, "base_model")   # the model, the resolved config, the plot rows
        st.done(out, metrics)                                    # register, metrics, checkpoints removed

Every rank trains its share of each step; rank 0 alone writes the outputs and logs to MLflow.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

from coa.config import to_dict
from coa.io import write_json
from coa.model import load_pretrained
from coa.train.kit import save_trained
from coa.train.zero import zero3_loading
from stages._stage import Stage


class TrainingStage(Stage):
    """A Stage run by every rank of a launch (see the module docstring); ``main_rank``: rank 0."""

    def __init__(self, name: str, argv: list[str] | None, outputs: dict[str, str],
                 inputs: dict[str, str] | None = None, sections: tuple[str, ...] = ()) -> None:
        # the deepspeed launcher appends --local_rank=N unless given --no_local_rank; LOCAL_RANK is in the env
        argv = [a for a in (sys.argv[1:] if argv is None else argv) if not a.startswith("--local_rank")]
        super().__init__(name, argv, outputs=outputs, inputs=inputs, sections=sections)
        self.main_rank = int(os.environ.get("RANK", "0")) == 0
        self.cfg = self.params.section(name)

    def __enter__(self) -> TrainingStage:
        return super().__enter__() if self.main_rank else self

    def __exit__(self, *exc: Any) -> bool:
        return super().__exit__(*exc) if self.main_rank else False

    def load(self, path: str, settings: dict[str, Any]) -> tuple[Any, Any]:
        """(model, tokenizer) of the folder ``path``; under ZeRO-3 each rank loads only its shard (``settings``:
        the trainer's, for coa.train.zero.deepspeed_config)."""
        hold = zero3_loading(self.cfg.deepspeed, self.name, **settings)
        model, tok = load_pretrained(path)
        del hold
        return model, tok

    @property
    def log_fn(self) -> Any:
        """The trainer's step log (MLflow, under ``train.``) on rank 0; None on the other ranks."""
        return self.log_fn_of("train")

    def log_fn_of(self, prefix: str) -> Any:
        """A step log under ``prefix.`` (MLflow) on rank 0; None on the other ranks."""
        def log_step(step: int, metrics: dict[str, float]) -> None:
            self.run.log_metrics({prefix: metrics}, step=step)

        return log_step if self.main_rank else None

    def save(self, result: Any, tok: Any, parent: str, parent_key: str) -> Path:
        """Write the trained model (``result.model``) with the resolved config (common, the stage's section and,
        under ``parent_key``, the starting model's) to ``--out``, and the trainer's plot rows to ``--plots``."""
        out = save_trained(result.model, tok, self.args.out, {"common": to_dict(self.params.common),
                                                              self.name: to_dict(self.cfg)}, parent, parent_key)
        write_json(self.args.plots, result.plot_rows())
        return out

    def done(self, out: Path, metrics: dict[str, Any], tags: dict[str, str] | None = None) -> None:
        """Register ``out`` as the section's ``register_as`` (with ``tags``), write the metrics, drop the
        resume checkpoints of the finished run."""
        self.register(out, self.cfg.register_as, tags)
        self.finish(metrics)
        shutil.rmtree(self.args.checkpoints, ignore_errors=True)
