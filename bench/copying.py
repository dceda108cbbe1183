"""Does copying from the context form? The tiny base's attention init (base.tiny.init), normal vs mimetic.

    python bench/copying.py                    # both inits, 20,000 frames each (~3 minutes each on 2 cores)
    python bench/copying.py --frames 5000 --init mimetic

From a fresh tiny model (params.yaml's base.tiny shape, models/base's tokenizer), trains on synthetic
frames that only copying solves: an observation holding a random number (1-10 digits), then the policy's
"The program printed N" and \\boxed{N} (the observation masked from the loss, as in SFT). Then, on fresh
frames, prints the share of the digits after "printed" that the model predicts right (teacher-forced;
about 0.1 is chance) and the share of numbers right digit for digit, per init, with the CPU capability.
The frames have one shape, so the copy sits at an offset fixed by the number's length: the mimetic init
finds that; on frames of varied shape (rounds of code and observations before the copy) neither init
copies in this budget (the README's levers table).
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import time

import torch
from transformers import AutoTokenizer

from coa.config import load_params
from coa.model import build_tiny_model
from coa.pretrain import loop_config
from coa.sft import Example
from coa.train import train_sft


def frame(tok, rng: random.Random) -> tuple[Example, int, int]:
    """(example, index of the first digit after "printed", number of digits)."""
    digits = rng.randint(1, 10)
    n = str(rng.randint(10 ** (digits - 1) if digits > 1 else 0, 10 ** digits - 1))
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    obs = enc(f"<observation>\n{n}\n</observation>\n")
    head = enc("<think>The program printed ")
    tail = enc(f"{n}, which answers the question.</think>\n<answer>\\boxed{{{n}}}</answer>")
    ids = obs + head + tail + [tok.eos_token_id]
    mask = [0] * len(obs) + [1] * (len(ids) - len(obs))
    return Example(ids, mask, 1.0), len(obs) + len(head), len(n)


@torch.no_grad()
def digit_accuracy(model, tok, n: int, seed: int) -> tuple[float, float]:
    model.eval()
    rng, right, total, exact = random.Random(seed), 0, 0, 0
    for _ in range(n):
        ex, at, k = frame(tok, rng)
        pred = model(input_ids=torch.tensor([ex.input_ids])).logits[0].argmax(-1).tolist()
        ok = [pred[i - 1] == ex.input_ids[i] for i in range(at, at + k)]
        right, total, exact = right + sum(ok), total + k, exact + all(ok)
    model.train()
    return right / total, exact / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--init", choices=["normal", "mimetic", "both"], default="both")
    ap.add_argument("--frames", type=int, default=20000)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--tokenizer", default="models/base")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    params = load_params()
    tok = AutoTokenizer.from_pretrained(args.tokenizer)
    rng = random.Random(1)
    examples = [frame(tok, rng)[0] for _ in range(args.frames)]
    cfg = dataclasses.replace(loop_config(params.base.pretrain), lr=args.lr, dtype="float32")
    print(f"cpu {torch.backends.cpu.get_cpu_capability()}, float32, {args.threads} threads; {args.frames} frames, "
          f"{sum(map(len, examples))} tokens, lr {args.lr}, {cfg.row_tokens}-token rows")
    for init in (["normal", "mimetic"] if args.init == "both" else [args.init]):
        model = build_tiny_model(tok, dataclasses.replace(params.base.tiny, init=init), seed=1)
        before = digit_accuracy(model, tok, 200, seed=99)
        start = time.perf_counter()
        train_sft(model, examples, cfg, seed=1, pad_id=tok.pad_token_id, progress=False)
        seconds = time.perf_counter() - start
        digits, exact = digit_accuracy(model, tok, 200, seed=99)
        print(f"init {init:8s} digits right {before[0]:.3f} -> {digits:.3f}, numbers exact {before[1]:.3f} -> "
              f"{exact:.3f} (200 fresh frames), {seconds:.0f} s of training")


if __name__ == "__main__":
    main()
