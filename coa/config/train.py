"""The training stages' sections: sft, rl, and the DeepSpeed ZeRO settings both take.

    from coa.config import RlConfig, SftConfig
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from coa.config.engine import EngineConfig
from coa.config.kit import _help, _require


@dataclass(frozen=True)
class DeepSpeedConfig:
    enabled: bool = _help("Train through DeepSpeed ZeRO (else plain PyTorch); launch many GPUs with `deepspeed` "
                          "or `accelerate launch`.")
    zero_stage: int = _help("ZeRO stage: 1 (optimizer states), 2 (+ gradients) or 3 (+ parameters) sharded.")
    dist_backend: Literal["gloo", "nccl"] = _help("torch.distributed backend: gloo on CPU, nccl on GPUs.")
    offload_optimizer: bool = _help("Keep optimizer states in CPU memory (ZeRO-Offload).")
    processes: int = _help(
        "Ranks the stage launches itself (torch.distributed.run on this node) when it is not started under a "
        "launcher, so `dvc repro` runs it as it is: 0 = one per visible GPU (one process on a CPU).", default=0)
    timeout_minutes: int = _help(
        "Every process group's timeout (NCCL's and the gloo groups' that carry objects and barriers): how long a "
        "rank waits in a collective before the run fails. In rl the ranks wait while a step's rollouts run, so it "
        "must exceed the longest step's rollouts (a paper step: 512 web trajectories of up to 25 turns); "
        "DeepSpeed's own default is 10 minutes.", default=180)

    def __post_init__(self) -> None:
        _require(self.zero_stage in (1, 2, 3), "zero_stage", "must be 1, 2 or 3")
        _require(self.processes >= 0, "processes", "must be >= 0 (0 = one per visible GPU)")
        _require(self.timeout_minutes >= 1, "timeout_minutes", "must be >= 1 (minutes)")


@dataclass(frozen=True)
class SftConfig:
    max_len: int = _help("Longest sample in tokens (prompt + trajectory); longer ones are truncated and counted.")
    pack: bool = _help("Pack several samples per row (attention confined to each); false = one padded sample per row.")
    row_tokens: int = _help("Tokens per packed row.")
    rows_per_step: int = _help("Rows per optimizer step (per device; times gradient_accumulation).")
    gradient_accumulation: int = _help("Micro-batches per optimizer step.")
    epochs: float = _help("Passes over the trajectories (fractions allowed); the paper: 2-2.5.")
    lr: float = _help("Peak learning rate (AdamW; the paper: 1.4e-5 at 32B).")
    min_lr_ratio: float = _help("Cosine decay ends at lr * this.")
    warmup_ratio: float = _help("Share of steps with linear warm-up (the paper: 0.1).")
    weight_decay: float = _help("AdamW decoupled weight decay.")
    betas: list[float] = _help("AdamW betas.")
    grad_clip: float = _help("Clip the gradient norm to this (0 = off).")
    trainable_layers: int = _help("Train only the top N decoder layers and the final norm (embeddings and lower "
                                  "layers frozen: the backward stops there); 0 = every parameter.")
    mask_drafts: bool = _help("A code block the trajectory's own reflection rejected (a failing first draft) is "
                              "context, not a target: only the recovery is learned (coa.format.draft_spans).")
    dtype: Literal["auto", "float32", "bfloat16"] = _help(
        "Autocast dtype (float32 master weights either way); auto = bfloat16 only where native.")
    gradient_checkpointing: bool = _help(
        "Recompute each decoder layer's activations in the backward pass instead of keeping them, as rl's: a "
        "32k-token row of a 7B model needs it on an 80 GB GPU (docs/scale.md).")
    logprob_chunk: int = _help(
        "Positions per chunk when the loss turns final hidden states into cross-entropy: the lm head runs on this "
        "many at a time, in float32 per chunk, and backward recomputes them (no [targets x vocab] tensor is "
        "kept; rl.logprob_chunk's); 0 = every target at once.")
    checkpoint_every: int = _help("Steps between resumable checkpoints (model, optimizer, scheduler, data order, RNG).")
    keep_checkpoints: int = _help("Most recent checkpoints kept.")
    register_as: str = _help("MLflow registered-model name of the result.")
    deepspeed: DeepSpeedConfig = _help("ZeRO sharding (GPU clusters; runs on CPU with gloo).")

    def __post_init__(self) -> None:
        for name in ("max_len", "row_tokens", "rows_per_step", "gradient_accumulation", "checkpoint_every",
                     "keep_checkpoints"):
            _require(getattr(self, name) >= 1, name, "must be >= 1")
        _require(self.row_tokens >= self.max_len, "row_tokens", f"must be >= max_len ({self.max_len})")
        _require(self.epochs > 0, "epochs", "must be > 0")
        _require(self.lr > 0, "lr", "must be > 0")
        _require(0 <= self.min_lr_ratio <= 1, "min_lr_ratio", "must be within [0, 1]")
        _require(0 <= self.warmup_ratio < 1, "warmup_ratio", "must be within [0, 1)")
        _require(len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas), "betas",
                 "must be two numbers in [0, 1)")
        _require(self.grad_clip >= 0, "grad_clip", "must be >= 0 (0 = off)")
        _require(self.trainable_layers >= 0, "trainable_layers", "must be >= 0 (0 = every parameter)")
        _require(self.logprob_chunk >= 0, "logprob_chunk", "must be >= 0 (positions per chunk; 0 = off)")


@dataclass(frozen=True)
class GuideConfig:
    source: Literal["none", "team", "own", "logprobs"] = _help(
        "What the rl stage learns from beside DAPO's reward, on every rollout of a step: team = the teacher team's "
        "next turn(s) from the states the student visited where it did otherwise (on-policy distillation: "
        "coa.teacher.guide, the distill.teacher team with its deliberate mistakes off), own = the student's own "
        "correct rollouts (rejection-sampling fine-tuning), logprobs = an LLM teacher's log-probs of the student's own "
        "tokens (distill.teacher's endpoint, vLLM's prompt_logprobs: coa.teacher.scores), a per-token reverse-KL "
        "advantage on every rollout of the step (coa.train.dapo.distill), none = DAPO alone.")
    coef: float = _help("Weight of the guided cross-entropy (token mean over its targets) beside DAPO's loss, at the "
                        "first step; logprobs: the weight of the reverse-KL advantage beside the outcome's.")
    final_coef: float = _help("Its weight at the last step, reached linearly (the teacher's intervention annealed).")
    dapo_coef: float = _help("Weight of DAPO's policy-gradient loss (0 = the guided loss alone); logprobs: of the "
                             "outcome advantage (0 = the reverse KL alone, every rollout of one round trained).")
    interject_failed: float = _help(
        "Probability that the team takes the student's turn, in the rollout itself, at a state right after a failed or "
        "repeated call (its turn and its tool's answer prefilled; trained as cross-entropy; the rollout leaves DAPO's "
        "groups), annealed as coef is.")
    interject_other: float = _help("The same at any other state after an observation (sampled turns).")
    max_states: int = _help("Most states per rollout corrected after the fact, where the student did otherwise than "
                            "the team would, in the order `states` says (each an example in the student's context: "
                            "costs its whole context again); 0 = none.")
    takeover: bool = _help("The team goes on from a corrected state to its answer (its later turns trained too, "
                           "observations masked); false = only its next turn.")
    rows_per_step: int = _help(
        "Packed rows of the guided examples per optimizer step, after DAPO's mini-batches (as sft.rows_per_step: the "
        "team's turns trained as SFT trains, many small steps); 0 = all of them in DAPO's last mini-batch, one step.",
        default=0)
    states: Literal["first", "recovery_first"] = _help(
        "Which of a rollout's states max_states corrects: first = the earliest where the student did otherwise; "
        "recovery_first = those right after a failed or repeated call before the others (each kind earliest first): "
        "the team's fix where the student would repeat itself.", default="first")
    domains: list[str] = _help(
        "The domains whose rollouts the team (or own) corrects and interjects in; the others' rollouts train by "
        "DAPO alone, their states still judged and counted (agreement). The team's web routes cost web 10-13 "
        "points wherever they ran (docs/sizing.md).", default_factory=lambda: ["web", "math", "code"])
    scores: Literal["record", "replay"] = _help(
        "logprobs: record = the teacher scores each rollout once and its scores are kept, content-addressed, in the "
        "rl stage's data/teacher/rl (a rerun or a resumed run asks only for what is missing); replay = the scores "
        "come from that store alone, no teacher (a rerun byte for byte; a score it lacks ends the stage).",
        default="record")

    def __post_init__(self) -> None:
        _require(self.coef >= 0 and self.final_coef >= 0, "coef", "must be >= 0 (coef and final_coef)")
        _require(self.dapo_coef >= 0, "dapo_coef", "must be >= 0 (0 = the guided loss alone)")
        _require(self.max_states >= 0, "max_states", "must be >= 0 (0 = no correction after the fact)")
        _require(self.rows_per_step >= 0, "rows_per_step", "must be >= 0 (0 = one step with DAPO's last mini-batch)")
        _require(bool(self.domains) and set(self.domains) <= {"web", "math", "code"}, "domains",
                 "must be a non-empty subset of [web, math, code]")
        for name in ("interject_failed", "interject_other"):
            _require(0 <= getattr(self, name) <= 1, name, "must be a probability in [0, 1]")
        _require(self.source == "none" or self.coef > 0 or self.final_coef > 0, "coef",
                 f"is 0 with source {self.source!r}: set a weight, or source: none")
        _require(self.source != "none" or self.dapo_coef > 0, "dapo_coef", "is 0 with source none: nothing to learn")

    def weight(self, step: int, steps: int) -> float:
        """The guided loss's weight at ``step`` (0-based) of ``steps``: coef, linearly to final_coef; 0 without a
        source."""
        if self.source == "none":
            return 0.0
        frac = step / (steps - 1) if steps > 1 else 0.0
        return self.coef + (self.final_coef - self.coef) * frac

    def interjection(self, step: int, steps: int) -> tuple[float, float]:
        """(after a failed or repeated call, elsewhere): the team's chance of taking a turn at ``step``, annealed
        by the weight's ratio to coef; (0, 0) unless the source is the team."""
        if self.source != "team" or self.coef <= 0:
            return 0.0, 0.0
        ratio = self.weight(step, steps) / self.coef
        return self.interject_failed * ratio, self.interject_other * ratio


