"""Soak: mixed traffic against the real launcher for a while, sampling each process's memory
and open files. `scripts/soak` runs it (10 minutes); test_soak.py runs a short one in CI.

Traffic, from WORKERS clients (well under --max-concurrent-requests, so nothing is meant to
get a 429): /generate, /generate_stream, Vertex predict with scores, OpenAI chat, prompt
logprobs, and streams dropped after a few events. Every answer that is not a deliberate drop
is checked against the same request run alone before the soak (greedy: the same tokens).

Every INTERVAL_S: RSS and open fds of the launcher, the router and the shard (from /proc),
and the requests completed. Asserts: no failed request, peak RSS after the warm-up at most
RSS_GROWTH_MAX above the RSS at its end, and no more open fds once idle than before.
Writes soak.csv, summary.json and (with matplotlib) soak.png into --out.
"""

import argparse
import csv
import itertools
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
from sonde_http import MODEL_ID, assert_same_tokens, sse_events  # noqa: E402

WORKERS = 6
INTERVAL_S = 5
RSS_GROWTH_MAX = 0.05
PREFILL_TOL = 1e-4
# (kind, weight): how often each kind comes up in a worker's rotation.
MIX = [("generate", 3), ("stream", 3), ("vertex", 2), ("chat", 2), ("prompt_logprobs", 1),
       ("shared_prefix", 2), ("drop", 1)]
# A context every "shared_prefix" request starts with: several of the prefix cache's
# 16-token blocks, found cached again and again, with its prompt logprobs checked each time.
CONTEXT = ("Question: which of these sentences is true? Read the context first. The river "
           "that runs through the old town is crossed by three bridges, the oldest of which "
           "was built of stone two hundred years ago. Answer: ")
PROMPTS = ["The capital of France is", "Water boils at", "My favourite fruit is the",
           "In the morning I like to"]
NEW_TOKENS = 16
PROCESSES = ("launcher", "router", "shard")


def _bodies(prompt):
    """Each kind's (route, body) for a prompt."""
    scored = {"max_new_tokens": NEW_TOKENS, "details": True, "top_n_tokens": 3,
              "decoder_input_details": True}
    return {
        "generate": ("/generate", harness.gen_body(prompt, NEW_TOKENS)),
        "stream": ("/generate_stream", harness.gen_body(prompt, NEW_TOKENS)),
        "vertex": ("/predict", {"instances": [{"inputs": prompt, "parameters": scored}]}),
        "chat": ("/v1/chat/completions", {"model": MODEL_ID, "max_tokens": NEW_TOKENS, "temperature": 0,
                                           "messages": [{"role": "user", "content": prompt}]}),
        "prompt_logprobs": ("/generate", {"inputs": prompt, "parameters": {
            "max_new_tokens": 0, "decoder_input_details": True}}),
        "shared_prefix": ("/generate", {"inputs": CONTEXT + prompt, "parameters": {
            "max_new_tokens": 0, "decoder_input_details": True}}),
        "drop": ("/generate_stream", harness.gen_body(prompt, 200)),
    }


def _ask(session, lz, kind, prompt):
    """The request's answer reduced to what must not change between runs, or None (drop)."""
    path, body = _bodies(prompt)[kind]
    if kind == "drop":
        # A client that goes away mid-stream: a fresh connection, closed after 3 events.
        with requests.post(lz.url + path, json=body, stream=True, timeout=120) as r:
            for n, _ in enumerate(sse_events(r), 1):
                if n == 3:
                    break
        return None
    if kind == "stream":
        with session.post(lz.url + path, json=body, stream=True, timeout=120) as r:
            events = list(sse_events(r))
        assert events and all("error" not in e for e in events), events[-1:]
        tokens = [e["token"] for e in events]
        return {"text": events[-1]["generated_text"], "tokens": tokens}
    r = session.post(lz.url + path, json=body, timeout=120)
    assert r.status_code == 200, f"{path}: {r.status_code} {r.text[:500]}"
    out = r.json()
    if kind == "generate":
        return {"text": out["generated_text"], "tokens": out["details"]["tokens"]}
    if kind == "vertex":
        [pred] = out["predictions"]
        d = pred["details"]
        assert len(d["top_tokens"]) == NEW_TOKENS and all(len(t) == 3 for t in d["top_tokens"])
        assert len(d["prefill"]) > 1, d["prefill"]
        return {"text": pred["generated_text"], "tokens": d["tokens"],
                "prefill": [t["id"] for t in d["prefill"]]}
    if kind == "chat":
        [choice] = out["choices"]
        return {"text": choice["message"]["content"], "finish": choice["finish_reason"]}
    prefill = out["details"]["prefill"]
    return {"prefill": prefill}


