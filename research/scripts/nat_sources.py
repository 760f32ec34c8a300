#!/usr/bin/env python3
"""Write the NAT study's test and dev sources (and dev references) beside its test references.

    cargo run --release --example corpus -- --out runs/corpus/de      # the same corpus
    python3 research/scripts/nat_sources.py runs/corpus/de docs/nat_run

The study commits `test.ref.gz` but not the English sources, so a copy baseline could not be
scored from its files. This reads the rebuilt corpus's `test.tsv` and `dev.tsv`
(`source<TAB>target`, the order the study reads them in), checks that the rebuilt corpus is the
study's (the SHA-256 of the sorted pairs and of each split in `corpus.json` equal the run's) and
that every test target equals the committed reference on the same line, and writes
`test.src.gz`, `dev.src.gz` and `dev.ref.gz` (gzip with mtime 0, so the bytes are
reproducible). Exits non-zero, writing nothing, if a check fails.
"""
import gzip
import json
import os
import sys


def read_lines_gz(path):
    with gzip.open(path, "rt", encoding="utf-8", newline="\n") as f:
        return [line.rstrip("\n") for line in f]


def write_lines_gz(path, lines):
    with open(path, "wb") as raw:
        with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as f:
            f.write("".join(line + "\n" for line in lines).encode("utf-8"))


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    corpus, run = sys.argv[1], sys.argv[2]
    ours = json.load(open(os.path.join(corpus, "corpus.json"), encoding="utf-8"))
    theirs = json.load(open(os.path.join(run, "corpus.json"), encoding="utf-8"))
    for key in ("sha256",):
        if ours[key] != theirs[key]:
            sys.exit(f"corpus sha256 {ours[key]} differs from the run's {theirs[key]}")
    for split in ("train", "dev", "test"):
        if ours[split] != theirs[split]:
            sys.exit(f"{split}: {ours[split]} differs from the run's {theirs[split]}")
    splits = {}
    for split in ("test", "dev"):
        with open(os.path.join(corpus, f"{split}.tsv"), encoding="utf-8", newline="\n") as f:
            rows = [line.rstrip("\n").split("\t") for line in f]
        if any(len(r) != 2 for r in rows):
            sys.exit(f"{split}.tsv: a line without exactly one tab")
        splits[split] = rows
    refs = read_lines_gz(os.path.join(run, "test.ref.gz"))
    test = splits["test"]
    if len(refs) != len(test):
        sys.exit(f"{len(test)} test pairs but {len(refs)} committed references")
    bad = [i for i, (row, ref) in enumerate(zip(test, refs)) if row[1] != ref]
    if bad:
        sys.exit(f"{len(bad)} test targets differ from test.ref.gz (first: line {bad[0] + 1})")
    write_lines_gz(os.path.join(run, "test.src.gz"), [r[0] for r in test])
    write_lines_gz(os.path.join(run, "dev.src.gz"), [r[0] for r in splits["dev"]])
    write_lines_gz(os.path.join(run, "dev.ref.gz"), [r[1] for r in splits["dev"]])
    print(
        f"corpus {ours['sha256']} = the run's; {len(test)} test targets = test.ref.gz line by line;"
        f" wrote test.src.gz ({len(test)} lines), dev.src.gz and dev.ref.gz ({len(splits['dev'])} lines)"
    )


if __name__ == "__main__":
    main()
