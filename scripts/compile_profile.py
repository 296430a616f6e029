#!/usr/bin/env python3
"""Where one translation unit's compile time goes, by template family.

    bash scripts/compile_times.sh --profile [--opt -O2] examples/gpt_minimal.cpp

compiles the file with clang++ -ftime-trace (GCC 12's -ftime-report and -Q crash on tshard's
constexpr spec algebra) and calls this script on the trace and the object:

    python3 scripts/compile_profile.py TRACE.json OBJECT.o [--top N]

It prints the front end / back end split, then the families (a function's name with its template
arguments and parameters stripped: `tshard::detail::record`) that take the most instantiation
time, back-end optimisation time and machine code, and how much of the code is typed (compiled per
mesh/spec type) against compiled per element type or once. Those are the levers: a typed family
that is large per instance wants its body moved to descriptor code.
"""
import collections
import json
import re
import subprocess
import sys


def family(name):
    for _ in range(40):
        stripped = re.sub(r"<[^<>]*>", "", name)
        if stripped == name:
            break
        name = stripped
    name = re.sub(r"\{[^{}]*\}", "", name)
    name = re.sub(r"\(.*", "", name)
    return name.split(" ")[-1][-100:]


def typed(name):
    return "FixedString" in name or "Spec<" in name


def demangle(names):
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True).stdout
    return out.split("\n")[: len(names)]


def main():
    args = sys.argv[1:]
    top = 25
    if "--top" in args:
        i = args.index("--top")
        top = int(args[i + 1])
        del args[i : i + 2]
    trace, obj = args
    events = [e for e in json.load(open(trace))["traceEvents"] if e.get("ph") == "X"]
    totals = {e["name"]: e["dur"] / 1e6 for e in events if e["name"].startswith("Total ")}
    print(f"clang: {totals.get('Total ExecuteCompiler', 0):.1f} s: front end {totals.get('Total Frontend', 0):.1f} s "
          f"(instantiation {totals.get('Total PerformPendingInstantiations', 0):.1f} s), "
          f"back end {totals.get('Total Backend', 0):.1f} s")

    inst = collections.Counter()
    for e in events:
        if e["name"] == "InstantiateFunction":
            inst[family(e["args"].get("detail", ""))] += e["dur"] / 1e6
    print(f"\ninstantiation (s, nested: a caller includes its callees), top {top}:")
    for k, v in inst.most_common(top):
        print(f"{v:8.2f}  {k}")

    opt = collections.Counter()
    for e in events:
        if e["name"] == "OptFunction":
            opt[e["args"].get("detail", "")] += e["dur"] / 1e6
    names = list(opt)
    by_family, split = collections.Counter(), collections.Counter()
    for mangled, name in zip(names, demangle(names)):
        by_family[family(name)] += opt[mangled]
        split["typed" if typed(name) else "untyped"] += opt[mangled]
    print(f"\nback-end function passes (s; typed {split['typed']:.1f}, per element type or once "
          f"{split['untyped']:.1f}), top {top}:")
    for k, v in by_family.most_common(top):
        print(f"{v:8.2f}  {k}")

    size, count, split = collections.Counter(), collections.Counter(), collections.Counter()
    nm = subprocess.run(["nm", "-S", "-C", obj], capture_output=True, text=True).stdout
    for line in nm.splitlines():
        parts = line.split(None, 3)
        if len(parts) < 4 or parts[2] not in "TtWw":
            continue
        bytes_, name = int(parts[1], 16), parts[3]
        size[family(name)] += bytes_
        count[family(name)] += 1
        split["typed" if typed(name) else "untyped"] += bytes_
    print(f"\nmachine code (KiB, instances; typed {split['typed'] / 1024:.0f} KiB, per element type or once "
          f"{split['untyped'] / 1024:.0f} KiB), top {top}:")
    for k, v in size.most_common(top):
        print(f"{v / 1024:8.1f} {count[k]:5d}  {k}")


if __name__ == "__main__":
    main()