def _check(got, want, what):
    if got is None:
        return
    assert got.keys() == want.keys(), (what, got.keys())
    for k, v in want.items():
        if k == "tokens":
            assert_same_tokens(got[k], v, what)
        elif k == "prefill" and v and isinstance(v[0], dict):
            assert [t["id"] for t in got[k]] == [t["id"] for t in v], what
            for g, w in zip(got[k][1:], v[1:]):
                assert abs(g["logprob"] - w["logprob"]) <= PREFILL_TOL, (what, g, w)
        else:
            assert got[k] == v, (what, k, got[k], v)


class Soak:
    def __init__(self, lz, duration_s, warmup_s, interval_s=INTERVAL_S, workers=WORKERS):
        self.lz, self.duration_s, self.warmup_s = lz, duration_s, warmup_s
        self.interval_s, self.workers = interval_s, workers
        self.lock = threading.Lock()
        self.done = {k: 0 for k, _ in MIX}
        self.failures = []
        self.stop = threading.Event()
        self.samples = []

    def references(self):
        with requests.Session() as s:
            return {(k, p): _ask(s, self.lz, k, p) for k, _ in MIX for p in PROMPTS}

    def worker(self, w, refs):
        kinds = [k for k, weight in MIX for _ in range(weight)]
        plan = itertools.cycle([(kinds[(w + i) % len(kinds)], PROMPTS[(w + i) % len(PROMPTS)])
                                for i in range(len(kinds) * len(PROMPTS))])
        with requests.Session() as session:
            for kind, prompt in plan:
                if self.stop.is_set():
                    return
                try:
                    _check(_ask(session, self.lz, kind, prompt), refs[(kind, prompt)],
                           f"{kind} {prompt!r}")
                    with self.lock:
                        self.done[kind] += 1
                except Exception as e:  # noqa: BLE001 (every failure is recorded and fails the soak)
                    with self.lock:
                        self.failures.append(f"{kind} {prompt!r}: {type(e).__name__}: {e}"[:800])

    def pids(self):
        return {"launcher": self.lz.proc.pid, "router": _pid("router", self.lz),
                "shard": self.lz.shard_pid()}

    def sample(self, t0, pids):
        row = {"t_s": round(time.monotonic() - t0, 1)}
        for name in PROCESSES:
            row[f"{name}_rss_mb"] = round(_rss_kb(pids[name]) / 1024, 1)
            row[f"{name}_fds"] = len(os.listdir(f"/proc/{pids[name]}/fd"))
        with self.lock:
            row["completed"] = sum(self.done.values())
            row["failed"] = len(self.failures)
        prev = self.samples[-1] if self.samples else None
        dt = row["t_s"] - prev["t_s"] if prev else 0
        row["req_per_s"] = round((row["completed"] - prev["completed"]) / dt, 2) if dt else 0.0
        self.samples.append(row)
        return row

    def run(self, verbose=True):
        refs = self.references()
        pids = self.pids()
        harness.wait_idle(self.lz)
        fds_before = {n: len(os.listdir(f"/proc/{pids[n]}/fd")) for n in PROCESSES}
        t0 = time.monotonic()
        self.sample(t0, pids)
        threads = [threading.Thread(target=self.worker, args=(w, refs), daemon=True)
                   for w in range(self.workers)]
        for t in threads:
            t.start()
        while time.monotonic() - t0 < self.duration_s:
            time.sleep(self.interval_s)
            row = self.sample(t0, pids)
            if verbose:
                print(json.dumps(row), flush=True)
        self.stop.set()
        for t in threads:
            t.join(180)
        assert not any(t.is_alive() for t in threads), "a soak client hung"
        elapsed = time.monotonic() - t0
        harness.wait_idle(self.lz)
        time.sleep(1)  # let closed connections leave the router's table
        fds_after = {n: len(os.listdir(f"/proc/{pids[n]}/fd")) for n in PROCESSES}
        assert self.pids() == pids, f"a process was restarted during the soak: {pids} -> {self.pids()}"
        return self.summary(elapsed, fds_before, fds_after)

    def summary(self, elapsed, fds_before, fds_after):
        after = [s for s in self.samples if s["t_s"] >= self.warmup_s]
        assert after, f"the soak ({self.duration_s} s) is no longer than its warm-up"
        base = after[0]
        growth = {n: round(max(s[f"{n}_rss_mb"] for s in after) / base[f"{n}_rss_mb"] - 1, 4)
                  for n in PROCESSES}
        completed = sum(self.done.values())
        return {
            "duration_s": round(elapsed, 1), "warmup_s": self.warmup_s, "workers": self.workers,
            "completed": completed, "completed_by_kind": dict(self.done),
            "failed": len(self.failures), "failures": self.failures[:10],
            "req_per_s": round(completed / elapsed, 2),
            "rss_mb_at_warmup_end": {n: base[f"{n}_rss_mb"] for n in PROCESSES},
            "rss_mb_peak_after_warmup": {n: max(s[f"{n}_rss_mb"] for s in after) for n in PROCESSES},
            "rss_growth_after_warmup": growth,
            "fds_idle_before": fds_before, "fds_idle_after": fds_after,
            "fds_peak": {n: max(s[f"{n}_fds"] for s in self.samples) for n in PROCESSES},
        }


