"""The offline team: rule-based agents that really use the tools, and can be wrong.

    team = offline_team("web", random.Random(7), OfflineStyle(...))
    transcript = run_team(question, "web", team, session, limits)

Each agent reads only its own context (the question, the plan, observations, other agents' notes):
no task ids, gold answers, hidden tests or world data. Their choices come from a seeded RNG:
the planner sometimes tries a direct search first (a shortcut that is often wrong, which the verifier
and critic then catch and the team re-plans); the searcher words queries differently, sometimes trusts
a snippet and sometimes reads the page, and checks forum posts that contradict the encyclopedia; the
coder sometimes writes a buggy first draft that the run exposes, the critic names and the coder fixes; the searcher sometimes cuts a one-word name short, finds nothing, and the critic's note sends
it back with the full name. Those slips are the student's own failure modes, so it sees what follows them.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Generator
from dataclasses import dataclass

from coa.format import format_double_check, format_reflection
from coa.teacher.offline.code_solver import example_check, example_parts, solve_code
from coa.teacher.offline.math_solver import solve_math
from coa.teacher.offline.web import (
    DESCRIBE,
    QUERY_WORDS,
    Mention,
    Query,
    bridge,
    choose,
    compare_years,
    extract,
    find_page,
    guess,
    keywords,
    names,
    options,
    parse_page,
    parse_pages,
    parse_question,
    parse_results,
    question_kind,
    read_answer,
    strip_label,
    yes_no,
)
from coa.teacher.orchestrator import AgentReply, Team
from coa.teacher.roles import result_fields
from coa.tools.observation import failed
from coa.tools.spec import CODE, CRAWL, SEARCH, format_code

Worker = Generator[str, list[dict[str, str]], str]  # yields outputs with a tool call, receives the context


@dataclass(frozen=True)
class OfflineStyle:
    """How the offline agents behave (probabilities per task or per lookup)."""

    p_direct: float  # planner: try one direct search before decomposing
    p_snippet: float  # searcher: take a fact from the encyclopedia snippet instead of reading the page
    p_check_forum: float  # searcher: open a forum/blog hit that contradicts the encyclopedia
    p_critic_catch: float  # critic: grade a direct-search shortcut poor straight away
    p_lenient: float  # verifier: accept an unverified snippet answer (a mistake the filters catch)
    p_slip: float  # a flawed first attempt the observation exposes (coder: a failing draft; searcher: a name cut short)
    p_show_result: float = 0.0  # coder: the worked example's result printed before its assert (0: no draw)


def _last(context: list[dict[str, str]], prefix: str = "") -> str:
    """The last message received that starts with `prefix` (without it); the critic's notes on a failed call
    are skipped unless asked for, so a worker reads the observation before them."""
    for message in reversed(context):
        text = message["content"]
        if message["role"] == "user" and text.startswith(prefix) and (prefix or not text.startswith("Critic:")):
            return text[len(prefix):]
    return ""


def _first(context: list[dict[str, str]], prefix: str) -> str:
    return next((m["content"] for m in context if m["role"] == "user" and m["content"].startswith(prefix)), "")


def _earlier(context: list[dict[str, str]], call: str) -> str:
    """The observation that answered the first time this call was made (a repeated search's results)."""
    for said, heard in zip(context, context[1:], strict=False):
        if said["role"] == "assistant" and said["content"].endswith(call) and heard["role"] == "user":
            return heard["content"]
    return ""


def _question(text: str) -> str:
    return text.split("\n\n")[0].removeprefix("Question: ").strip()


class _WorkerAgent:
    """Adapts a generator worker to the Agent protocol: a new `Question:` task starts a new generator."""

    def __init__(self, start: Callable[[str, str], Worker]):
        self.start, self.gen = start, None

    def __call__(self, context: list[dict[str, str]]) -> AgentReply:
        last = context[-1]["content"]
        if last.startswith("Question: "):
            plan = last.split("Plan:\n", 1)[1] if "Plan:\n" in last else ""
            self.gen = self.start(_question(last), plan)
            return AgentReply(next(self.gen))
        if self.gen is None:
            return AgentReply("<think>I have no task.</think>\n<result>answer: unknown</result>")
        try:
            return AgentReply(self.gen.send(context))
        except StopIteration as stop:
            self.gen = None
            return AgentReply(stop.value)


# ----------------------------------------------------------------------------- web


class _Search:
    """The searcher's skills over one round; `found` records (what, value, evidence) per lookup."""

    def __init__(self, rng: random.Random, style: OfflineStyle, careful: bool):
        self.rng, self.style, self.careful = rng, style, careful
        self.evidence: list[str] = []
        self.conflicts: list[str] = []

    def lookup(self, mention: Mention, field: str) -> Generator[str, list, str | None]:
        rng, name, what = self.rng, mention.name, f"the {DESCRIBE[field]} of {mention.text}"
        queries = [name, f"{name} {QUERY_WORDS[field]}"]
        if rng.random() < 0.4 or self.careful:
            queries.reverse()
        if rng.random() < self.style.p_slip and (cut := _cut_short(name, rng)):
            queries.insert(0, cut)  # the student's slip: a name copied only in part
        page, hits, empty = None, [], ""
        for i, query in enumerate(queries):
            why = f"I need {what}. Let me search for it." if i == 0 else \
                f"The search for '{empty}' found nothing: that is not the full name. Let me search for {name}." \
                if empty else f"No result is the encyclopedia page of {mention.label}. Let me search differently."
            observation = _last((yield f"<think>{why}</think>\n{SEARCH.call(query)}"), "")
            hits = parse_results(observation)
            empty = query if failed(SEARCH.tag, observation) else ""
            page = find_page(hits, mention)
            if page:
                break
        if page is None:
            self.evidence.append(f"{what}: not found")
            return None
        value = extract(page.snippet, field, mention.name) if rng.random() < self.style.p_snippet else None
        if value is not None:
            self.evidence.append(f"{what}: {strip_label(value)} (snippet of {page.url})")
        else:
            ctx = yield (f"<think>The page [{page.title}] should state {what}. Let me read it.</think>\n"
                         f"{CRAWL.call(page.url)}")
            parsed = parse_page(_last(ctx))
            value = extract(parsed[2], field, mention.name) if parsed else None
            self.evidence.append(f"{what}: {strip_label(value) if value else 'not stated'} (read {page.url})")
        for hit in hits:  # a forum or blog post that claims otherwise
            claim = None if hit.encyclopedic else extract(hit.snippet, field, mention.name)
            if value and claim and strip_label(claim) != strip_label(value):
                if rng.random() < self.style.p_check_forum:
                    yield (f"<think>[{hit.title}] claims {claim} instead of {strip_label(value)}. Let me look at "
                           f"it before deciding.</think>\n{CRAWL.call(hit.url)}")
                self.conflicts.append(f"{hit.url} claims {claim}; the encyclopedia page says {strip_label(value)}")
        return value

    def careful_answer(self, query: Query) -> Generator[str, list, str | None]:
        if query.kind == "chain":
            subject = query.mentions[0]
            value = None
            for field in query.fields:
                value = yield from self.lookup(subject, field)
                if value is None:
                    return None
                subject = Mention(value)
            return strip_label(value) if value else None
        values = []
        for mention in query.mentions:
            values.append((yield from self.lookup(mention, query.fields[0])))
        if query.kind == "compare":
            best = compare_years(values, query.later)
            return None if best is None else query.mentions[best].name
        if any(v is None for v in values):
            return None
        if query.op == "lt":
            if not all(v.isdigit() for v in values) or not query.target.isdigit():
                return None
            hits = [int(v) < int(query.target) for v in values]
        else:
            hits = [strip_label(v) == query.target for v in values]
        if query.kind == "count":
            return str(sum(hits))
        return "yes" if hits[0] else "no"

    def direct_answer(self, question: str, query: Query | None) -> Generator[str, list, str | None]:
        ctx = yield ("<think>This looks answerable with one search for the whole question.</think>\n"
                     f"{SEARCH.call(question.rstrip('?'))}")
        hits = parse_results(_last(ctx))
        if not hits:
            return None
        self.evidence.append(f"the answer: taken from the first result's snippet ({hits[0].url}), not verified")
        top = hits[0].snippet
        if query is None or query.kind == "chain":
            return guess(question, hits, query.fields[-1] if query else None)
        if query.kind == "count":
            return str(sum(m.name in top for m in query.mentions))
        if query.kind == "compare":
            present = [m for m in query.mentions if m.name in top]
            return (present or list(query.mentions))[0].name
        return "yes" if query.target in top else "no"


    def open_page(self, query: str, what: str, entity: str = "", enough: Callable[[tuple], bool] | None = None,
                  how: list[str] | None = None) -> Generator[str, list, tuple[str, str, str] | None]:
        """Search `query` and take the hit titled `entity` (else the first): its snippet when `enough` says the
        snippet holds what is needed (and the searcher trusts snippets, p_snippet), else the page read in full.
        (title, url, text) or None; `how` gets "read <url>" or "snippet of <url>"."""
        ctx = yield f"<think>I need {what}.</think>\n{SEARCH.call(query)}"
        hits = parse_results(_last(ctx)) or parse_results(_earlier(ctx, SEARCH.call(query)))  # searched before
        key = entity.lower()
        hit = next((h for h in hits if key and h.title.lower() in (key, strip_label(h.title).lower())), None) or \
            next((h for h in hits if key and h.title.lower().startswith(key)), None) or (hits[0] if hits else None)
        if hit is None:
            self.evidence.append(f"{what}: not found (no result for '{query}')")
            return None
        skim = (hit.title, hit.url, hit.snippet)
        if enough is not None and self.rng.random() < self.style.p_snippet and enough(skim):
            (how if how is not None else []).append(f"snippet of {hit.url}")
            return skim
        pages = parse_pages(_last((yield f"<think>[{hit.title}] should say. Let me read it.</think>\n"
                                         f"{CRAWL.call(hit.url)}"), ""))
        if not pages:
            self.evidence.append(f"{what}: not found ({hit.url} could not be read)")
            return None
        (how if how is not None else []).append(f"read {hit.url}")
        return pages[0]

    def general_answer(self, question: str) -> Generator[str, list, str | None]:
        """A question of a shape the rules do not know (a real dataset's): the pages of the entities it compares
        or of the question itself, then the answer from their sentences (coa.teacher.offline.web, any question)."""
        kind, pair, how = question_kind(question), options(question), []

        def says(focus: set[str], want: str = kind, known: str = "") -> Callable[[tuple], bool]:
            return lambda page: bool((found := read_answer(question, want, [page], focus, known)) and found[2])

        entities = list(pair) if pair else names(question)[:2] if kind == "yesno" else []
        if entities or kind == "yesno":  # a page per entity (a yes/no question naming none: the question's)
            read = []
            for entity in entities or [question.rstrip("?")]:
                extra = [w for w in re.findall(r"\w+", question) if w.lower()[:5] in keywords(question) - keywords(entity)]
                query = f"{entity} {' '.join(extra[:2])}" if self.careful and entities else entity
                what = f"the page about {entity}" if entities else "a page that answers the question"
                page = yield from self.open_page(query, what, entity if entities else "",
                                                 says(keywords(question) - keywords(entity), "year") if pair else None, how)
                if page is None:
                    return None
                read.append(page)
            answer = choose(question, [(e, p[2]) for e, p in zip(entities, read, strict=True)]) if pair else \
                yes_no(question, entities, [p[2] for p in read])
            self.evidence.append(f"the answer: {answer} ({' and '.join(how)})" if answer else
                                 f"the answer: not stated ({' and '.join(how)})")
            return answer
        query = " ".join(names(question)) if self.careful and names(question) else question.rstrip("?")
        first = says(keywords(question))
        page = yield from self.open_page(query, "a page that answers the question", "",
                                         lambda p: first(p) or bridge(question, p) is not None, how)
        if page is None:
            return None
        found = read_answer(question, kind, [page])
        rest = keywords(question) - keywords(f"{page[0]} {page[2]}")
        step = bridge(question, page) if rest else None
        if step:  # the page answers part of the question and names what answers the rest
            second = yield from self.open_page(step, f"the page about {step}", step, says(rest, known=step), how)
            if second is not None:
                found = read_answer(question, kind, [second], focus=rest, known=step)
        if found is None:
            self.evidence.append(f"the answer: not stated ({', then '.join(how)})")
            return None
        self.evidence.append(f"the answer: {found[0]} ({', then '.join(how)})" if found[2] else
                             f"the answer: {found[0]} ({', then '.join(how)}; not verified: no sentence there ties "
                             "it to the question)")
        return found[0]


def _cut_short(name: str, rng: random.Random) -> str | None:
    """A one-word `name` cut to its first 3-5 letters (the student's slip: "Skum" for "Skumaend"), which no
    page holds; a longer name keeps other words a search would still find, so it is left whole."""
    if len(name) < 6 or not name.isalpha():
        return None
    return name[: rng.randint(3, 5)]


def _searcher(rng: random.Random, style: OfflineStyle) -> Callable[[str, str], Worker]:
    def start(question: str, plan: str) -> Worker:
        query = parse_question(question)
        search = _Search(rng, style, careful="alternative" in plan)
        if query is None:
            answer = yield from search.general_answer(question)
        else:
            direct = plan.startswith("Strategy: direct")
            answer = yield from (search.direct_answer(question, query) if direct else search.careful_answer(query))
        conflicts = "; ".join(search.conflicts) or "none"
        evidence = "; ".join(search.evidence) or "none"
        think = (f"Putting it together: the answer is {answer}." if answer else
                 "I could not establish the answer from what I found.")
        if search.conflicts:
            think += " Some sources disagree; I trust the encyclopedia pages over forum and blog posts."
        return (f"<think>{think}</think>\n"
                f"<result>answer: {answer or 'unknown'}\nevidence: {evidence}\nconflicts: {conflicts}</result>")

    return start


def _web_planner(rng: random.Random, style: OfflineStyle) -> Callable:
    def planner(context: list[dict[str, str]]) -> AgentReply:
        request = context[-1]["content"]
        question = _question(_first(context, "Question: "))
        query = parse_question(question)
        steps = query.steps() if query else ["Find the pages of the question or of its entities.",
                                             "Follow a page to the entity it names.", "Answer from what they state."]
        if query is None:  # a question of a shape the rules do not know: read whatever the corpus holds
            again = not request.startswith("Question: ")
            head = "Strategy: search and read" + (", with alternative search terms\nThe last attempt did not "
                                                  "hold up, so search differently and read the pages again." if again else "")
        elif request.startswith("Question: "):
            strategy = "direct search" if rng.random() < style.p_direct else "step by step"
            if strategy == "direct search":
                steps = ["Search for the whole question and answer from the best result.",
                         "If that is not convincing, resolve it step by step."]
            head = f"Strategy: {strategy}"
        else:
            alt = "not found" in request or "unknown" in request
            head = "Strategy: step by step" + (", with alternative search terms" if alt else "") + \
                "\nThe last attempt did not hold up, so every step gets its own lookup on the encyclopedia page."
        body = "\n".join(f"{i}. {s}" for i, s in enumerate(steps, 1))
        return AgentReply(f"<plan>\n{head}\n{body}\n</plan>")

    return planner


def _web_critic(rng: random.Random, style: OfflineStyle) -> Callable:
    def critic(context: list[dict[str, str]]) -> AgentReply:
        last = context[-1]["content"]
        if last.startswith("Tool call:"):  # a call that failed: say what came back and what to do instead
            call, _, observation = last.removeprefix("Tool call:\n").partition("\n\nObservation:\n")
            grades = {"information_conflict": "good", "tool_effectiveness": "average", "trajectory_monitoring": "good"}
            if call.startswith(f"<{SEARCH.tag}>"):
                query = call.removeprefix(f"<{SEARCH.tag}>").removesuffix(f"</{SEARCH.tag}>")
                note = f"The search for '{query}' found nothing; search again with other words, such as a full name."
            else:
                note = f"The call failed ({observation.strip().splitlines()[0][:120] if observation.strip() else 'no output'}); try another page or search."
            return AgentReply(f"<reflection>{format_reflection(grades, note)}</reflection>")
        if last.startswith("The verifier gave score"):
            grades = {"information_conflict": "average", "tool_effectiveness": "average", "trajectory_monitoring": "poor"}
            note = "The answer is not backed by a page that states it; resolve every step on its own page."
            return AgentReply("<think>The verifier does not trust the answer. Let me review how we got it.</think>\n"
                              f"<reflection>{format_reflection(grades, note)}</reflection>")
        fields = result_fields(last.split("Result:\n", 1)[-1])
        evidence, conflicts = fields.get("evidence", "none"), fields.get("conflicts", "none")
        unknown = fields["answer"].strip() in ("", "unknown")
        direct = "not verified" in evidence
        grades = {
            "information_conflict": "good" if conflicts == "none" else ("poor" if "read" not in evidence else "average"),
            "tool_effectiveness": "poor" if unknown or "not found" in evidence else ("average" if direct else "good"),
            "trajectory_monitoring": "poor" if unknown or (direct and rng.random() < style.p_critic_catch)
            else ("average" if direct else "good"),
        }
        if "poor" in grades.values():
            note = "Re-plan: resolve each step on its own encyclopedia page" + (" with other search terms." if unknown else ".")
        elif conflicts != "none":
            note = "Sources disagree, but the encyclopedia pages settle it."
        elif direct:
            note = "The answer rests on a single snippet; the verifier should check it."
        else:
            note = "Every step is backed by a page."
        return AgentReply(f"<reflection>{format_reflection(grades, note)}</reflection>")

    return critic


def _verifier(rng: random.Random, style: OfflineStyle) -> Callable:
    def verifier(context: list[dict[str, str]]) -> AgentReply:
        fields = result_fields(context[-1]["content"].split("Result:\n", 1)[-1].split("\n\nSuggested answer:")[0])
        return AgentReply(f"<double_check>{format_double_check(*_score(fields, rng, style))}</double_check>")

    return verifier


def _score(fields: dict[str, str], rng: random.Random, style: OfflineStyle) -> tuple[int, str]:
    evidence, answer = fields.get("evidence", "none"), fields["answer"].strip()
    if answer in ("", "unknown") or "not found" in evidence or "not stated" in evidence:
        return 1, "There is no supported answer."
    if "not verified" in evidence:
        if rng.random() < style.p_lenient:
            return 3, "The top result's snippet seems to support the answer."
        return 2, "The answer comes from one search snippet that does not say it answers the question."
    if "snippet of" in evidence:
        return 3, "Each step is stated by an encyclopedia page, some only in its search snippet."
    return 4, "Each step is stated on an encyclopedia page that was read in full."


def _answerer(domain: str) -> Callable:
    def answerer(context: list[dict[str, str]]) -> AgentReply:
        last = context[-1]["content"]
        if last.startswith("The verifier accepted"):
            suggested = next((m["content"] for m in reversed(context) if m["role"] == "assistant"), "")
            answer = re.sub(r"</?suggested_answer>", "", suggested).strip()
            return AgentReply(f"<answer>{answer}</answer>")
        answer = result_fields(last.split("Result:\n", 1)[-1].split("\n\n")[0])["answer"].strip()
        if domain == "web":
            return AgentReply(f"<suggested_answer>{answer}</suggested_answer>")
        if domain == "math":
            return AgentReply(f"<answer>\\boxed{{{answer}}}</answer>")
        return AgentReply(f"<answer>\n{format_code(answer)}\n</answer>")

    return answerer


# ----------------------------------------------------------------------------- math and code


def _coder(domain: str, rng: random.Random, style: OfflineStyle) -> Callable[[str, str], Worker]:
    def start(question: str, plan: str) -> Worker:
        solution = solve_math(question) if domain == "math" else solve_code(question)
        if solution is None:
            return "<think>I do not recognise this problem and cannot write a program for it.</think>\n" \
                   "<result>answer: unknown</result>"
        show = domain == "code" and style.p_show_result > 0 and rng.random() < style.p_show_result  # no draw at 0
        check = example_check(question, show) if domain == "code" else None
        # one slip at most: with a second now and then (p_slip again) the student retried to its token limit
        drafts = ([rng.choice(solution.slips)] if solution.slips and rng.random() < style.p_slip else []) + [solution.code]
        output = ""
        for i, draft in enumerate(drafts):
            program = f"{draft}\n\n{check}\nprint('example passed')" if check else draft
            why = solution.approach if i == 0 else \
                f"{diagnose(output, solution.approach, example_parts(question) if show else None)} Let me fix it and run it again."
            ctx = yield f"<think>{why}</think>\n{CODE.call(chr(10) + format_code(program) + chr(10))}"
            output = _last(ctx)
            ok = ("example passed" in output) if check else _number(output) is not None
            if ok and draft is solution.code:
                if domain == "math":
                    value = _number(output)
                    return f"<think>The program printed {value}, which answers the question.</think>\n<result>answer: {value}</result>"
                return ("<think>The function passes the worked example, so it is ready.</think>\n"
                        f"<result>answer: {draft}</result>")
        return "<think>My programs keep failing; I cannot give a reliable answer.</think>\n<result>answer: unknown</result>"

    return start


def diagnose(output: str, approach: str, example: tuple[str, str] | None = None) -> str:
    """What a failed run's output says went wrong, read off its last error line (the coder's next thought);
    ``example`` (call, expected): the worked example's result was printed first, and a failed assert quotes it."""
    error = next((line.strip() for line in reversed(output.splitlines()) if re.match(r"\w+(Error|Exception)\b", line.strip())), "")
    printed = output.split("Traceback (most recent call last):", 1)[0].strip().splitlines()
    if example and error.startswith("AssertionError") and printed:
        return f"`{example[0]}` returned {printed[-1].strip()} where {example[1]} is expected, so the logic is wrong. {approach}"
    if m := re.match(r"NameError: name '(\w+)' is not defined", error):
        return f"The run failed: `{m[1]}` is not defined, a misspelt name or a missing import."
    if error.startswith("TypeError") and "str" in error:
        return "The run failed: a number is written as text (in quotes), so the arithmetic breaks."
    if error.startswith("AssertionError") and "whole number" in output:
        return "The run failed: the answer came out as a fraction; `/` divides exactly where `//` was meant."
    if error.startswith("AssertionError"):
        return f"The worked example failed, so the logic is wrong. {approach}"
    if error.startswith("TimeoutError") or "time" in output.lower() and "exceeded" in output.lower():
        return "The run took too long: the program must compute the answer more directly."
    return f"The run failed ({error or 'no answer printed'})."


def _number(output: str) -> str | None:
    lines = [line.strip() for line in output.strip().splitlines() if line.strip()]
    return lines[-1] if lines and re.fullmatch(r"-?\d+", lines[-1]) else None


def _code_critic(context: list[dict[str, str]]) -> AgentReply:
    output = context[-1]["content"].split("Output:\n", 1)[-1]
    bad = failed(CODE.tag, output)
    grades = {"information_conflict": "good", "tool_effectiveness": "poor" if bad else "good",
              "trajectory_monitoring": "average" if bad else "good"}
    last_error = next((line for line in reversed(output.splitlines()) if "Error" in line), "the run failed")
    clean = "The function passes the worked example." if "example passed" in output else \
        f"The program ran cleanly and printed {_number(output)}." if _number(output) is not None else \
        "The program ran cleanly."
    note = f"The program failed ({last_error.strip()}); fix it before going on." if bad else clean
    return AgentReply(f"<reflection>{format_reflection(grades, note)}</reflection>")


def _code_planner(domain: str) -> Callable:
    def planner(context: list[dict[str, str]]) -> AgentReply:
        question = _question(_first(context, "Question: "))
        if domain == "math":
            solution = solve_math(question)
            steps = ["Write a short program that computes the answer.",
                     "If it fails, fix it and run it again; report the whole number in \\boxed{}."]
        else:
            solution = solve_code(question)
            steps = ["Write the function and run it on the worked example.",
                     "If it fails, fix it and run it again; report the complete function."]
        head = f"Strategy: {solution.kind if solution else 'unknown'} problem, solved with code"
        return AgentReply("<plan>\n" + head + "\n" + "\n".join(f"{i}. {s}" for i, s in enumerate(steps, 1)) + "\n</plan>")

    return planner


def offline_team(domain: str, rng: random.Random, style: OfflineStyle) -> Team:
    """A fresh offline team for one task (the workers keep per-task state)."""
    if domain == "web":
        return {"planner": _web_planner(rng, style), "searcher": _WorkerAgent(_searcher(rng, style)),
                "critic": _web_critic(rng, style), "verifier": _verifier(rng, style), "answerer": _answerer("web")}
    return {"planner": _code_planner(domain), "coder": _WorkerAgent(_coder(domain, rng, style)),
            "critic": _code_critic, "answerer": _answerer(domain)}
