#!/usr/bin/env python3
"""The figures of scripts/gpu-check.sh, read from what its commands wrote into OUT_DIR.

  gpu_figures.py cuda-tests LOG      the `cuda` tests: how many ran, passed, skipped (exit 1 if any
                                     skipped or failed, or none ran)
  gpu_figures.py mem JSON            `trainer mem --json`: the GPUs NVML lists (exit 1 if none)
  gpu_figures.py peer JSON           bench/peer/peer_bench.py --json: trainer's samples/s over the
                                     hand-written LibTorch loop's (ratio of medians)
  gpu_figures.py bench CSV           a `trainer bench --csv`: samples/s, step time and peak per cell
                                     (exit 1 if a cell did not run)
  gpu_figures.py estimate CSV        a `trainer bench --csv` over micro-batches: predicted against
                                     measured peak (exit 1 if a cell is off by more than 10 %)
  gpu_figures.py estimate-offload JSON CSV
                                     `trainer estimate --json` with oom_backoff's ladder beside a
                                     `trainer bench --csv` over plugins.oom_backoff.start_offload:
                                     the peak predicted as configured and on the offload rung
                                     against the measured, and the saving (exit 1 if a peak is off
                                     by more than 10 %, the saving by more than 20 %, a cell is
                                     missing or the rung was not probed)
  gpu_figures.py json OUT_DIR        OUT_DIR/figures.json: the machine and every check of
                                     OUT_DIR/summary.txt with its figure
  gpu_figures.py pypi-tests JSON     `ctest --show-only=json-v1`: a `ctest -E` expression of the
                                     tests that need PyPI (the tests labelled `pypi`, which set up
                                     virtual environments, and what needs their fixtures, directly
                                     or through another fixture)
  gpu_figures.py pypi-labels JSON    `ctest --show-only=json-v1`: every test whose command runs a
                                     shell script that calls pip is among pypi-tests'
                                     (exit 1 naming those that are not: a `pypi` label missing)
  gpu_figures.py passed-tests LOG    a ctest log: the tests that passed, one per line
  gpu_figures.py passed-index JSON:FILES EXCLUDE LABEL_EXCLUDE
                                     `ctest --show-only=json-v1` and files naming tests: a `ctest -I`
                                     list of the other tests ("none": no other) but those whose name
                                     matches EXCLUDE or a label LABEL_EXCLUDE (ctest's -E and -LE,
                                     which must not go with -I: ctest numbers -I among the tests
                                     they leave, not among all)

Each command but `json`, `pypi-tests`, `pypi-labels`, `passed-tests` and `passed-index` prints one line, the figure, for the summary.
"""
import csv
import json
import os
import re
import statistics
import subprocess
import sys


def fail(figure):
    print(figure)
    sys.exit(1)


def cuda_tests(log):
    text = open(log, errors="replace").read()
    # ctest: "  3/15 Test  #7: Devices/OnDevice.X/cuda0 ....***Skipped   0.01 sec"
    #   "  4/16 Test #229: Devices/OnDevice.X/cuda0  # GetParam() = "cuda:0" ....***Skipped   0.4 sec"
    #   "  5/16 Test #230: X/cpu .....Subprocess aborted***Exception   0.2 sec"
    rows = re.findall(r"Test\s+#\d+: (\S+)[^\n]*?(Passed|\*\*\*[^\n]*?)\s+[\d.]+ sec", text)
    ran = [name for name, state in rows if state == "Passed"]
    skipped = [name for name, state in rows if state == "***Skipped"]
    failed = [name for name, state in rows if state not in ("Passed", "***Skipped", "***Not Run (Disabled)")]
    figure = f"{len(ran)}_passed_{len(skipped)}_skipped_{len(failed)}_failed"
    if skipped:
        figure += "_skipped:" + ",".join(skipped[:5])
    if failed:
        figure += "_failed:" + ",".join(failed[:5])
    if not ran or skipped or failed:
        fail(figure)
    print(figure)


def mem(path):
    data = json.load(open(path))
    gpus = [d for d in data.get("devices", []) if d.get("device", "").startswith("cuda:")]
    if data.get("source") != "nvml" or not gpus:
        fail(f"source_{data.get('source')}_{len(gpus)}_GPUs:{';'.join(data.get('notes', []))[:200]}")
    print(",".join(f"{g['device']}={g['name'].replace(' ', '_')}:{g['uuid']}:{g['total_bytes'] >> 20}MiB_total:"
                   f"{g['free_bytes'] >> 20}MiB_free" for g in gpus))


def peer(path):
    data = json.load(open(path))
    r = data["results"]
    med = {w: statistics.median(x["samples_per_s"] for x in r[w]) for w in r}
    print(f"trainer_{med['trainer']:.0f}_samples/s_cpp_{med['cpp']:.0f}_ratio_{med['trainer'] / med['cpp']:.3f}")


