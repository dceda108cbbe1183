"""Training the policy: SFT on the teacher's trajectories and DAPO RL on tool rollouts.

The modules (import them by name; this package imports nothing):

    data.py    SFT data: observation-masked tokenisation, packing with per-sample block masks, token loss
    sft.py     the SFT training loop: schedule, weighted token loss, exact resume (train_sft)
    kit.py     the training kit of SFT and RL: optimizer, autocast, RNG state, target logits, checkpoints
    zero.py    DeepSpeed ZeRO for both trainers: config from params, sharded loading, weights module by module
    dapo/      DAPO (arXiv 2503.14476): the loss, the update, the loop, the ranks (train_dapo)
"""
