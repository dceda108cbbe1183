"""The artifact schemas. Strict: a column that is not declared here is an error."""

from __future__ import annotations

import pandera.polars as pa
import polars as pl

SPLITS = ("sft", "rl", "eval")
DOMAINS = ("web", "math", "code")


def polars_dtypes(model: type[pa.DataFrameModel]) -> dict[str, pl.DataType]:
    """The model's columns and polars dtypes in declared order, for building frames from rows:
    ``pl.DataFrame(rows, schema=polars_dtypes(Task))`` (each schema is defined once, by its model)."""
    return {name: column.dtype.type for name, column in model.to_schema().columns.items()}




class Task(pa.DataFrameModel):
    """`data/tasks.parquet`: one curated task per row, written by curate."""

    task_id: str = pa.Field(unique=True, str_length={"min_value": 1}, description="Stable unique id, e.g. web-000123")
    domain: str = pa.Field(isin=list(DOMAINS), description="web, math or code: picks the checker and the tools")
    question: str = pa.Field(str_length={"min_value": 1}, description="What the agent is asked, normalised")
    answers: pl.List(pl.Utf8) = pa.Field(description="Gold answer first, then aliases; code: a reference solution")
    tests: pl.List(pl.Utf8) = pa.Field(description="Code: hidden assert statements; empty for web and math")
    source: str = pa.Field(description="Where the task came from: world:web, hotpotqa, ...")
    split: str = pa.Field(isin=list(SPLITS), description="sft, rl or eval; no question is in two splits")
    meta: str = pa.Field(description="JSON object: kind, hops, entities, ... (never shown to agents)")

    @pa.dataframe_check(error="every task needs at least one non-empty answer")
    def has_answers(cls, data) -> pl.LazyFrame:
        return data.lazyframe.select(
            pl.col("answers").list.eval(pl.element().str.len_chars() > 0).list.any().fill_null(False)
        )

    @pa.dataframe_check(error="code tasks need hidden tests")
    def code_has_tests(cls, data) -> pl.LazyFrame:
        return data.lazyframe.select((pl.col("domain") != "code") | (pl.col("tests").list.len() > 0))

    class Config:
        strict = True


class Document(pa.DataFrameModel):
    """`data/corpus.parquet`: the pages that the search tool indexes and the crawl tool reads."""

    doc_id: str = pa.Field(unique=True, description="Stable unique id")
    url: str = pa.Field(unique=True, str_startswith="http", description="What the crawl tool takes")
    title: str = pa.Field(str_length={"min_value": 1}, description="Shown in search results")
    text: str = pa.Field(str_length={"min_value": 1}, description="The page body")

    class Config:
        strict = True


class Reject(pa.DataFrameModel):
    """`data/rejects/<stage>.parquet`: every row a stage did not keep, with the reason."""

    stage: str = pa.Field(description="The stage that rejected the row")
    row: str = pa.Field(description="The rejected row as JSON")
    reason: str = pa.Field(str_length={"min_value": 1}, description="Why, in words a person can act on")

    class Config:
        strict = True


MESSAGE_DTYPE = pl.Struct({"sender": pl.Utf8, "receiver": pl.Utf8, "role": pl.Utf8, "content": pl.Utf8,
                           "tokens": pl.Int64})
CALL_DTYPE = pl.Struct({"agent": pl.Utf8, "input_tokens": pl.Int64, "output_tokens": pl.Int64,
                        "api_prompt_tokens": pl.Int64, "api_completion_tokens": pl.Int64})


