"""The task filters between curate and RL: which tasks teach the policy something.

The modules (import them by name; this package imports nothing):

    difficulty.py  closed-book pass rates r_q of a reference model; web tasks it guesses are dropped (difficulty stage)
    solve.py       the solve filter's decisions on the SFT policy's k rollouts: k/k and 0/k drops (solve_filter stage)
"""