def check(summary):
    """The soak's pass criteria, as assertions."""
    assert summary["failed"] == 0, summary["failures"]
    assert all(summary["completed_by_kind"].values()), summary["completed_by_kind"]
    for n, g in summary["rss_growth_after_warmup"].items():
        assert g <= RSS_GROWTH_MAX, f"{n} RSS grew {g:.1%} after the warm-up: {summary}"
    for n in PROCESSES:
        assert summary["fds_idle_after"][n] <= summary["fds_idle_before"][n], (n, summary)


def _pid(what, lz):
    pids = [p for p in subprocess.run(
        ["pgrep", "-f", f"sonde-{what} .*{lz.uds_prefix}"], capture_output=True, text=True,
        check=False).stdout.split()]
    assert len(pids) == 1, f"want one {what}, found {pids}"
    return int(pids[0])


def _rss_kb(pid):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


def write_csv(samples, path):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(samples[0]))
        w.writeheader()
        w.writerows(samples)


def plot(samples, summary, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s["t_s"] / 60 for s in samples]
    fig, (mem, fds, rate) = plt.subplots(3, 1, figsize=(7, 6.5), sharex=True, dpi=80)
    base = summary["rss_mb_at_warmup_end"]
    for n in PROCESSES:
        # Relative to the end of the warm-up, so 7 MB and 245 MB processes share an axis.
        mem.plot(t, [100 * (s[f"{n}_rss_mb"] / base[n] - 1) for s in samples],
                 label=f"{n} ({base[n]:.0f} MB)")
        fds.plot(t, [s[f"{n}_fds"] for s in samples], label=n)
    mem.axhline(100 * RSS_GROWTH_MAX, color="red", linestyle="--", label="limit")
    mem.axvline(summary["warmup_s"] / 60, color="grey", linestyle=":", label="end of warm-up")
    mem.set_ylabel("RSS vs warm-up end (%)")
    mem.legend(fontsize=7, ncol=3)
    mem.set_title(f"Sonde soak: {summary['completed']} requests, {summary['failed']} failed, "
                  f"{summary['workers']} clients", fontsize=10)
    fds.legend(fontsize=7, ncol=3)
    fds.set_ylabel("open fds")
    rate.plot(t, [s["req_per_s"] for s in samples], color="black")
    rate.set_ylabel("requests/s")
    rate.set_xlabel("minutes")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--duration", type=float, default=600, help="seconds of traffic")
    ap.add_argument("--warmup", type=float, default=60, help="seconds before RSS is baselined")
    ap.add_argument("--workers", type=int, default=WORKERS)
    ap.add_argument("--out", type=Path, default=Path("target/soak"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    lz = harness.start("--enable-prefill-logprobs", name="soak")
    try:
        soak = Soak(lz, args.duration, args.warmup, workers=args.workers)
        summary = soak.run()
    finally:
        lz.stop()
    write_csv(soak.samples, args.out / "soak.csv")
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    plot(soak.samples, summary, args.out / "soak.png")
    print(json.dumps(summary, indent=2))
    print(f"soak: wrote {args.out}/soak.csv, soak.png and summary.json")
    try:
        check(summary)
    except AssertionError as e:
        print(f"soak: FAILED: {e}", file=sys.stderr)
        return 1
    print("soak: passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
