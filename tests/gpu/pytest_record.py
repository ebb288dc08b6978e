"""pytest plugin of tests/gpu/run.sh's pytest group (-p pytest_record): each test's outcome is
appended to $FSDPCOMP_PYTEST_RECORD (JSON lines, flushed) the moment the test ends, so a group
that the outer timeout kills keeps every result it reached. `summarize` reads such a file back:
counts and the failures, what run.sh records as the group's result."""
from __future__ import annotations

import json
import os
import sys


def pytest_runtest_logreport(report):
    path = os.environ.get("FSDPCOMP_PYTEST_RECORD")
    # under pytest-xdist the controller sees every worker's report: a worker recording too
    # wrote each test twice (the first H200 run's -n 8)
    if not path or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    # one line per test: its call, or the setup/teardown that failed or skipped it
    if report.when == "call" or report.outcome != "passed":
        row = {"test": report.nodeid, "when": report.when, "outcome": report.outcome,
               "seconds": round(report.duration, 3)}
        if report.outcome == "failed":
            # the assertion's own message first (its line of `E ...`), then the traceback's end:
            # the end alone lost the message that says what differed
            crash = getattr(getattr(report.longrepr, "reprcrash", None), "message", "")
            row["error"] = (crash[:1000] + "\n...\n" if crash else "") + str(report.longrepr)[-1500:]
        elif report.outcome == "skipped" and isinstance(report.longrepr, tuple):
            row["reason"] = str(report.longrepr[2])[:300]
        with open(path, "a") as f:
            f.write(json.dumps(row) + "\n")
            f.flush()


def summarize(path: str) -> dict:
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    failures, skips = [], {}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                r = json.loads(line)
                counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
                if r["outcome"] == "failed":
                    failures.append({"test": r["test"], "error": r.get("error", "")[:1400]})
                elif r["outcome"] == "skipped":
                    skips[r.get("reason", "")] = skips.get(r.get("reason", ""), 0) + 1
    return {"counts": counts, "failures": failures[:50], "skip_reasons": skips, "last": _last(path)}


def _last(path: str) -> str | None:
    """The last test that ended (after a timeout: where the group was)."""
    if not os.path.exists(path):
        return None
    last = None
    with open(path) as f:
        for line in f:
            last = json.loads(line)["test"]
    return last


if __name__ == "__main__":  # python pytest_record.py FILE OUT_JSON
    with open(sys.argv[2], "w") as fh:
        json.dump(summarize(sys.argv[1]), fh, indent=1)
