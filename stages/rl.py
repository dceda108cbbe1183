"""rl: the teacher team's trajectories of fresh RL tasks, then DAPO on multi-turn tool rollouts of the solve-filtered
RL tasks, from the SFT policy -> models/rl/.

    dvc repro rl
    python -m stages.rl --tasks data/tasks.parquet --rl-tasks data/rl_tasks.parquet \\
        --difficulty data/difficulty.parquet --policy models/sft --index data/index --checkpoints .cache/rl \\
        --out models/rl --web data/web/rl --teacher data/teacher/rl --metrics metrics/rl.json --plots plots/rl_reward.json

First, with `rl.teach.tasks`, the teacher team (distill.teacher) solves that many fresh RL-split tasks per domain
and the SFT policy trains on its correct trajectories with the sft loop (coa.train.teach: sft's settings, rl.teach's
lr, epochs and layers; checkpoints under --checkpoints/teach); DAPO starts from there. Then every step rolls out `rl.prompts_per_step` x `rl.rollouts_per_prompt` trajectories of the current policy
with its tools (common.agent limits), rewards each with coa.rewards.reward (correct x format, soft overlong
punishment, optional repeated-call penalty; web answers by exact match, or the LLM judge of common.judge),
keeps the groups whose rewards differ (dynamic sampling, up to `max_gen_batches` rounds) and takes
`mini_batches` clip-higher token-mean policy-gradient steps (coa.train.dapo). The reward curve is of every
rollout of a step, before group filtering. Engine `hf` rolls out the trained weights themselves; `vllm`
gets them after every step. Checkpoints every `checkpoint_every` steps under --checkpoints; a killed run
started again resumes there. At the end the RL policy answers `heldout_tasks` eval-split tasks per
domain, and KL(RL || SFT) per token is measured on those rollouts where the policy trained (under DeepSpeed every
rank its share on its GPU, in the training dtype: coa.train.dapo.heldout). The model is registered as
`rl.register_as` (coa-policy).

Many GPUs (configs/paper.yaml: `rl.deepspeed` ZeRO-3 over NCCL, `rl.engine.kind: vllm`): `dvc repro rl` launches
`rl.deepspeed.processes` ranks itself (coa.launch), or run it under `deepspeed --num_gpus 8 --module stages.rl`.
Each rank rolls out its share of a step's groups with its engine (coa.train.dapo.engine), which gets the trained
weights module by module after every step; rank 0 alone writes the outputs and logs; every rank measures its share
of the held-out KL.
"""

from __future__ import annotations

import logging

import polars as pl

from coa.config import derive_seed
from coa.device import compute_facts, resolve_dtype
from coa.io import first_per_domain, read_table
from coa.prompts import render_prompt
from coa.rewards import RewardSpec, check_limits
from coa.rollout.types import Request, Sampling
from coa.runtime import agent_limits, judge_from, tools_factory
from coa.teacher.run import make_teacher
from coa.teacher.scores import close_scores
from coa.tools.webcache import close_store, stage_store
from coa.train.dapo import reference_model, reward_score, train_dapo
from coa.train.dapo.engine import close_engine, rl_engine
from coa.train.dapo.guided import guided_from
from coa.train.dapo.heldout import trained_kl
from coa.train.dapo.ranks import check_launch, zero_settings
from coa.train.teach import check_teach, teach, teach_pool
from coa.train.zero import run_then_exit
from schemas import Task, TaskStats
from stages._train import TrainingStage

log = logging.getLogger("coa")