def rows_of(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def cell_name(row, keys):
    return "/".join(f"{k.split('.')[-1]}={row[k]}" for k in keys)


def bench(path):
    rows = rows_of(path)
    keys = [k for k in rows[0] if k not in RESULT_COLUMNS] if rows else []
    parts, bad = [], False
    for row in rows:
        if row["status"] != "ok":
            bad = True
            parts.append(f"{cell_name(row, keys)}:{row['status']}")
            continue
        parts.append(f"{cell_name(row, keys)}:{float(row['samples_per_s']):.0f}_samples/s,"
                     f"{float(row['step_ms_median']):.2f}_ms,{float(row['peak_mib']):.0f}_MiB_peak")
    if not rows or bad:
        fail(";".join(parts) or "no_cells")
    print(";".join(parts))


def estimate(path):
    rows = rows_of(path)
    keys = [k for k in rows[0] if k not in RESULT_COLUMNS] if rows else []
    parts, bad = [], not rows
    for row in rows:
        if row["status"] != "ok" or not row["predicted_peak_mib"] or not row["peak_mib"]:
            bad = True
            parts.append(f"{cell_name(row, keys)}:{row['status']}")
            continue
        predicted, measured = float(row["predicted_peak_mib"]), float(row["peak_mib"])
        error = (predicted - measured) / measured
        bad = bad or abs(error) > 0.10
        parts.append(f"{cell_name(row, keys)}:predicted_{predicted:.0f}_measured_{measured:.0f}_MiB_({error:+.1%})")
    if bad:
        fail(";".join(parts) or "no_cells")
    print(";".join(parts))


def estimate_offload(estimate_path, csv_path):
    with open(estimate_path) as f:
        rungs = json.load(f)["ladder"]["rungs"]
    predicted = {False: rungs[0]["peak_bytes"] / 2**20 if rungs else None,
                 True: next((r["peak_bytes"] / 2**20 for r in rungs if r.get("offload")), None)}
    parts, bad, compared = [], predicted[True] is None, set()
    if bad:
        parts.append("offload_rung_not_probed")
    measured_mib = {}
    for row in rows_of(csv_path):
        offload = row["plugins.oom_backoff.start_offload"] == "true"
        name = "offload" if offload else "as_configured"
        if row["status"] != "ok" or not row["peak_mib"] or predicted[offload] is None:
            bad = True
            parts.append(f"{name}:{row['status'] if row['status'] != 'ok' else 'not_predicted'}")
            continue
        measured = float(row["peak_mib"])
        error = (predicted[offload] - measured) / measured
        bad = bad or abs(error) > 0.10
        compared.add(offload)
        measured_mib[offload] = measured
        parts.append(f"{name}:predicted_{predicted[offload]:.0f}_measured_{measured:.0f}_MiB_({error:+.1%})")
    if compared != {False, True}:
        bad = True
        parts.append("missing_" + "_and_".join(n for o, n in ((False, "as_configured"), (True, "offload"))
                                               if o not in compared))
    else:
        # The saving itself, which a peak within 10 % need not show where the moments are small.
        saving, measured_saving = predicted[False] - predicted[True], measured_mib[False] - measured_mib[True]
        error = (saving - measured_saving) / measured_saving if measured_saving > 0 else float("inf")
        bad = bad or abs(error) > 0.20
        parts.append(f"saving:predicted_{saving:.0f}_measured_{measured_saving:.0f}_MiB_({error:+.1%})")
    if bad:
        fail(";".join(parts) or "no_cells")
    print(";".join(parts))


RESULT_COLUMNS = {"status", "micro_batch_used", "samples_per_s", "step_ms_median", "step_ms_min", "step_ms_max",
                  "peak_mib", "predicted_peak_mib", "out_of_memory", "measured_steps", "note"}


def machine():
    m = {}
    try:
        q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=60)
        m["gpus"] = [line.strip() for line in q.stdout.splitlines() if line.strip()]
        v = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=60)
        cuda = re.search(r"CUDA Version: ([\d.]+)", v.stdout)
        m["driver_cuda"] = cuda.group(1) if cuda else ""
    except (OSError, subprocess.TimeoutExpired) as e:
        m["gpus"] = []
        m["nvidia_smi"] = str(e)
    try:
        t = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__, torch.version.cuda)"],
                           capture_output=True, text=True, timeout=120)
        m["torch"] = t.stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        m["torch"] = str(e)
    m["host"] = os.uname().nodename
    return m


def to_json(out_dir):
    checks = []
    with open(os.path.join(out_dir, "summary.txt")) as f:
        for line in f:
            status, name, figure = (line.rstrip("\n").split(" ", 2) + ["", ""])[:3]
            checks.append({"check": name, "status": status, "figure": figure})
    with open(os.path.join(out_dir, "figures.json"), "w") as f:
        json.dump({"machine": machine(), "checks": checks}, f, indent=1)
        f.write("\n")


# The label of the tests that take packages from PyPI (the fixtures that set up virtual
# environments or download a wheel): a GPU machine has no network.
PYPI_LABEL = "pypi"


def prop(test, name):
    for p in test.get("properties", []):
        if p["name"] == name:
            return set(p["value"] if isinstance(p["value"], list) else [p["value"]])
    return set()


