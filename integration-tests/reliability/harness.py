"""What the reliability tests share: the real launcher started with given flags, its
gauges, counters and shard, greedy reference generations, and the figures each test
reports (printed, and merged into the JSON file $SONDE_RELIABILITY_OUT names).

Not a conftest.py: a second conftest module would shadow the parent's `conftest`, which
the parent's test modules import by that name.
"""

import json
import math
import os
import socket
import sys
import time
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from launched import Launched, launcher_cmd  # noqa: E402
from sonde_http import assert_same_tokens, ok_json  # noqa: E402

GAUGES = ("sonde_queue_size", "sonde_batch_current_size")


def start(*flags, name="reliability"):
    """The real launcher (shard + router on the real model), healthy."""
    lz = Launched([], name=name)
    lz.cmd = [str(c) for c in launcher_cmd(lz.port, lz.uds_prefix, *flags)]
    try:
        lz.start()
    except BaseException:
        lz.stop()
        raise
    return lz


def post(lz, path, body, timeout=120, **kw):
    return requests.post(lz.url + path, json=body, timeout=timeout, **kw)


def request_count(lz, route, status):
    key = f'sonde_request_count{{method="POST",route="{route}",status="{status}"}}'
    return lz.metrics().get(key, 0.0)


def wait_idle(lz, within_s=15):
    """Seconds until the queue and batch gauges are both 0; fails past `within_s`."""
    started = time.monotonic()
    while True:
        m = lz.metrics()
        values = {g: lz.gauge(g, m) for g in GAUGES}
        if not any(values.values()):
            return time.monotonic() - started
        assert time.monotonic() - started < within_s, f"not idle after {within_s} s: {values}"
        time.sleep(0.1)


def silent_stream(lz, i, new_tokens):
    """A /generate_stream whose client never reads: a receive buffer of a few KB, and the
    largest events a request can ask for (top-5 and 128 label logprobs per token, ~6 KB).
    The caller closes the socket."""
    params = {"max_new_tokens": new_tokens, "details": True, "top_n_tokens": 5,
              "logprob_token_ids": list(range(128))}
    body = json.dumps({"inputs": f"Chapter {i}. Once upon a time", "parameters": params}).encode()
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
    s.settimeout(30)
    s.connect(("127.0.0.1", lz.port))
    s.sendall(b"POST /generate_stream HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    return s


def gen_body(prompt, new_tokens, **params):
    # Greedy, so a request's tokens are the same alone or in any batch (README).
    return {"inputs": prompt, "parameters": {"max_new_tokens": new_tokens, "details": True,
                                             **params}}


def references(lz, prompts, new_tokens):
    """Each prompt's generation run alone; the model must not stop early on any of them,
    so "the right number of tokens" means exactly `new_tokens`."""
    want = {}
    for p in prompts:
        out = ok_json(post(lz, "/generate", gen_body(p, new_tokens)))
        d = out["details"]
        assert d["generated_tokens"] == new_tokens and d["finish_reason"] == "length", (p, d)
        want[p] = out
    return want


def assert_generation(out, want, new_tokens, what):
    """A 200 that is the right generation: its token count, finite logprobs, and the same
    tokens and logprobs as the request alone."""
    d = out["details"]
    assert d["generated_tokens"] == new_tokens == len(d["tokens"]), (what, d)
    for t in d["tokens"]:
        assert math.isfinite(t["logprob"]) and t["logprob"] <= 0, (what, t)
    assert_same_tokens(d["tokens"], want["details"]["tokens"], what)
    assert out["generated_text"] == want["generated_text"], what


def percentile(values, p):
    """Nearest-rank percentile (no interpolation: the figure is a latency someone saw)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]


def report(section, figures):
    """Prints the figures (pytest -s shows them) and merges them into
    $SONDE_RELIABILITY_OUT, one key per test, so one file gathers the whole run."""
    print(f"\n[reliability] {section}: {json.dumps(figures, sort_keys=True)}")
    out = os.environ.get("SONDE_RELIABILITY_OUT")
    if not out:
        return
    path = Path(out)
    data = json.loads(path.read_text()) if path.is_file() else {}
    data[section] = figures
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
