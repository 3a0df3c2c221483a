"""scripts/gpu-check's table: what the score-correctness e2e tests saw on the GPU.

Reads pytest's JUnit XML (which tests passed) and the JSON lines that
integration-tests/sonde_http.py's assert_close appends under SONDE_E2E_DELTAS (every
|served - float64 reference| it compared), and prints one row per model and kind of score.

Usage: gpu_check_report.py JUNIT_XML DELTAS_JSONL REF_TOL
"""

import json
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict

MODELS = {  # test module -> the model it serves
    "test_reference": "SmolLM2-135M Q4_1",
    "test_gemma3": "Gemma 3 270M Q4_K_M",
}


def kind(what):
    """The kind of score compared, from assert_close's description of it."""
    if "label" in what:
        return "label logprobs"
    if what.startswith("top["):
        return "top-5 logprobs"
    if what.startswith("token ") or " step " in what:
        return "greedy tokens' logprobs"
    if what.startswith("prefill[") or " position " in what:
        return "prompt logprobs"
    return "other"


def module(test):
    return test.split("::")[0].rsplit("/", 1)[-1].removesuffix(".py")


def main(junit_path, deltas_path, ref_tol):
    tests = defaultdict(lambda: [0, 0])  # module -> [passed, failed]
    failed_names = []
    for case in ET.parse(junit_path).getroot().iter("testcase"):
        mod = case.get("classname", "").rsplit(".", 1)[-1]
        if case.find("failure") is not None or case.find("error") is not None:
            tests[mod][1] += 1
            failed_names.append(f"{mod}::{case.get('name')}")
        elif case.find("skipped") is None:
            tests[mod][0] += 1

    rows = defaultdict(list)  # (module, kind) -> deltas
    try:
        with open(deltas_path) as f:
            for line in f:
                d = json.loads(line)
                if d["tol"] == ref_tol:  # reference comparisons, not same-request ones
                    rows[(module(d["test"]), kind(d["what"]))].append(d["delta"])
    except FileNotFoundError:
        pass

    head = ("model", "tests passed / failed", "scores compared with float64", "values",
            "max Δ", "mean Δ", f"Δ > {ref_tol:g}")
    table = [head]
    for mod, model in MODELS.items():
        passed, failed = tests.get(mod, (0, 0))
        kinds = sorted(k for (m, k) in rows if m == mod) or ["(none recorded)"]
        for i, k in enumerate(kinds):
            ds = rows.get((mod, k), [])
            table.append((
                model if i == 0 else "",
                f"{passed} / {failed}" if i == 0 else "",
                k,
                str(len(ds)),
                f"{max(ds):.1e}" if ds else "-",
                f"{sum(ds) / len(ds):.1e}" if ds else "-",
                str(sum(d > ref_tol for d in ds)),
            ))
    widths = [max(len(r[c]) for r in table) for c in range(len(head))]
    for n, r in enumerate(table):
        print("| " + " | ".join(v.ljust(w) for v, w in zip(r, widths)) + " |")
        if n == 0:
            print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    if failed_names:
        print("failed: " + ", ".join(failed_names))


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]))
