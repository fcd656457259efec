#!/usr/bin/env python3
"""Runs Khronos OpenCL-CTS binaries directly on the system's driver and through `cloister run`,
subtest by subtest, and reports per binary: subtests passed directly, passed caged, and every
subtest whose result differs. The default `cloister` is the debug build the README's setup makes;
a release build (`--cloister target/release/cloister`) runs the caged side several times faster
(test_buffers on 2 pocl cores: 270 s debug, 60 s release, 38 s directly).

    python3 scripts/cts-compare.py --cts-build /tmp/cts/build [--cloister target/debug/cloister]
                                   [--out DIR] [--only LABEL,...] [--timeout SECONDS]

The CTS is not part of cloister: fetch KhronosGroup/OpenCL-CTS (with matching OpenCL-Headers and
SPIRV-Headers) and build it under /tmp, e.g. `cmake -S OpenCL-CTS -B /tmp/cts/build
-DCL_INCLUDE_DIR=... -DSPIRV_INCLUDE_DIR=... -DCL_LIB_DIR=/usr/lib/x86_64-linux-gnu
-DOPENCL_LIBRARIES=OpenCL` and `make test_basic test_api ...` (spirv-as on the PATH for
test_compiler). The direct runs and the caged runs go on side by side, one stream each.

A CTS binary runs all its subtests in one process; when the process dies before its closing
"PASSED/FAILED n of m" line (a driver crash, directly), the subtest it was in is recorded as
"crashed" and the binary is started again with the subtests that have no result yet.

Exit status: 0 when every subtest that passes directly passes caged, except those the cage
documents as not advertised (SVM), 1 otherwise."""

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time

# label, folder under test_conformance, binary, extra arguments (the quick list's invocations).
SUITES = [
    ("events", "events", "test_events", ["-w"]),
    ("api", "api", "test_api", ["-w"]),
    ("compiler", "compiler", "test_compiler", ["-w"]),
    ("basic", "basic", "test_basic", ["-w"]),
    ("buffers", "buffers", "test_buffers", ["-w"]),
    ("images_get_info", "images/clGetInfo", "test_cl_get_info", []),
    ("images_kernel_methods", "images/kernel_image_methods", "test_kernel_image_methods", []),
    ("images_fill", "images/clFillImage", "test_cl_fill_images", []),
    ("images_read_write", "images/clReadWriteImage", "test_cl_read_write_images", []),
    ("images_copy", "images/clCopyImage", "test_cl_copy_images", []),
    ("images_samplerless", "images/samplerlessReads", "test_samplerless_reads", []),
    ("images_streams", "images/kernel_read_write", "test_image_streams", ["CL_FILTER_NEAREST"]),
]

# Subtests that need what the cage does not advertise: they pass directly and report "not
# supported" caged (README, "What differs from running directly").
NOT_ADVERTISED = {
    "api": {"clone_kernel_with_exec_info", "clone_kernel_with_svm_ptrs"},
}

RESULT = re.compile(r"(?:^|[^A-Za-z0-9_])({name}) (passed|FAILED|skipped|test not supported)", re.M)
CLOSING = re.compile(r"^(PASSED|FAILED) \d+ of \d+ (sub-)?tests", re.M)


def subtests(binary):
    listing = subprocess.run([binary, "--list"], capture_output=True, text=True, errors="replace").stdout
    return [l.strip() for l in listing.splitlines() if re.fullmatch(r"\s+[A-Za-z0-9_]+", l)]