@dataclass(frozen=True)
class TeachConfig:
    tasks: dict[str, int] = _help(
        "RL-split tasks per domain (web, math, code) the teacher team (distill.teacher, its style) solves before DAPO, "
        "the first by task_id (web: those the difficulty stage kept; never a task solve_filter sampled): its correct "
        "trajectories train the SFT policy on with the sft loop (sft's settings; lr, epochs, trainable_layers "
        "below), then DAPO goes on from there (coa.train.teach). {} or zeros = off.",
        default_factory=dict)
    lr: float = _help("Peak learning rate of that pass (sft's schedule).", default=3.0e-5)
    epochs: float = _help("Passes over its trajectories.", default=1.0)
    trainable_layers: int = _help("Its top N decoder layers trained (0 = every parameter).", default=0)

    def __post_init__(self) -> None:
        _require(set(self.tasks) <= {"web", "math", "code"} and min(self.tasks.values(), default=0) >= 0, "tasks",
                 "must map some of web, math, code to counts >= 0")
        _require(self.lr > 0, "lr", "must be > 0")
        _require(self.epochs > 0, "epochs", "must be > 0")
        _require(self.trainable_layers >= 0, "trainable_layers", "must be >= 0 (0 = every parameter)")

    @property
    def on(self) -> bool:
        return sum(self.tasks.values()) > 0