def pypi_names(tests):
    # The tests labelled `pypi` need PyPI; a test that sets up or needs a fixture one of them
    # sets up needs it too, and so does every test of a fixture that test sets up, until
    # nothing changes.
    names = {t["name"] for t in tests if PYPI_LABEL in prop(t, "LABELS")}
    needed = set().union(*(prop(t, "FIXTURES_SETUP") for t in tests if t["name"] in names))
    changed = True
    while changed:
        changed = False
        for t in tests:
            if t["name"] in names:
                continue
            if (prop(t, "FIXTURES_REQUIRED") | prop(t, "FIXTURES_SETUP") | prop(t, "FIXTURES_CLEANUP")) & needed:
                names.add(t["name"])
                needed |= prop(t, "FIXTURES_SETUP")
                changed = True
    return names


def pypi_tests(path):
    names = pypi_names(json.load(open(path))["tests"])
    if names:
        print(name_regex(names))


# A shell script's line (not a comment) that takes packages from PyPI: pip's install or download.
PIP_CALL = re.compile(r"^(?!\s*#).*\bpip[0-9.]*\"?\s+(install|download)\b", re.MULTILINE)


def pypi_labels(path):
    tests = json.load(open(path))["tests"]
    known = pypi_names(tests)
    missing = []
    for t in tests:
        for arg in t.get("command", []):
            if arg.endswith(".sh") and os.path.isfile(arg):
                with open(arg, errors="replace") as f:
                    if PIP_CALL.search(f.read()) and t["name"] not in known:
                        missing.append(f"{t['name']} ({arg} calls pip)")
    if missing:
        sys.exit("tests that take packages from PyPI without the `pypi` label, or a fixture of one: "
                 + "; ".join(missing))


def name_regex(names):
    """A ctest regular expression that matches exactly these test names."""
    special = set("\\.^$|()[]*+?{}")  # ctest's expressions take a backslash before each
    return "^(" + "|".join("".join("\\" + c if c in special else c for c in n) for n in sorted(names)) + ")$"


def passed_tests(log):
    """The tests that passed in a ctest log, sorted, one per line (none when it has none)."""
    names = set()
    for line in open(log, errors="replace"):
        # "  3/30 Test #12: Oom.Recovers ....   Passed   21.50 sec", the name perhaps followed by
        # gtest's "  # GetParam() = ..." (its first word names it).
        m = re.match(r"\s*\d+/\d+ Test\s+#\d+: (\S+).*?\s+Passed\s+[\d.]+ sec", line)
        if m:
            names.add(m.group(1))
    for n in sorted(names):
        print(n)


def passed_index(args, exclude="", label_exclude=""):
    """`JSON:FILES`: `ctest --show-only=json-v1` and files (separated by colons) naming tests,
    one per line (`#` comments). A `ctest -I` list of the tests they do not name, by number
    ("0,0,0,4,7,..."; a list of numbers has no size limit, unlike ctest's -E expressions);
    "none" when they name every test; nothing when they name none of them.

    The tests whose name matches `exclude` or one of whose labels matches `label_exclude` are
    left out of the list too: ctest 3.25 numbers -I among the tests that -E, -LE and -L leave,
    while it prints each test's number among all, so the list must be used without them."""
    json_path, _, paths = args.partition(":")
    names = set()
    for path in paths.split(":"):
        for line in open(path):
            line = line.split("#", 1)[0].strip()
            if line:
                if not re.fullmatch(r"[^\s#]+", line):
                    raise ValueError(f"{path}: '{line}' is not a test name")
                names.add(line)
    tests = json.load(open(json_path))["tests"]

    def dropped(test):
        if exclude and re.search(exclude, test["name"]):
            return True
        return bool(label_exclude) and any(re.search(label_exclude, label) for label in prop(test, "LABELS"))

    # A test is named by its name's first word: gtest's value-parameterised tests are named
    # `Suite.Test/param  # GetParam() = ...`, and the log (passed-tests) keeps that word.
    def key(test):
        return test["name"].split()[0] if test["name"].split() else test["name"]

    if not names & {key(t) for t in tests}:
        return
    left = [str(i + 1) for i, t in enumerate(tests) if key(t) not in names and not dropped(t)]
    print("0,0,0," + ",".join(left) if left else "none")


def main():
    commands = {"cuda-tests": cuda_tests, "mem": mem, "peer": peer, "bench": bench, "estimate": estimate,
                "estimate-offload": estimate_offload, "json": to_json, "pypi-tests": pypi_tests, "pypi-labels": pypi_labels,
                "passed-index": passed_index,
                "passed-tests": passed_tests}
    extra = {"passed-index": 2, "estimate-offload": 1}.get(sys.argv[1] if len(sys.argv) > 1 else "", 0)
    if len(sys.argv) != 3 + extra or sys.argv[1] not in commands:
        sys.exit(__doc__)
    try:
        commands[sys.argv[1]](*sys.argv[2:])
    except (OSError, ValueError, KeyError, IndexError, ZeroDivisionError, statistics.StatisticsError,
            re.error) as e:
        fail(f"unreadable_{os.path.basename(sys.argv[2])}:{type(e).__name__}:{e}".replace(" ", "_")[:300])


if __name__ == "__main__":
    main()
