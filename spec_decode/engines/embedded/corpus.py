"""A seeded synthetic-English corpus and the prompt set, identical on every Python version.

Only ``random.Random(seed).random()`` is used: its output stream is guaranteed across Python versions,
while ``choice``/``randint`` are built on helpers whose algorithms may change.

    python -m spec_decode.engines.embedded.corpus --out data/corpus.txt        # DVC stage `corpus`
    python -m spec_decode.engines.embedded.corpus --prompts data/prompts.jsonl # once; then curated by hand
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
from pathlib import Path

NOUNS = [
    "robot",
    "baker",
    "teacher",
    "river",
    "garden",
    "doctor",
    "sailor",
    "farmer",
    "painter",
    "child",
    "dog",
    "cat",
    "king",
    "queen",
    "pilot",
    "student",
    "miner",
    "singer",
]
ADJECTIVES = ["old", "brave", "quiet", "small", "happy", "clever", "tired", "young", "kind", "strange"]
# (third person singular present, past)
VERBS = [
    ("sleeps", "slept"),
    ("walks", "walked"),
    ("sings", "sang"),
    ("works", "worked"),
    ("waits", "waited"),
    ("reads", "read"),
    ("dances", "danced"),
    ("writes", "wrote"),
    ("laughs", "laughed"),
    ("cooks", "cooked"),
    ("plays", "played"),
    ("rests", "rested"),
    ("listens", "listened"),
    ("travels", "traveled"),
]
PLACES = [
    "in the old house",
    "on the hill",
    "by the river",
    "near the market",
    "in the garden",
    "at the station",
    "under the bridge",
    "in the forest",
    "on the boat",
    "at the school",
]
TIMES = ["on monday", "in the morning", "at night", "every day", "in winter", "after dinner", "today"]
CONJUNCTIONS = ["and", "but", "because", "while", "so"]
COUNTS = ["two", "three", "four", "five", "many", "some"]
PLURAL_VERBS = ["sleep", "walk", "sing", "work", "wait", "read", "dance", "write", "laugh", "cook"]


class Grammar:
    def __init__(self, seed: int):
        self.rng = random.Random(seed)

    def pick(self, items: list):
        return items[int(self.rng.random() * len(items))]

    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    def noun_phrase(self) -> str:
        adj = f"{self.pick(ADJECTIVES)} " if self.chance(0.5) else ""
        return f"the {adj}{self.pick(NOUNS)}"

    def clause(self) -> str:
        if self.chance(0.15):
            subject = f"{self.pick(COUNTS)} {self.pick(NOUNS)}s"
            verb = self.pick(PLURAL_VERBS)
        else:
            subject = self.noun_phrase()
            present, past = self.pick(VERBS)
            verb = past if self.chance(0.4) else present
        parts = [subject, verb]
        if self.chance(0.7):
            parts.append(self.pick(PLACES))
        if self.chance(0.4):
            parts.append(self.pick(TIMES))
        return " ".join(parts)

    def sentence(self) -> str:
        s = self.clause()
        if self.chance(0.3):
            s += f" {self.pick(CONJUNCTIONS)} {self.clause()}"
        return s[0].upper() + s[1:] + "."

    def text(self, n_chars: int) -> str:
        out: list[str] = []
        size = 0
        while size < n_chars:
            s = self.sentence()
            out.append(s)
            size += len(s) + 1
        return " ".join(out)[:n_chars]


def build_corpus(seed: int, n_chars: int) -> str:
    return Grammar(seed).text(n_chars)


def build_prompts(seed: int, count: int) -> list[dict]:
    g = Grammar(seed)
    prompts = []
    for i in range(count):
        text = " ".join(g.sentence() for _ in range(2)) + " "
        prompts.append({"id": f"p{i:02d}", "text": text})
    return prompts


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--chars", type=int, default=2_000_000)
    ap.add_argument("--prompt-seed", type=int, default=99)
    ap.add_argument("--prompt-count", type=int, default=8)
    ap.add_argument("--out", default="data/corpus.txt")
    ap.add_argument("--prompts", default=None, help="also write a prompt set (JSONL) here")
    args = ap.parse_args(argv)
    text = build_corpus(args.seed, args.chars)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text, encoding="ascii")
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    print(f"corpus: {len(text)} chars sha256 {digest} -> {args.out}")
    if args.prompts:
        lines = "".join(json.dumps(p) + "\n" for p in build_prompts(args.prompt_seed, args.prompt_count))
        Path(args.prompts).write_text(lines, encoding="ascii")
        print(f"prompts -> {args.prompts}")


if __name__ == "__main__":
    main()
