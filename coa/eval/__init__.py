"""Judging the policy: rollouts scored per task, their statistics, the eval stage's report and figures.

The modules (import them by name; this package imports nothing, so coa.eval.metrics stays light for the
teacher and the filters that use it):

    evaluate.py     evaluate(engine, tasks, k): avg@k with a Wilson 95% interval, pass@k, format, tools, tokens
    metrics.py      pass@k, bootstrap and paired intervals, best-of-k; billed tokens and the token counter
    report.py       the eval stage's figures: a flat metrics section per model, slices, RL vs SFT paired
    plots.py        dvc plot rows per model, the headline table, matplotlib figures for MLflow
    diagnostics.py  teacher-forced accuracies on held-out teacher trajectories (the sft stage's heldout.*)
"""
