#!/usr/bin/env python3
"""Runs this conformance corpus against any TPDE reader. Python 3.8+, standard library only:
copy it next to your reader.

    python3 conformance/run.py [--corpus DIR] [--quiet] -- READER [ARGS...]

For every file of the manifest the runner calls

    READER [ARGS...] FILE [--base BASE]... [--follow-hints]

with the file's bases attached in order (its base, then that base's base, ...: the manifest's
`base` chain), or `--follow-hints` where the manifest says `follow_hints` (find the bases
through the path hints the files record, spec §7.3). The reader opens the file with its bases,
reads every tensor in directory order, then verifies it (spec §9.1), and prints one JSON object:

    {"tensors": [{"name": ..., "dtype": ..., "shape": [...], "sha256": ...}, ...],
     "metadata": [{"key": ..., "type": ..., "bytes": ...}, ...],
     "files": [{"path": ..., "length": ..., "sha256": ...}, ...]}

(sha256 of the tensor's logical bytes or the file's bytes, `bytes` the metadata value as stored,
all lowercase hex; `files` is the file table of spec §5.5, empty or absent when there is none),
or, if it rejects the file, {"error": CATEGORY} with the spec §9 category (`malformed`,
`checksum-mismatch`, ...). The runner compares that with the manifest and prints one line per
file (the rule it tests, and for a failure what the reader did instead); it exits 0 only if
every file passes. The reference reader's adapter is `tpde conformance-read`:

    python3 conformance/run.py -- tpde conformance-read
"""
import argparse
import json
import os
import subprocess
import sys


def chain(case, cases):
    """The manifest's bases of `case`, nearest first."""
    out, seen = [], set()
    base = case.get("base")
    while base is not None:
        if base in seen or base not in cases:
            raise ValueError(f"{case['file']}: the manifest's base chain is broken at {base}")
        seen.add(base)
        out.append(base)
        base = cases[base].get("base")
    return out


def check(case, got):
    """None if `got` (the reader's JSON) is what `case` expects, else why not."""
    expect = case["expect"]
    if expect["outcome"] == "invalid":
        if "error" not in got:
            return f"accepted; expected {expect['error']}"
        if got["error"] != expect["error"]:
            return f"rejected as {got['error']}, expected {expect['error']}: {got.get('message', '')}"
        return None
    if "error" in got:
        return f"rejected ({got['error']}): {got.get('message', '')}"
    want_t = [{k: t[k] for k in ("name", "dtype", "shape", "sha256")} for t in expect["tensors"]]
    got_t = [{k: t.get(k) for k in ("name", "dtype", "shape", "sha256")} for t in got.get("tensors", [])]
    if got_t != want_t:
        diff = next((w["name"] for g, w in zip(got_t, want_t) if g != w), None)
        return f"tensors differ ({len(got_t)} read, {len(want_t)} expected; first difference: {diff})"
    want_m = [(m["key"], m["type"], m["bytes"]) for m in expect["metadata"]]
    got_m = [(m.get("key"), m.get("type"), m.get("bytes")) for m in got.get("metadata", [])]
    if got_m != want_m:
        return f"metadata {got_m}, expected {want_m}"
    want_f = [(f["path"], f["length"], f["sha256"]) for f in expect.get("files", [])]
    got_f = [(f.get("path"), f.get("length"), f.get("sha256")) for f in got.get("files", [])]
    if got_f != want_f:
        return f"files {got_f}, expected {want_f}"
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", default=os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--quiet", action="store_true", help="print only the failures and the totals")
    ap.add_argument("reader", nargs=argparse.REMAINDER, help="-- READER [ARGS...]")
    args = ap.parse_args()
    reader = args.reader[1:] if args.reader[:1] == ["--"] else args.reader
    if not reader:
        ap.error("give the reader's command after --")
    with open(os.path.join(args.corpus, "manifest.json")) as f:
        manifest = json.load(f)
    if manifest.get("schema") != "tpde-conformance/1":
        sys.exit(f"manifest schema {manifest.get('schema')!r}; this runner reads tpde-conformance/1")
    cases = {c["file"]: c for c in manifest["files"]}
    failed = 0
    results = []
    for case in manifest["files"]:
        cmd = reader + [os.path.join(args.corpus, case["file"])]
        if case.get("follow_hints"):
            cmd.append("--follow-hints")
        for b in chain(case, cases):
            cmd += ["--base", os.path.join(args.corpus, b)]
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        try:
            why = check(case, json.loads(run.stdout))
        except json.JSONDecodeError:
            why = f"the reader printed no JSON (exit {run.returncode}): {run.stderr.strip()[-300:]}"
        results.append((case, why))
    listed = set(cases)
    for sub in ("valid", "invalid"):
        for name in sorted(os.listdir(os.path.join(args.corpus, sub))):
            if f"{sub}/{name}" not in listed:
                results.append(({"file": f"{sub}/{name}", "rule": "-"}, "not listed in the manifest"))
    for case, why in results:
        failed += why is not None
        if why is None and args.quiet:
            continue
        line = f"{'ok  ' if why is None else 'FAIL'} {case['rule']:<6} {case['file']}"
        if why is not None:
            breaks = f"the file breaks {case['rule']} (spec §9): " if case["file"].startswith("invalid/") else ""
            line += f": {breaks}{why}"
        print(line)
    print(f"{len(results)} files: {len(results) - failed} passed, {failed} failed (spec {manifest['spec_version']})")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
