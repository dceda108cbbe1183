"""The orchestrator: routes messages between the agents and the tools, and records everything.

    team = offline_team(domain, rng, cfg)            # or llm_team(...)
    transcript = run_team(question, domain, team, ToolSession(tools, 1536), TeamLimits(2, 12, 8))

Web: planner -> searcher (tool loop; the critic reflects on a call that failed) -> critic -> [re-plan on poor] -> answerer (suggested answer)
-> verifier (score >= 3: final answer; <= 2: critic, then re-plan).
Math and code: planner -> coder (code, observation, critic's reflection)* -> answerer.
Each agent keeps its own context (system prompt + what it received + what it said); every call is
recorded with that context as its input.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from coa.chat import ChatError
from coa.format import TOOL_TAGS, Step, double_check_score, reflection_grades, render
from coa.teacher.roles import SYSTEM, result_fields
from coa.teacher.transcript import AGENTS, Call, Message, Transcript, split_parts
from coa.tools.observation import failed
from coa.tools.session import ToolSession


@dataclass(frozen=True)
class AgentReply:
    text: str
    usage: dict[str, int] | None = None


Agent = Callable[[list[dict[str, str]]], AgentReply]  # chat context in, reply out
Team = Mapping[str, Agent]  # role name -> agent


@dataclass(frozen=True)
class TeamLimits:
    max_replans: int  # re-plans after a poor reflection or a low double-check score
    max_tool_calls: int  # per task, all agents together
    max_worker_turns: int  # searcher / coder calls per round


class _Run:
    def __init__(self, question: str, domain: str, team: Team, session: ToolSession, limits: TeamLimits):
        missing = [a for a in ("planner", "critic", "answerer") + (("searcher", "verifier") if domain == "web"
                                                                     else ("coder",)) if a not in team]
        if missing:
            raise ValueError(f"the team lacks agent(s) {', '.join(missing)} for {domain} tasks")
        self.team, self.session, self.limits = team, session, limits
        self.t = Transcript(question, domain)
        self.contexts = {name: [{"role": "system", "content": SYSTEM[name]}] for name in AGENTS}

    def send(self, sender: str, receiver: str, role: str, content: str) -> None:
        self.t.messages.append(Message(sender, receiver, role, content))
        self.contexts[receiver].append({"role": "user", "content": content})

    def call(self, name: str) -> list[tuple[str, str]]:
        context = self.contexts[name]
        reply = self.team[name](list(context))
        self.t.calls.append(Call(name, tuple(m["content"] for m in context), reply.text, reply.usage))
        context.append({"role": "assistant", "content": reply.text})
        parts = split_parts(reply.text)
        for tag, content in parts:
            self.t.messages.append(Message(name, "tools" if tag in TOOL_TAGS else "orchestrator", tag, content))
        return parts

    def work(self, name: str, task: str) -> str | None:
        """Hand `task` to a worker and run its tool loop until it reports a result; None if it never does."""
        self.send("orchestrator", name, "task", task)
        for _ in range(self.limits.max_worker_turns):
            parts = self.call(name)
            tool = next(((tag, body) for tag, body in parts if tag in TOOL_TAGS), None)
            result = next((body for tag, body in parts if tag == "result"), None)
            if tool is None:
                return result if result is not None else (parts[-1][1] if parts else None)
            if self.t.tool_calls > self.limits.max_tool_calls:
                self.send("orchestrator", name, "task", "Tool budget exhausted: report your best result now.")
                continue
            observation = self.session(*tool)
            self.send("tools", name, "observation", observation)
            request = critic_request(self.t.domain, *tool, observation)
            if request is None:
                continue
            self.send("orchestrator", "critic", "context", request)
            reflection = self.first(self.call("critic"), "reflection")
            self.send("critic", name, "context", f"Critic:\n{reflection}")
        return None

    @staticmethod
    def first(parts: list[tuple[str, str]], tag: str) -> str:
        return next((body for t, body in parts if t == tag), "")

    def plan(self, request: str) -> str:
        self.send("orchestrator", "planner", "task", request)
        return self.first(self.call("planner"), "plan")

    def run(self) -> Transcript:
        q = self.t.question
        plan = self.plan(f"Question: {q}")
        if self.t.domain == "web":
            self.web(q, plan)
        else:
            result = self.work("coder", f"Question: {q}\n\nPlan:\n{plan}")
            answer = result_fields(result)["answer"] if result else "unknown"
            self.send("orchestrator", "answerer", "context", f"Question: {q}\n\nResult:\n{answer}\n\nGive the final answer.")
            self.t.answer = self.first(self.call("answerer"), "answer") or None
        return self.t

    def web(self, q: str, plan: str) -> None:
        for round_ in range(self.limits.max_replans + 1):
            last = round_ == self.limits.max_replans
            result = self.work("searcher", f"Question: {q}\n\nPlan:\n{plan}") or "answer: unknown\nevidence: none"
            self.send("orchestrator", "critic", "context", f"Question: {q}\n\nPlan:\n{plan}\n\nResult:\n{result}")
            reflection = self.first(self.call("critic"), "reflection")
            if "poor" in reflection_grades(reflection).values() and not last:
                plan = self.plan(f"Re-plan. The critic's reflection:\n{reflection}")
                continue
            self.send("orchestrator", "answerer", "context", f"Question: {q}\n\nResult:\n{result}\n\nSuggest an answer.")
            suggested = self.first(self.call("answerer"), "suggested_answer")
            self.send("orchestrator", "verifier", "context", f"Question: {q}\n\nResult:\n{result}\n\nSuggested answer: {suggested}")
            check = self.first(self.call("verifier"), "double_check")
            score = double_check_score(check) or 1
            if score >= 3:
                self.send("orchestrator", "answerer", "task", "The verifier accepted it. Give the final answer.")
                self.t.answer = self.first(self.call("answerer"), "answer") or suggested or None
                return
            if last:  # out of re-plans: the team's best guess, which the trajectory filters will drop
                self.t.answer, self.t.error = suggested or None, f"verifier score {score} after {round_} re-plans"
                return
            self.send("orchestrator", "critic", "context", f"The verifier gave score {score}:\n{check}\n\nReview the trajectory.")
            reflection = self.first(self.call("critic"), "reflection")
            plan = self.plan(f"Re-plan. The verifier's check:\n{check}\nThe critic's reflection:\n{reflection}")


def critic_request(domain: str, tag: str, body: str, observation: str) -> str | None:
    """What the orchestrator hands the critic after a tool call, or None when the critic is not asked: in math and
    code every run (the program and its output), in web a call that failed (no results, no page, an error)."""
    if domain != "web":
        return f"Program:\n{body}\n\nOutput:\n{observation}"
    if failed(tag, observation):
        return f"Tool call:\n{render([Step(tag, body)])}\n\nObservation:\n{observation}"
    return None


def run_team(question: str, domain: str, team: Team, session: ToolSession, limits: TeamLimits) -> Transcript:
    """Run the team on one question; the transcript records every message and call (errors included).

    A backend that could not be reached (a `ChatError`: retries spent, or a request it refused) sets
    `outage`: the task has no answer and must be run again, never be scored as a wrong one.
    """
    run = _Run(question, domain, team, session, limits)
    try:
        return run.run()
    except Exception as exc:  # a backend that keeps failing: keep what happened, say why
        run.t.error = f"{type(exc).__name__}: {exc}"
        run.t.outage = isinstance(exc, ChatError)
        run.t.answer = None if run.t.outage else run.t.answer
        return run.t
