"""Writes a generated text-classification dataset: support tickets whose team (billing, technical,
shipping, account) shows in some of their words, among words every team's tickets share, with
typos, plus a categorical and a numeric column (a mixed table). Seeded, nothing downloaded.

    python pipelines/make_tickets.py                     # -> pipelines/data/tickets.csv (2,000 rows)
    python pipelines/make_tickets.py OUT.csv --rows 20000 --seed 1

`pipelines/tickets-text.yaml` trains on the default output.
"""

from __future__ import annotations

import argparse
import csv
import os
from pathlib import Path

import numpy as np

DEFAULT_OUT = Path(__file__).resolve().parent / "data" / "tickets.csv"

TEAMS = {
    "billing": ["refund", "invoice", "charged twice", "payment", "billing", "subscription fee", "credit card", "receipt"],
    "technical": ["crash", "error message", "bug", "app freezes", "does not load", "timeout", "broken button", "update failed"],
    "shipping": ["delivery", "package", "tracking number", "courier", "parcel", "arrived damaged", "shipment", "late order"],
    "account": ["password", "login", "sign in", "email address", "two factor", "locked out", "username", "profile"],
}
OPENINGS = ["hi", "hello", "good morning", "hey team", "dear support", "urgent", "quick question"]
FILLERS = ["my", "the", "since yesterday", "please help", "again", "this week", "thanks", "asap", "i think",
           "on my phone", "for my order", "it says", "cannot", "still", "need"]
CLOSINGS = ["thanks", "regards", "please fix", "waiting for an answer", "thank you", ""]
CHANNELS = ["email", "chat", "phone"]


def _typo(word: str, rng) -> str:
    if len(word) < 4 or rng.random() > 0.08:
        return word
    i = int(rng.integers(1, len(word) - 1))
    return word[:i] + word[i + 1] + word[i] + word[i + 2:]  # two letters swapped


def ticket(team: str, rng) -> str:
    words = [str(rng.choice(OPENINGS))]
    keys = rng.choice(TEAMS[team], size=int(rng.integers(1, 3)), replace=False)
    parts = [str(k) for k in keys] + [str(f) for f in rng.choice(FILLERS, size=int(rng.integers(3, 8)))]
    if rng.random() < 0.25:  # a distractor: another team's word
        other = str(rng.choice([t for t in TEAMS if t != team]))
        parts.append(str(rng.choice(TEAMS[other])))
    rng.shuffle(parts)
    words += parts + [str(rng.choice(CLOSINGS))]
    return " ".join(_typo(w, rng) for w in " ".join(words).split())


def make_tickets(out: str | Path, *, rows: int = 2000, seed: int = 0) -> int:
    rng = np.random.default_rng(seed)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".csv.tmp")
    teams = list(TEAMS)
    with open(tmp, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["text", "channel", "account_age_days", "team"])
        for _ in range(rows):
            team = str(rng.choice(teams))
            writer.writerow([ticket(team, rng), str(rng.choice(CHANNELS)), int(rng.integers(0, 3000)), team])
    os.replace(tmp, out)  # never a half-written file
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", default=str(DEFAULT_OUT))
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(f"wrote {make_tickets(args.out, rows=args.rows, seed=args.seed)} tickets to {args.out}")


if __name__ == "__main__":
    main()