def run_suite(mode, label, folder, binary, extra, args):
    """One binary in one mode; returns {subtest: result} and writes LABEL.MODE.{log,json}."""
    names = subtests(binary)
    results, todo = {}, list(names)
    started = time.time()
    with open(os.path.join(args.out, f"{label}.{mode}.log"), "w") as log:
        while todo:
            cmd = [binary, *todo, *extra]
            if mode == "caged":
                cmd = [args.cloister, "run", "--", *cmd]
            log.write(f"### {len(todo)} subtests: {' '.join(todo)}\n")
            log.flush()
            try:
                p = subprocess.run(cmd, cwd=folder, capture_output=True, text=True, errors="replace",
                                   timeout=args.timeout)
                text, rc = p.stdout + p.stderr, p.returncode
            except subprocess.TimeoutExpired as e:
                out = e.stdout or ""
                text, rc = out.decode(errors="replace") if isinstance(out, bytes) else out, "timeout"
            log.write(text + f"\n### exit status {rc}\n")
            log.flush()
            for n in todo:
                m = re.search(RESULT.pattern.format(name=re.escape(n)), text, re.M)
                if m:
                    results[n] = "not supported" if m.group(2) == "test not supported" else m.group(2)
            left = [n for n in todo if n not in results]
            if not left:
                break
            if rc != "timeout" and CLOSING.search(text):
                for n in left:
                    results[n] = "no result"
                break
            # The last subtest that started without finishing is the one the process died in.
            started_names = [n for n in left if re.search(rf"^{re.escape(n)}\.\.\.", text, re.M)]
            dead = started_names[-1] if started_names else left[0]
            results[dead] = "timeout" if rc == "timeout" else "crashed"
            todo = [n for n in left if n != dead]
    doc = {"subtests": results, "seconds": round(time.time() - started)}
    with open(os.path.join(args.out, f"{label}.{mode}.json"), "w") as f:
        json.dump(doc, f, indent=1)
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cts-build", required=True, help="the CTS build folder (holds test_conformance/)")
    ap.add_argument("--cloister", default=os.path.join(os.path.dirname(__file__), "..", "target", "debug", "cloister"))
    ap.add_argument("--out", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "cloister-cts"))
    ap.add_argument("--only", help="comma-separated labels: " + ",".join(s[0] for s in SUITES))
    ap.add_argument("--timeout", type=int, default=3600, help="seconds per binary invocation")
    args = ap.parse_args()
    args.cloister = os.path.realpath(args.cloister)
    # Each binary runs in its own folder: a relative build path would not name it from there.
    args.cts_build = os.path.realpath(args.cts_build)
    if not os.access(args.cloister, os.X_OK):
        sys.exit(f"cts-compare: {args.cloister} is not an executable (build cloister first)")
    os.makedirs(args.out, exist_ok=True)
    only = set(args.only.split(",")) if args.only else None
    suites = []
    for label, sub, name, extra in SUITES:
        if only and label not in only:
            continue
        folder = os.path.join(args.cts_build, "test_conformance", sub)
        binary = os.path.join(folder, name)
        if not os.access(binary, os.X_OK):
            print(f"cts-compare: {binary} not built; skipping {label}", file=sys.stderr)
            continue
        suites.append((label, folder, binary, extra))

    results = {}

    def stream(mode):
        for label, folder, binary, extra in suites:
            try:
                results[(label, mode)] = run_suite(mode, label, folder, binary, extra, args)
            except OSError as e:
                # Said once, and the table still comes, with no result this way for any subtest.
                print(f"cts-compare: {label} {mode}: could not run {binary}: {e}", file=sys.stderr, flush=True)
                results[(label, mode)] = {}
            r = results[(label, mode)]
            print(f"cts-compare: {label} {mode}: {sum(v == 'passed' for v in r.values())} of {len(r)} passed", flush=True)

    threads = [threading.Thread(target=stream, args=(m,)) for m in ("direct", "caged")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    worse = False
    print("\n| binary | subtests | passed directly | passed caged | differ |")
    print("| --- | ---: | ---: | ---: | --- |")
    for label, _, binary, extra in suites:
        d, c = results[(label, "direct")], results[(label, "caged")]
        differ = sorted(n for n in set(d) | set(c) if d.get(n) != c.get(n))
        shown = ", ".join(f"{n} ({d.get(n)} / {c.get(n)})" for n in differ) or "none"
        name = " ".join([os.path.basename(binary), *extra])
        print(f"| {name} | {len(d)} | {sum(v == 'passed' for v in d.values())} | "
              f"{sum(v == 'passed' for v in c.values())} | {shown} |")
        for n in differ:
            if d.get(n) == "passed" and c.get(n) != "passed" and n not in NOT_ADVERTISED.get(label, set()):
                worse = True
    print(f"\nlogs and per-subtest results: {args.out}")
    if worse:
        print("cts-compare: a subtest that passes directly does not pass caged", file=sys.stderr)
    return 1 if worse else 0


if __name__ == "__main__":
    sys.exit(main())
