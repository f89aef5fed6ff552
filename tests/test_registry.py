#!/usr/bin/env python3
"""ctest `test_registry`: the suite's registry is whole and every entry runs something.

1. every registered test carries exactly one of the labels unit, inproc,
   processes, slow (README "Tests");
2. every Catch2 case of every test executable (the file --exes lists them)
   is registered with ctest;
3. each registered Catch2 test's argument selects exactly its own case: a
   name that ctest split (a ';') or that Catch2 reads as a pattern or an
   option would otherwise pass with "No test cases matched" or run others.

For 3, an argument that is the case's own name, with each ',' escaped as
'\,' (tests/CMakeLists.txt does that), holding none of the other characters
Catch2 v2's test-spec parser treats specially (quotes, ~, [, ], *,
backslash, #) and not starting with '-', selects by Catch2's rule (names
compare whole and case-insensitively) exactly the cases whose names equal
it ignoring case: that is checked against the executable's list. Every
other argument is given to the executable with --list-test-names-only.
(One process per test took ~40 s of the CI's test phase.)

Usage: test_registry.py --ctest CTEST --binary-dir DIR --exes FILE
"""
import argparse
import json
import subprocess
import sys

KINDS = {"unit", "inproc", "processes", "slow"}
SPECIAL = set('"~[]*,\\#')


def list_names(exe, *spec):
    out = subprocess.run([exe, *spec, "--list-test-names-only"], capture_output=True, text=True,
                         timeout=120)
    return [line for line in out.stdout.split("\n") if line.strip()]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ctest", required=True)
    ap.add_argument("--binary-dir", required=True)
    ap.add_argument("--exes", required=True)
    a = ap.parse_args()
    shown = subprocess.run([a.ctest, "--show-only=json-v1"], cwd=a.binary_dir, capture_output=True,
                           text=True, timeout=120)
    if shown.returncode != 0:
        print(f"ctest --show-only failed ({shown.returncode}): {shown.stderr}", file=sys.stderr)
        return 1
    tests = json.loads(shown.stdout)["tests"]
    with open(a.exes) as f:
        exes = [line.strip() for line in f if line.strip()]
    failures = []
    names_of = {}
    for exe in exes:
        try:
            names_of[exe] = list_names(exe)
        except (OSError, subprocess.SubprocessError) as e:
            failures.append(f"{exe} is not built or does not list its cases ({e})")
    registered = set()
    spawned = 0
    for t in tests:
        name = t["name"]
        labels = []
        for p in t.get("properties", []):
            if p["name"] == "LABELS":
                labels = list(p["value"])
        kinds = [x for x in labels if x in KINDS]
        if len(kinds) != 1:
            failures.append(f'test "{name}": labels [{",".join(labels)}], '
                            "expected exactly one of unit, inproc, processes, slow")
        cmd = t.get("command", [])
        if len(cmd) < 2 or cmd[0] not in names_of:
            continue
        exe, arg = cmd[0], cmd[1]
        plain = not (SPECIAL & set(name)) or (set(name) & SPECIAL) == {","}
        if (plain and arg == name.replace(",", "\\,") and not arg.startswith("-")
                and arg == arg.strip()):
            selected = [n for n in names_of[exe] if n.lower() == name.lower()]
        else:
            spawned += 1
            selected = list_names(exe, arg)
        if selected != [name]:
            failures.append(f'test "{name}" ({exe}): its argument "{arg}" selects {selected}, '
                            "not exactly its own case")
            continue
        registered.add((exe, name))
    for exe, names in names_of.items():
        for n in names:
            if (exe, n) not in registered:
                failures.append(f'{exe}: the case "{n}" is not registered with ctest '
                                "(or selects more than itself)")
    for f in failures:
        print(f, file=sys.stderr)
    if failures:
        print(f"{len(failures)} problem(s) in the test registry", file=sys.stderr)
        return 1
    print(f"{len(tests)} tests, each with one label; {len(registered)} Catch2 cases, each registered "
          f"and selecting itself ({spawned} arguments checked by the executable)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
