"""Billed tokens, counted one way for the teacher's agent calls and the student's segments."""

from __future__ import annotations

from coa.eval.metrics import billed_tokens, student_calls, token_counter


def words(text: str) -> int:
    return len(text.split())


def test_billed_tokens_sums_inputs_and_outputs():
    calls = [(("sys prompt", "question here"), "a plan"), (("sys", "question here", "a plan"), "answer")]
    assert billed_tokens(calls, words) == (2 + 2 + 2) + (1 + 2 + 2 + 1)
    assert billed_tokens([], words) == 0


def test_student_segments_reread_everything_before_them():
    traj = ("<plan>p</plan>\n<web_search>q</web_search>\n<observation>o1 o2</observation>\n"
            "<think>t</think>\n<answer>a</answer>")
    calls = student_calls("the prompt", traj)
    assert len(calls) == 2  # one stop at the tool call, one at the answer
    first_in, first_out = calls[0]
    second_in, second_out = calls[1]
    assert first_in == ("the prompt",) and first_out.endswith("</web_search>\n")
    assert second_in == ("the prompt", first_out, "<observation>o1 o2</observation>")
    assert "".join([first_out, second_in[2], second_out]) == traj
    # the student pays for the prompt twice and the first segment twice
    assert billed_tokens(calls, len) == 2 * len("the prompt") + 2 * len(first_out) + len(second_in[2]) + len(second_out)


def test_no_tool_call_is_one_call():
    assert student_calls("p", "<think>x</think><answer>y</answer>") == [(("p",), "<think>x</think><answer>y</answer>")]


def test_token_counter_uses_the_tokenizer_without_special_tokens():
    class Tok:
        calls = 0

        def __call__(self, text, add_special_tokens=True):
            Tok.calls += 1
            assert add_special_tokens is False
            return {"input_ids": list(range(len(text.split())))}

    count = token_counter(Tok())
    assert count("a b c") == 3 and count("a b c") == 3 and Tok.calls == 1


def test_paired_difference_pairs_attempts_and_resamples_tasks():
    from coa.eval.metrics import paired_difference

    a = {("t1", 0): True, ("t1", 1): True, ("t2", 0): False, ("t2", 1): True, ("t3", 0): True, ("t9", 0): True}
    b = {("t1", 0): False, ("t1", 1): True, ("t2", 0): False, ("t2", 1): False, ("t3", 0): True}
    d = paired_difference(a, b, n_boot=500, seed=0)
    assert (d["tasks"], d["attempts"]) == (3, 5)  # t9 has no partner
    assert d["accuracy_diff"] == 0.4  # (1 + 0 + 0 + 1 + 0) / 5 attempts
    assert d["ci_low"] <= d["accuracy_diff"] <= d["ci_high"] and d["ci_low"] >= 0.0  # no task favours b
    same = paired_difference(a, a, n_boot=200, seed=1)
    assert same["accuracy_diff"] == same["ci_low"] == same["ci_high"] == 0.0
