"""Teacher-guided learning beside DAPO (coa.train.dapo.guided): states, examples, and the update learning from them."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from coa.prompts import render_prompt
from coa.rollout.hf import HFEngine
from coa.rollout.loop import OBS_CLOSE, OBS_OPEN, decode, encode
from coa.rollout.types import Request, Rollout, Sampling
from coa.tasks.math import generate_math
from coa.teacher.states import StateFacts, visited_states
from coa.train.dapo import train_dapo
from coa.train.dapo.guided import Guided, only_domains, own_correct, teacher_guided
from coa.train.data import Example, pack
from tests.rollout.conftest import Recorder
from tests.rollout.scripted import WEB_SCRIPT, make_tokenizer, scripted_qwen2
from tests.teacher.test_guide import CODE_TOOLS, guide_for
from tests.train.test_dapo import LIMITS, TASKS, _cfg, _score


@pytest.fixture(scope="module")
def tok():
    return make_tokenizer()


def rollout_of(tok, prompt: str, parts: list[tuple[str, int]]) -> Rollout:
    """A rollout from (text, mask) parts: the policy's text (1) and the runtime's observations (0)."""
    r = Rollout("k", encode(tok, prompt))
    for text, mask in parts:
        ids = encode(tok, text)
        r.response_ids += ids
        r.loss_mask += [mask] * len(ids)
        r.logprobs += [0.0] * len(ids)
    r.text = decode(tok, r.response_ids)
    return r


def test_states_are_the_start_and_the_end_of_every_observation(tok):
    r = rollout_of(tok, "Q", [("<think>a</think>", 1), (OBS_OPEN + "o" + OBS_CLOSE, 0), ("<answer>x</answer>", 1)])
    states = visited_states(r)
    first_obs = r.loss_mask.index(0)
    assert [s.cut for s in states] == [0, r.loss_mask.index(1, first_obs)]
    assert states[0].next_end == first_obs and states[0].obs_end == states[1].cut
    assert states[1].next_end == len(r.loss_mask) and states[1].obs_end is None
    cut_at_obs = rollout_of(tok, "Q", [("<think>a</think>", 1), (OBS_OPEN + "o" + OBS_CLOSE, 0)])
    assert [s.cut for s in visited_states(cut_at_obs)] == [0]  # an observation that ended it: no next turn


@pytest.fixture(scope="module")
def failing(tok):
    """A math task and a student rollout that runs a failing program, runs it again, then answers wrong."""
    task = generate_math(seed=5, n_tasks=4, splits={"sft": 1.0})[0]
    bad = "```python\nprint(undefined_total)\n```"
    obs = CODE_TOOLS["code"](bad)
    parts = [(f"<plan>Compute it.</plan>\n<think>Let me compute.</think>\n<code>{bad}</code>", 1),
             (OBS_OPEN + obs + OBS_CLOSE, 0),
             (f"<reflection>information conflict: good\ntool effectiveness: good\ntrajectory monitoring: good"
              f"</reflection>\n<think>again</think>\n<code>{bad}</code>", 1),
             (OBS_OPEN + obs + OBS_CLOSE, 0),
             ("<reflection>information conflict: good\ntool effectiveness: good\ntrajectory monitoring: good"
              "</reflection>\n<think>so</think>\n<answer>\\boxed{1}</answer>", 1)]
    return task, rollout_of(tok, render_prompt(tok, task["question"], "math"), parts)


def test_the_team_corrects_the_first_states_where_the_student_did_otherwise(tok, failing):
    task, rollout = failing
    guide = guide_for(CODE_TOOLS)
    cfg = replace(_cfg().guide, source="team", max_states=2, takeover=False)
    examples, facts = teacher_guided(guide, tok, cfg, 4096)(task, rollout, False)
    assert (facts.states, facts.guided, facts.agree, facts.after_failed, facts.examples) == (3, 3, 0, 2, 2)
    route = guide.route(task)
    cuts = [s.cut for s in visited_states(rollout)]
    for example, cut in zip(examples, cuts, strict=False):
        context = rollout.prompt_ids + rollout.response_ids[:cut]
        assert example.input_ids[:len(context)] == context  # the student's own tokens, never re-tokenised
        assert example.loss_mask[:len(context)] == [0] * len(context)
        target = decode(tok, example.input_ids[len(context):])
        assert target == guide.next_turn(route, decode(tok, rollout.response_ids[:cut])).text
        assert all(example.loss_mask[len(context):])
    assert "<plan>" in decode(tok, examples[0].input_ids[len(rollout.prompt_ids):])  # from the start: a whole leg
    assert "is not defined" in decode(tok, examples[1].input_ids)


def test_recovery_first_corrects_the_state_after_a_failed_call_before_the_start(tok, failing):
    task, rollout = failing
    guide = guide_for(CODE_TOOLS)
    cuts = [s.cut for s in visited_states(rollout)]
    first = replace(_cfg().guide, source="team", max_states=1, takeover=False)
    recovery = replace(first, states="recovery_first")
    (at_start,), _ = teacher_guided(guide, tok, first, 4096)(task, rollout, False)
    (after_failed,), facts = teacher_guided(guide, tok, recovery, 4096)(task, rollout, False)
    assert len(at_start.input_ids) > len(rollout.prompt_ids) + cuts[0]
    context = rollout.prompt_ids + rollout.response_ids[:cuts[1]]  # the first state after the failed program
    assert after_failed.input_ids[:len(context)] == context and not any(after_failed.loss_mask[:len(context)])
    assert "is not defined" in decode(tok, after_failed.input_ids[len(context):])  # the team's diagnosis, its fix
    assert facts.examples == 1 and facts.after_failed == 2
    both = teacher_guided(guide, tok, replace(recovery, max_states=3), 4096)(task, rollout, False)[0]
    starts = [next(i for i, m in enumerate(e.loss_mask) if m) for e in both]
    assert starts == [len(rollout.prompt_ids) + c for c in (cuts[1], cuts[2], cuts[0])]  # recovery states, then the rest


def test_takeover_goes_on_to_the_answer_with_the_tools_output_masked(tok, failing):
    task, rollout = failing
    guide = guide_for(CODE_TOOLS)
    cfg = replace(_cfg().guide, source="team", max_states=1, takeover=True)
    (example,), facts = teacher_guided(guide, tok, cfg, 4096)(task, rollout, False)
    assert facts.examples == 1 and facts.target_tokens == sum(example.loss_mask)
    ids, mask = example.input_ids, example.loss_mask
    assert ids[-1] == tok.eos_token_id and mask[-1] == 1
    text = decode(tok, ids[len(rollout.prompt_ids):])
    assert text.count("<observation>") == 1 and text.rstrip().endswith("</answer>" + tok.eos_token)
    masked = decode(tok, [i for i, m in zip(ids[len(rollout.prompt_ids):], mask[len(rollout.prompt_ids):],
                                            strict=True) if m == 0])
    assert masked == OBS_OPEN + guide.route(task).legs[0].observation + OBS_CLOSE
    short = teacher_guided(guide, tok, cfg, len(rollout.prompt_ids))(task, rollout, False)
    assert short[0] == [] and short[1].cut == 3  # no target token fits at any state: each dropped and counted


def test_rejection_sampling_keeps_only_correct_rollouts_as_they_are(tok, failing):
    _, rollout = failing
    run = own_correct(4096)
    assert run({}, rollout, False) == ([], StateFacts())
    (example,), facts = run({}, rollout, True)
    assert example.input_ids == rollout.prompt_ids + rollout.response_ids
    assert example.loss_mask == [0] * len(rollout.prompt_ids) + rollout.loss_mask and facts.examples == 1


def test_the_guided_loss_alone_teaches_the_teams_turn(tok):
    """The scripted student searches first; the 'team' answers at once. With DAPO's loss off (dapo_coef 0) the
    guided cross-entropy alone moves the student to answering at once, which _score rewards."""
    answer = encode(tok, "<think> Kellon</think><answer> Tesk</answer>") + [tok.eos_token_id]

    def guided(task, rollout, correct):
        if correct:
            return [], StateFacts(states=1, guided=1, agree=1)
        ids = list(rollout.prompt_ids)
        return [Example(ids + answer, [0] * len(ids) + [1] * len(answer), 1.0)], \
            StateFacts(states=1, guided=1, examples=1, target_tokens=len(answer))

    cfg = _cfg(steps=6, prompts_per_step=4, rollouts_per_prompt=2, mini_batches=1, lr=3e-3)
    cfg = replace(cfg, guide=replace(cfg.guide, source="team", coef=1.0, final_coef=0.5, dapo_coef=0.0))
    torch.manual_seed(0)
    model = scripted_qwen2(tok, WEB_SCRIPT)
    result = train_dapo(model, tok, TASKS, cfg, engine=HFEngine(model, tok, max_batch=16), limits=LIMITS,
                        tools_factory=Recorder(), score=_score, render=lambda t: render_prompt(tok, t["question"], "web"),
                        seed=5, progress=False, guided=Guided(guided))
    h = result.history
    assert h[0]["accuracy"] < 0.5 and h[-1]["accuracy"] > h[0]["accuracy"] + 0.3
    assert h[-1]["guide_agreement"] > h[0]["guide_agreement"]
    assert h[0]["policy_tokens_trained"] == 0 and h[0]["guide_weight"] == 1.0 and h[-1].get("guide_weight", 0.5) == 0.5
    assert result.metrics(len(TASKS), 0, float("nan"))["guide_examples"] == sum(x["guide_examples"] for x in h)


class AnswerAtOnce:
    """A stand-in team that, from any state after an observation, answers " Tesk" at once."""

    def route(self, task):
        return task["task_id"]

    def next_turn(self, route, text):
        from coa.teacher.guide import Turn

        return Turn("<think> Kellon</think><answer> Tesk</answer>")


def test_the_teams_turns_in_the_rollouts_teach_and_leave_dapo_alone(tok):
    """The scripted student (greedy) searches again after every observation; the team, taking the turn there,
    answers. With DAPO's loss off, the cross-entropy on the team's turns alone teaches the student to answer (the
    bigram student then answers at once), and the rollouts it took turns in never count as its own."""
    cfg = _cfg(steps=6, prompts_per_step=4, rollouts_per_prompt=2, mini_batches=1, lr=3e-3)
    cfg = replace(cfg, guide=replace(cfg.guide, source="team", coef=1.0, final_coef=0.5, dapo_coef=0.0,
                                     interject_failed=0.0, interject_other=1.0, max_states=0,
                                     domains=["web", "math", "code"]))
    torch.manual_seed(0)
    model = scripted_qwen2(tok, WEB_SCRIPT)
    engine = HFEngine(model, tok, max_batch=16)
    guided = Guided(lambda task, rollout, correct: ([], StateFacts()), AnswerAtOnce())

    def answered():
        rollouts = engine.rollout([Request(f"t{i}#0", render_prompt(tok, t["question"], "web"), "web")
                                   for i, t in enumerate(TASKS)], Sampling(temperature=0.0), LIMITS, Recorder())
        return sum(r.answer == "Tesk" for r in rollouts)

    before = answered()
    result = train_dapo(model, tok, TASKS, cfg, engine=engine, limits=LIMITS, tools_factory=Recorder(), score=_score,
                        render=lambda t: render_prompt(tok, t["question"], "web"), seed=5, progress=False,
                        guided=guided)
    h = result.history
    assert before == 0 and answered() == len(TASKS)
    assert h[0]["interjected"] > 0.5 and h[0]["guide_tokens_trained"] > 0 and h[0]["policy_tokens_trained"] == 0
    assert h[-1]["interjected"] < h[0]["interjected"]  # fewer states to take: the student answers by itself


def test_guided_rows_take_optimizer_steps_of_their_own(tok):
    """guide.rows_per_step > 0: the team's examples train as SFT does, one optimizer step per that many packed rows
    after DAPO's mini-batch, the same targets trained; 0 (as shipped): they join DAPO's last mini-batch, one step."""
    from coa.rollout.types import Request, Sampling
    from coa.train.dapo import _update

    model = scripted_qwen2(tok, WEB_SCRIPT)
    requests = [Request(f"q{i}", render_prompt(tok, t["question"], "web"), "web") for i, t in enumerate(TASKS)]
    rollouts = HFEngine(model, tok, max_batch=8).rollout(requests, Sampling(temperature=1.0, seed=3), LIMITS, Recorder())
    batch = [(r, a) for r, a in zip(rollouts, [1.0, -1.0, 0.5, -0.5, 1.0, -1.0], strict=True)]
    answer = encode(tok, "<think> Kellon</think><answer> Tesk</answer>") + [tok.eos_token_id]
    guided = [Example(r.prompt_ids + r.response_ids + answer,
                      [0] * (len(r.prompt_ids) + len(r.response_ids)) + [1] * len(answer), 1.0) for r in rollouts[:5]]
    width = max(len(e.input_ids) for e in guided)
    rows = len(pack(guided, width))
    assert rows >= 3

    class Counting(torch.optim.SGD):
        steps = 0

        def step(self, closure=None):
            Counting.steps += 1
            return super().step(closure)

    seen = {}
    for per in (0, 1, 2):
        cfg = _cfg(mini_batches=1, row_tokens=width)
        cfg = replace(cfg, guide=replace(cfg.guide, source="team", rows_per_step=per))
        m = scripted_qwen2(tok, WEB_SCRIPT)
        Counting.steps = 0
        out = _update(m, None, Counting(m.parameters(), lr=1e-2), batch, cfg, tok.pad_token_id, torch.device("cpu"),
                      None, 0, 0, guided=guided, guide_coef=1.0)
        seen[per] = (Counting.steps, out["guide_tokens_trained"], out["policy_tokens_trained"])
    assert seen[0][0] == 1 and seen[1][0] == 1 + rows and seen[2][0] == 1 + (rows + 1) // 2
    assert seen[0][1:] == seen[1][1:] == seen[2][1:] and seen[0][1] == 5 * len(answer)
    with pytest.raises(ValueError, match="rows_per_step"):
        replace(cfg.guide, rows_per_step=-1)


def test_guide_domains_keep_other_domains_states_counted_and_their_examples_out(tok, failing):
    """rl.guide.domains: a math rollout outside the domains gives no example, its states still judged and counted."""
    task, rollout = failing
    cfg = replace(_cfg().guide, source="team", max_states=2, takeover=False)
    inside = only_domains(teacher_guided(guide_for(CODE_TOOLS), tok, cfg, 4096), ["math", "code"])
    outside = only_domains(teacher_guided(guide_for(CODE_TOOLS), tok, cfg, 4096), ["web"])
    made, facts = inside(task, rollout, False)
    none, seen = outside(task, rollout, False)
    assert len(made) == facts.examples == 2 and facts.target_tokens > 0
    assert none == [] and (seen.examples, seen.cut, seen.target_tokens) == (0, 0, 0)
    assert (seen.states, seen.guided, seen.agree, seen.after_failed) == (facts.states, facts.guided, facts.agree,
                                                                         facts.after_failed)


def test_the_team_takes_no_turn_in_rollouts_outside_guide_domains(tok):
    """Interjection follows rl.guide.domains too: web tasks with guide.domains [math, code] roll out untouched."""
    cfg = _cfg(steps=1, prompts_per_step=2, rollouts_per_prompt=2, mini_batches=1, lr=3e-3)
    cfg = replace(cfg, guide=replace(cfg.guide, source="team", coef=1.0, final_coef=1.0, dapo_coef=1.0,
                                     interject_failed=0.0, interject_other=1.0, max_states=0,
                                     domains=["math", "code"]))
    torch.manual_seed(0)
    model = scripted_qwen2(tok, WEB_SCRIPT)
    engine = HFEngine(model, tok, max_batch=16)
    guided = Guided(lambda task, rollout, correct: ([], StateFacts()), AnswerAtOnce())
    result = train_dapo(model, tok, TASKS, cfg, engine=engine, limits=LIMITS, tools_factory=Recorder(), score=_score,
                        render=lambda t: render_prompt(tok, t["question"], "web"), seed=5, progress=False,
                        guided=guided)
    assert {t["domain"] for t in TASKS} == {"web"}
    assert result.history[0]["interjected"] == 0.0  # with domains [web, math, code] the test above sees > 0.5