class Transcript(pa.DataFrameModel):
    """`data/transcripts.parquet`: one teacher-team run per task, every message and agent call (distill)."""

    task_id: str = pa.Field(unique=True, description="The task the team ran on")
    domain: str = pa.Field(isin=list(DOMAINS))
    question: str = pa.Field(description="What the team was asked (all it saw besides the tools)")
    messages: pl.List(MESSAGE_DTYPE) = pa.Field(
        description="Every message in order: sender, receiver, role (a trajectory tag, task, context or result), "
                    "content, tokens (policy tokenizer)")
    calls: pl.List(CALL_DTYPE) = pa.Field(
        description="Every agent call: input tokens (its whole context), output tokens, API-reported usage if any")
    answer: str = pa.Field(nullable=True, description="The team's final answer; null if it gave none")
    correct: bool = pa.Field(description="coa.rewards.check on the answer")
    f1: float = pa.Field(ge=0, le=1, description="Web: token F1 against the gold aliases (0 for math/code)")
    teacher_tokens: int = pa.Field(ge=0, description="Billed tokens: input + output over all agent calls")
    api_tokens: int = pa.Field(nullable=True, description="Tokens the backend reported, null if none")
    tool_calls: int = pa.Field(ge=0, description="Tool calls by all agents")
    error: str = pa.Field(nullable=True, description="Why the run ended abnormally, null if it did not")
    seed: int = pa.Field(description="The team's RNG seed (derive_seed(common.seed, 'distill', task_id))")

    class Config:
        strict = True


class Trajectory(pa.DataFrameModel):
    """`data/trajectories.parquet`: kept chain-of-agents trajectories, the SFT data (distill)."""

    task_id: str = pa.Field(unique=True)
    domain: str = pa.Field(isin=list(DOMAINS))
    system: str = pa.Field(description="coa.prompts.system_prompt(domain)")
    prompt: str = pa.Field(str_length={"min_value": 1}, description="The user turn: the question")
    trajectory: str = pa.Field(str_length={"min_value": 1}, description="The whole CoA response; parses with coa.format")
    answer: str = pa.Field(description="The <answer> content")
    correct: bool = pa.Field(description="coa.rewards.check on the answer")
    n_tool_calls: int = pa.Field(ge=0)
    has_reflection: bool = pa.Field()
    self_corrected: bool = pa.Field(description="Doubted (poor reflection or double_check <= 2), then re-planned")
    changed_course: bool = pa.Field(description="A poor reflection, a new plan, a final answer unlike an earlier suggestion")
    weight: float = pa.Field(ge=0, description="Sample weight in SFT (self-corrected ones upsampled)")
    teacher_tokens: int = pa.Field(ge=0, description="What the teacher team billed on this task")
    teacher_tool_calls: int = pa.Field(ge=0, description="The teacher team's tool calls on this task")

    class Config:
        strict = True


class TaskStats(pa.DataFrameModel):
    """A per-task pass rate and the filter's decision: data/difficulty.parquet (a reference model's
    closed-book answers, the difficulty filter) and data/rl_tasks.parquet (k agentic rollouts of the SFT
    policy, the solve filter)."""

    task_id: str = pa.Field(unique=True)
    domain: str = pa.Field(isin=list(DOMAINS))
    split: str = pa.Field(isin=list(SPLITS))
    n_samples: int = pa.Field(ge=0, description="Samples drawn; 0 for tasks the filter does not cover")
    n_correct: int = pa.Field(ge=0, description="Of them, how many coa.rewards.check accepts")
    r_q: float = pa.Field(nullable=True, ge=0, le=1, description="n_correct / n_samples; null when not sampled")
    kept: bool = pa.Field(description="difficulty: r_q <= max_pass_rate, or not covered; solve_filter: "
                                      "solved fewer than k times (and, with drop_unsolved, at least once)")

    class Config:
        strict = True

    @pa.dataframe_check(error="n_correct must not exceed n_samples")
    def correct_within_samples(cls, data) -> pl.LazyFrame:
        return data.lazyframe.select(pl.col("n_correct") <= pl.col("n_samples"))