@dataclass(frozen=True)
class RlConfig:
    steps: int = _help("Optimizer steps (each: rollouts, then one update per mini-batch).")
    prompts_per_step: int = _help("Groups (prompts) per step after dynamic sampling (the paper: 64 web, 256 code/math).")
    rollouts_per_prompt: int = _help("Rollouts per prompt, the group (the paper: 8).")
    max_gen_batches: int = _help("Dynamic sampling: most generation rounds per step to fill the batch with useful "
                                 "groups (rewards not all equal); then the step trains on what it has.")
    mini_batches: int = _help("Optimizer updates per step (the kept rollouts split in this many mini-batches).")
    row_tokens: int = _help("Tokens per packed row in the update's forward passes.")
    lr: float = _help("AdamW learning rate (the paper: 1e-6; a tiny model needs 1e-5 to 1e-4).")
    warmup_steps: int = _help("Linear warm-up steps, then constant.")
    weight_decay: float = _help("AdamW decoupled weight decay.")
    betas: list[float] = _help("AdamW betas.")
    grad_clip: float = _help("Clip the gradient norm to this (0 = off).")
    trainable_layers: int = _help("Update only the top N decoder layers and the final norm (0 = every parameter).")
    clip_low: float = _help("Ratio clip below: 1 - clip_low (the paper: 0.2).")
    clip_high: float = _help("Ratio clip above: 1 + clip_high (clip-higher; the paper: 0.28).")
    kl_coef: float = _help("Weight of a k3 KL penalty against the SFT policy (DAPO: 0, off).")
    temperature: float = _help("Rollout sampling temperature (log-probs are of logits / temperature).")
    top_p: float = _help("Rollout nucleus sampling.")
    overlong_buffer: int = _help("DAPO's soft overlong punishment: the last this many tokens of "
                                 "common.agent.max_total_tokens cost up to overlong_factor (0 = off).")
    overlong_factor: float = _help("The overlong punishment at the limit.")
    repeat_penalty: float = _help("Subtracted from the reward per repeated identical tool call (0 = off).")
    format_penalty: float = _help("Subtracted from the reward of a trajectory that breaks the format (does not parse, "
                                  "breaks the role graph, or is cut at a turn's token limit): below a well-formed "
                                  "wrong answer (0 = both score 0).")
    dtype: Literal["auto", "float32", "bfloat16"] = _help(
        "Autocast dtype of the update (float32 master weights); auto = bfloat16 only where native.")
    gradient_checkpointing: bool = _help(
        "Recompute each decoder layer's activations in the backward pass instead of keeping them (the update only; "
        "rollouts are unaffected): a 32k-token row of a 7B model needs it on an 80 GB GPU (docs/scale.md).")
    logprob_chunk: int = _help(
        "Positions per chunk when the update turns final hidden states into log-probs and entropy: the lm head "
        "runs on this many at a time, in float32 per chunk, and backward recomputes them (no [tokens x vocab] "
        "tensor is kept).")
    guide: GuideConfig = _help("Teacher-guided on-policy learning beside DAPO on the same rollouts (or rejection "
                               "sampling): coa.train.dapo.guided.")
    engine: EngineConfig = _help("Rollout engine: hf shares the trained weights; vllm gets them after each step.")
    deepspeed: DeepSpeedConfig = _help("ZeRO sharding of the update over the ranks of a launcher (deepspeed, torchrun), "
                                       "each rank rolling out its share of the groups; runs on CPU with gloo.")
    checkpoint_every: int = _help("Steps between resumable checkpoints (model, optimizer, task stream, RNG).")
    heldout_tasks: int = _help("Eval-split tasks per domain rolled out by the RL policy to measure KL(RL || SFT).")
    register_as: str = _help("MLflow registered-model name of the result.")
    teach: TeachConfig = _help("Before DAPO: the teacher team's trajectories of fresh RL-split tasks, trained with the "
                               "sft loop (docs/sizing.md: the stage after SFT as supervised data).",
                               default_factory=TeachConfig)

    def __post_init__(self) -> None:
        for name in ("steps", "prompts_per_step", "max_gen_batches", "mini_batches", "row_tokens",
                     "checkpoint_every"):
            _require(getattr(self, name) >= 1, name, "must be >= 1")
        _require(self.rollouts_per_prompt >= 2, "rollouts_per_prompt", "must be >= 2 (advantages are per group)")
        _require(self.lr > 0, "lr", "must be > 0")
        _require(self.warmup_steps >= 0, "warmup_steps", "must be >= 0")
        _require(len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas), "betas",
                 "must be two numbers in [0, 1)")
        _require(self.grad_clip >= 0, "grad_clip", "must be >= 0 (0 = off)")
        _require(0 < self.clip_low < 1, "clip_low", "must be within (0, 1)")
        _require(self.clip_high > 0, "clip_high", "must be > 0")
        _require(self.kl_coef >= 0, "kl_coef", "must be >= 0")
        _require(self.temperature > 0, "temperature", "must be > 0 (a group needs different samples)")
        _require(0 < self.top_p <= 1, "top_p", "must be within (0, 1]")
        _require(self.overlong_buffer >= 0, "overlong_buffer", "must be >= 0 (0 = off)")
        _require(self.format_penalty >= 0, "format_penalty", "must be >= 0 (0 = off)")
        _require(self.heldout_tasks >= 0, "heldout_tasks", "must be >= 0")
        _require(self.trainable_layers >= 0, "trainable_layers", "must be >= 0 (0 = every parameter)")
        _require(self.logprob_chunk >= 1, "logprob_chunk", "must be >= 1 (positions per chunk)")
        _require(not (self.guide.source == "logprobs" and self.guide.dapo_coef == 0) or self.max_gen_batches == 1,
                 "max_gen_batches", "must be 1 with the teacher's reverse KL alone (guide.source logprobs, "
                 "guide.dapo_coef 0): every rollout of a round trains, no group is filtered, another round buys nothing")
