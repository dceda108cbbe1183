"""sft: observation-masked fine-tuning of the base policy on the distilled trajectories -> models/sft/.

    dvc repro sft
    python -m stages.sft --trajectories data/trajectories.parquet --heldout data/heldout.parquet \\
        --base models/base --checkpoints .cache/sft --out models/sft --metrics metrics/sft.json \\
        --plots plots/sft_loss.json

Each trajectory is trained as render_prompt(question, domain) + trajectory + eos; the loss falls on the
policy's own tokens only (coa.train.data), weighted by the trajectory's weight. The training loop is
coa.train.sft.train_sft; every `sft.checkpoint_every` steps it writes a resumable checkpoint under
`--checkpoints`, so a killed run started again continues where it stopped (and ends bitwise equal);
the folder is removed once the model is written. Step metrics (loss, lr, grad norm, tokens/s) go to
MLflow and the loss curve to `--plots`; `heldout.*` metrics are coa.eval.diagnostics.teacher_forced on
`--heldout` (teacher trajectories of eval tasks, never trained on): token, answer and copied-token
accuracy, run on the model as it trained (under DeepSpeed every rank its share, on its GPU, in the training dtype,
the lm head in `sft.logprob_chunk` chunks); the model is logged and registered as `sft.register_as`.

Many GPUs: set `sft.deepspeed.enabled: true` and `dist_backend: nccl` (configs/paper.yaml), then

    deepspeed --num_gpus 8 --module stages.sft <the arguments above>
    torchrun --nproc-per-node 8 -m stages.sft <the arguments above>

Every rank trains its share of each step; rank 0 alone writes the outputs and logs to MLflow.
"""

from __future__ import annotations

import logging
import time

from coa.config import derive_seed
from coa.device import compute_facts, default_device, resolve_dtype
from coa.eval.diagnostics import teacher_forced
from coa.io import read_table
from coa.train.sft import encode_trajectories, train_sft, zero_settings
from coa.train.zero import run_then_exit
from schemas import Trajectory
from stages._train import TrainingStage

log = logging.getLogger("coa")


def main(argv: list[str] | None = None) -> None:
    inputs = {"trajectories": "SFT trajectories (parquet)", "base": "starting policy folder",
              "heldout": "teacher trajectories of eval tasks, never trained on (parquet): diagnostics",
              "checkpoints": "resume checkpoints folder (removed after a finished run)"}
    st = TrainingStage("sft", argv, inputs=inputs,
                       outputs={"out": "the fine-tuned policy (HF folder)", "metrics": "figures (JSON)",
                                "plots": "loss curve (JSON rows: step, loss, lr, grad_norm, epoch)"})
    with st:
        cfg, seed = st.cfg, st.params.common.seed
        records = read_table(st.args.trajectories, Trajectory).sort("task_id").select(
            "task_id", "domain", "prompt", "trajectory", "weight").to_dicts()
        if not records:
            raise SystemExit(f"{st.args.trajectories}: no trajectories to train on; "
                             "check the distill stage's filters")
        model, tok = st.load(st.args.base, zero_settings(cfg))
        st.compute = compute_facts(resolve_dtype(cfg.dtype, default_device(), train=True))  # train_sft's autocast dtype
        start = time.perf_counter()
        examples, truncated = encode_trajectories(tok, records, cfg.max_len, mask_drafts=cfg.mask_drafts)
        log.info("sft: %d trajectories tokenised in %.1f s (%d tokens)", len(examples),
                 time.perf_counter() - start, sum(map(len, examples)))
        if truncated:
            log.warning("sft: %d of %d trajectories are longer than sft.max_len=%d tokens and were cut",
                        truncated, len(examples), cfg.max_len)
        result = train_sft(model, examples, cfg, seed=derive_seed(seed, "sft"), pad_id=tok.pad_token_id,
                           ckpt_dir=st.args.checkpoints, log_fn=st.log_fn)
        heldout = read_table(st.args.heldout, Trajectory).sort("task_id").to_dicts()
        if {r["task_id"] for r in heldout} & {r["task_id"] for r in records}:
            raise SystemExit(f"{st.args.heldout} shares tasks with {st.args.trajectories}: it must hold eval tasks only")
        # the diagnostics where the model trained: every rank its share, on its device, in the training dtype
        figures = teacher_forced(result.trained, tok, heldout, cfg.max_len, chunk=cfg.logprob_chunk, share=True)
        result.trained = None
        if not st.main_rank:
            return

        out = st.save(result, tok, st.args.base, "base_model")
        metrics = result.metrics(examples, truncated, [r["domain"] for r in records])
        metrics.update({f"heldout.{k}": v for k, v in figures.items()})
        log.info("sft: %d steps, %.0f tokens/s, loss %.3f -> %.3f", result.steps, result.tokens_per_s,
                 result.first_loss, result.final_loss)
        st.done(out, metrics)


if __name__ == "__main__":
    run_then_exit(main)  # ranks end without the interpreter's finalization (coa.train.zero)