class EvalRow(pa.DataFrameModel):
    """data/eval.parquet: one attempt of one model at one held-out task (the eval stage)."""

    model: str = pa.Field(isin=["base", "sft", "rl", "teacher"])
    group: str = pa.Field(description="The task set: the eval split (eval) or a benchmark (bench:<kind>)")
    domain: str = pa.Field(isin=list(DOMAINS))
    task_id: str
    sample: int = pa.Field(ge=0, description="0..k-1")
    correct: bool = pa.Field(description="coa.rewards.check of the answer")
    answer: str = pa.Field(nullable=True, description="The <answer> content; null without one")
    parse_ok: bool = pa.Field(description="The trajectory parses and follows the role graph (teacher: its answer's shape)")
    finish: str = pa.Field(description="Why the attempt ended (a rollout finish reason; teacher: answer or error)")
    billed_tokens: int = pa.Field(ge=0, description="coa.eval.metrics.billed_tokens with the policy's tokenizer")
    generated_tokens: int = pa.Field(ge=0, description="Tokens the model(s) wrote")
    tool_calls: int = pa.Field(ge=0)
    turns: int = pa.Field(ge=0, description="Model calls: student segments between tool calls, teacher agent calls")
    text: str = pa.Field(description="The attempt's transcript: the rollout's text (teacher: its linearised trajectory; "
                                     "empty if it has none), tool calls and observations in it (`coa show`)")
    failed_calls: int = pa.Field(ge=0, description="Tool calls whose observation is an error (coa.eval.behaviour)")
    recovered: bool = pa.Field(nullable=True, description="A tool call follows the first failed one; null without one")
    reflection_names_failure: bool = pa.Field(nullable=True, description="The reflection after the first failed call "
                                              "says it failed; null without a failed call or a reflection")
    fixed: bool = pa.Field(nullable=True, description="The call after the first failed one differs from it and did "
                           "not fail; null without a failed call")
    repeated_failure: bool = pa.Field(nullable=True, description="The call after the first failed one is that call "
                                      "again; null without a failed call")
    repeated_calls: int = pa.Field(ge=0, description="Calls the same as an earlier call of the attempt (coa.tools.spec.call_key)")
    team_states: int = pa.Field(ge=0, nullable=True, description="States the rollout visited where the teacher team "
                                "had a turn (coa.teacher.states.agreement); null for the teacher's own attempts")
    team_agree: int = pa.Field(ge=0, nullable=True, description="Of those, the states where the policy's next turn "
                               "did what the team's would (the same call or effect, or a right answer)")
    lucky: bool = pa.Field(nullable=True, description="A correct math answer no program printed (crash or unrelated "
                                          "output); null outside math and for wrong answers")

    class Config:
        strict = True

    @pa.dataframe_check(error="(model, group, task_id, sample) must be unique")
    def one_row_per_attempt(cls, data) -> pl.LazyFrame:
        return data.lazyframe.select(~pl.struct("model", "group", "task_id", "sample").is_duplicated())


class TeacherScore(pa.DataFrameModel):
    """A blob of `data/teacher/rl` (the rl stage's record of an LLM teacher's signal, coa.teacher.scores): the
    teacher's log-probabilities of one rollout's policy tokens, each given every token before it."""

    position: pl.Int32 = pa.Field(ge=1, unique=True, description="Index in the rollout's prompt + response token ids")
    token_id: pl.Int32 = pa.Field(ge=0, description="The student's sampled token at that position")
    logprob: pl.Float32 = pa.Field(le=0, description="log q(token | the tokens before it) under the teacher, "
                                   "temperature 1 (vLLM's prompt_logprobs; -9999 where the teacher's is -inf)")

    class Config:
        strict = True

    @pa.dataframe_check(error="positions must increase (the rollout's order)")
    def in_order(cls, data) -> pl.LazyFrame:
        return data.lazyframe.select(pl.col("position").diff().fill_null(1) > 0)


# the polars dtypes of each artifact, derived from its model above
TASK_DTYPES = polars_dtypes(Task)
DOCUMENT_DTYPES = polars_dtypes(Document)
TRANSCRIPT_DTYPES = polars_dtypes(Transcript)
TRAJECTORY_DTYPES = polars_dtypes(Trajectory)
TASK_STATS_DTYPES = polars_dtypes(TaskStats)
EVAL_DTYPES = polars_dtypes(EvalRow)
TEACHER_SCORE_DTYPES = polars_dtypes(TeacherScore)
