#!/usr/bin/env python
"""A terminology test set from a validation split: per sentence, the phrases a translation must
contain, taken from its reference.

    python scripts/make_term_test.py --ref ../shared/data/multi30k/val.en.gz \\
        --train-ref ../shared/data/multi30k/train.en.gz --output data/term_test/val.constraints

Line i of the output holds the phrases for sentence i of the split, tab-separated (an empty
line: none), the format of ``constraints=FILE`` (docs/evaluate-translate.md). How they are
chosen (docs/your-data.md): the reference's words of at least ``--min-letters`` letters that are
not among the ``--common`` most frequent words of the training references (so not "a", "the",
"man", which any model writes anyway), the ``--per-sentence`` rarest of them in the training
references (ties: the earlier word), in the reference's own spelling. A word rare in training is
what a glossary is for, and what an unconstrained model most often misses.

Build it on a validation split only: test splits are for final reporting, never for choices.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import re
import sys
from pathlib import Path

WORD = re.compile(r"[^\W\d_]+(?:['-][^\W\d_]+)*")  # letters, inner apostrophes and hyphens


def read_lines(path: Path) -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as handle:
        return [line.rstrip("\n") for line in handle]


def words(line: str) -> list[str]:
    return WORD.findall(line)


def choose_terms(reference: str, counts: collections.Counter, common: set[str], *,
                 per_sentence: int, min_letters: int) -> list[str]:
    """The reference's ``per_sentence`` rarest uncommon words (see the module docstring)."""
    candidates = []
    for word in words(reference):
        if len(word) >= min_letters and word.lower() not in common and word not in candidates:
            candidates.append(word)
    ranked = sorted(range(len(candidates)), key=lambda i: (counts[candidates[i].lower()], i))
    return [candidates[i] for i in sorted(ranked[:per_sentence])]  # in reference order


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ref", type=Path, required=True, help="the split's references")
    parser.add_argument("--train-ref", type=Path, required=True,
                        help="the training references (word frequencies)")
    parser.add_argument("--output", type=Path, required=True, help="the constraints file")
    parser.add_argument("--per-sentence", type=int, default=2, help="phrases per sentence")
    parser.add_argument("--common", type=int, default=150,
                        help="the most frequent training words never chosen")
    parser.add_argument("--min-letters", type=int, default=4)
    parser.add_argument("--checkpoint", type=Path, default=None,
                        help="leave out words this model's target vocabulary cannot write")
    args = parser.parse_args(argv)
    if "test" in args.ref.name:
        print("error: build the terminology test on a validation split, not a test split",
              file=sys.stderr)
        return 2
    counts = collections.Counter(word.lower() for line in read_lines(args.train_ref)
                                 for word in words(line))
    common = {word for word, _ in counts.most_common(args.common)}
    references = read_lines(args.ref)
    if args.checkpoint is not None:  # a word with a piece the model lacks can never be met
        from seq2seq.checkpoint import load_checkpoint, tokenizers_from_payload
        from seq2seq.data.vocab import UNK_ID

        target = tokenizers_from_payload(load_checkpoint(args.checkpoint)["tokenizers"]).tgt
        vocabulary = sorted({word for line in references for word in words(line)})
        unwritable = {word for word, ids in zip(vocabulary, target.encode(vocabulary), strict=True)
                      if UNK_ID in ids}
        common |= {word.lower() for word in unwritable}
    lines = [choose_terms(reference, counts, common, per_sentence=args.per_sentence,
                          min_letters=args.min_letters) for reference in references]
    args.output.parent.mkdir(parents=True, exist_ok=True)
    temporary = args.output.with_name(args.output.name + ".tmp")
    temporary.write_text("".join("\t".join(terms) + "\n" for terms in lines), encoding="utf-8")
    temporary.replace(args.output)  # never a half-written file
    phrases = sum(len(terms) for terms in lines)
    print(f"{args.output}: {phrases} phrases for {len(lines)} sentences "
          f"({sum(1 for terms in lines if terms)} with at least one)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