def main(argv: list[str] | None = None) -> None:
    inputs = {"tasks": "curated tasks (parquet)", "rl_tasks": "solve_filter stats (parquet)",
              "difficulty": "the difficulty stage's stats (parquet): rl.teach's web tasks are those it kept",
              "policy": "the SFT policy (HF folder)", "index": "search index folder",
              "checkpoints": "resume checkpoints folder (removed after a finished run)"}
    st = TrainingStage("rl", argv, inputs=inputs, sections=("distill", "sft"),  # rl.guide's teacher; rl.teach's loop
                       outputs={"out": "the RL policy (HF folder)", "metrics": "figures (JSON)",
                                "plots": "reward curve (JSON rows per step)", "web": "web_cache store (folder)",
                                "teacher": "the LLM teacher's scores (folder; rl.guide.scores)"})
    with st:
        cfg, agent = st.cfg, st.params.common.agent
        check_launch(cfg)  # one line for a launch that cannot work, before any model loads
        check_teach(cfg)
        store = stage_store(st.params.common.tools.web_cache, st.args.web)  # every rank records (atomic writes)
        tools = tools_factory(st.params.common.tools, st.args.index, store)  # a strict sandbox refuses here, as early
        seed = derive_seed(st.params.common.seed, "rl")
        tasks = read_table(st.args.tasks, Task).sort("task_id")
        stats = read_table(st.args.rl_tasks, TaskStats)
        kept = set(stats.filter(pl.col("kept"))["task_id"])
        train = tasks.filter(pl.col("task_id").is_in(kept)).to_dicts()
        if not train:
            raise SystemExit(f"{st.args.rl_tasks}: no RL tasks kept; the SFT policy solved every task k/k or "
                             "0/k (see metrics/solve_filter.json; solve_filter.drop_unsolved: false keeps 0/k)")
        model, tok = st.load(st.args.policy, zero_settings(cfg))  # ZeRO-3: each rank loads its shard
        taught = None
        if cfg.teach.on:  # the team's trajectories of fresh RL-split tasks, the sft loop, before DAPO
            kept_web = read_table(st.args.difficulty, TaskStats).filter(pl.col("kept"))["task_id"]
            pool = teach_pool(tasks, kept_web, stats["task_id"], cfg.teach.tasks)
            teacher = make_teacher(st.params.distill, st.params.common.tools, st.args.index, store)
            result, taught = teach(model, tok, pool, teacher, st.params.sft, cfg.teach, seed=derive_seed(seed, "teach"),
                                   ckpt_dir=f"{st.args.checkpoints}/teach", log_fn=st.log_fn_of("teach"))
            model = result.model
            log.info("rl: taught on %d team trajectories of %d fresh tasks in %.0f s, loss %.3f -> %.3f",
                     taught["examples"], len(pool), taught["train_s"], taught["first_loss"], taught["final_loss"])
        # the update's dtype, resolved where train_dapo resolves it (the policy's device)
        st.compute = compute_facts(resolve_dtype(cfg.dtype, next(model.parameters()).device, train=True))
        engine = rl_engine(cfg, st.args.policy, model, tok)  # hf beside the model, or vLLM per rank
        ref = reference_model(st.args.policy, cfg)  # None unless rl.kl_coef > 0; under ZeRO-3 sharded
        judge = judge_from(st.params.common.judge)
        score = reward_score(RewardSpec.of(cfg, agent.max_total_tokens, check_limits(st.params.common.tools)), judge)
        guided = guided_from(cfg.guide, st.params.distill, st.params.common.tools, st.args.index, tok, seed,
                             agent.max_total_tokens, store, judge, st.args.teacher)  # the teacher on the student's states

        result = train_dapo(model, tok, train, cfg, engine=engine, limits=agent_limits(agent), tools_factory=tools,
                            score=score, render=lambda t: render_prompt(tok, t["question"], t["domain"]),
                            seed=seed, ckpt_dir=st.args.checkpoints, log_fn=st.log_fn, ref_model=ref, guided=guided)
        # KL(RL || SFT) on held-out rollouts of the RL policy (eval-split tasks, never trained on): rank 0 rolls them
        # out, every rank scores its share where it trained (coa.train.dapo.heldout), the engines closed first
        heldout = first_per_domain(tasks.filter(pl.col("split") == "eval"), cfg.heldout_tasks).to_dicts() \
            if cfg.heldout_tasks else []
        rollouts = []
        if heldout and st.main_rank:
            requests = [Request(f"{t['task_id']}#0", render_prompt(tok, t["question"], t["domain"]), t["domain"],
                                t["question"]) for t in heldout]
            rollouts = engine.rollout(requests, Sampling(temperature=cfg.temperature, top_p=cfg.top_p, seed=seed),
                                      agent_limits(agent), tools)
        rate = engine.throughput() if st.main_rank else None  # decode steps per batch size: bench/rollout.py --stages
        close_engine(engine)
        kl = trained_kl(result.trained, st.args.policy, cfg, rollouts, tok.pad_token_id) if heldout else float("nan")
        result.trained = None
        if not st.main_rank:
            return

        out = st.save(result, tok, st.args.policy, "sft_model")
        metrics = {**result.metrics(len(train), len(heldout), kl), "policy_tokens_per_s": rate["policy_tokens_per_s"],
                   "engine": rate, "web": close_store(store),  # the main rank's requests
                   "teacher": close_scores(guided.teacher if guided else None, st.args.teacher),
                   **({"teach": taught} if taught else {})}
        log.info("rl: %d steps, reward %.3f -> %.3f (first/last fifth), KL(RL||SFT) %.4f", result.steps,
                 metrics["reward_first_fifth"], metrics["reward_last_fifth"], kl)
        # tagged with the md5 DVC records for models/rl: `coa promote` finds this version by it
        st.done(out, metrics)


if __name__ == "__main__":
    run_then_exit(main)  # ranks end without the interpreter's finalization (coa.train.zero)
