"""The launcher as users start it: the README's command, SIGTERM with streams in flight, a
shard killed under load, and startups that must fail with one clear sentence."""

import os
import signal
import socket
import subprocess
import time

import pytest
import requests

from conftest import MODEL
from launched import Launched, generating, launcher_cmd, serve_cmd
from sonde_http import TIMEOUT_S, assert_loading_then_ready, post, sse_events, watch_health


def launch(tmp_args=(), env=None, name="launcher", cmd=launcher_cmd):
    lz = Launched([], env=env, name=name)
    lz.cmd = [str(c) for c in cmd(lz.port, lz.uds_prefix, *tmp_args)]
    return lz


def test_readme_command_serves_the_default_model_with_scores():
    lz = launch(["--enable-prefill-logprobs"], name="readme", cmd=serve_cmd)
    try:
        lz.start()
        body = {"inputs": "Once upon a time", "parameters": {
            "max_new_tokens": 4, "details": True, "top_n_tokens": 2, "decoder_input_details": True}}
        out = post(lz, "/generate", body).json()
        d = out["details"]
        assert d["generated_tokens"] == 4 and len(d["tokens"]) == 4
        assert all(t["logprob"] <= 0 for t in d["tokens"])
        assert all(len(top) == 2 for top in d["top_tokens"])
        assert d["prefill"][0]["logprob"] is None and len(d["prefill"]) == d["input_length"]
        info = requests.get(lz.url + "/info", timeout=10).json()
        assert info["model_id"] == MODEL.stem
        assert info["prefix_caching"] is True
        lz.signal(signal.SIGTERM)
        assert lz.wait_exit(60) == 0, lz.logs()
    finally:
        lz.stop()


def test_port_answers_503_from_the_start_and_never_refuses_until_ready():
    """The launcher answers 503 on the port while the shard loads, then hands the socket to
    the router (which answers 503 until warm): once the port answered, a probe never finds
    it closed — not even while the router starts."""
    lz = launch(name="loading")
    try:
        lz.start(wait=False)
        seen = watch_health(lz.url + "/health", lambda: lz.proc.poll() is None, lz.logs, 120)
        assert_loading_then_ready(seen, lz.logs)
        out = post(lz, "/generate", {"inputs": "Once upon a time", "parameters": {"max_new_tokens": 2}})
        assert out.status_code == 200, out.text
    finally:
        lz.stop()


def test_prefix_caching_env_reaches_the_shard():
    """TGI's PREFIX_CACHING turns the cache off; the shard's own answer says so in /info."""
    lz = launch(env={"PREFIX_CACHING": "0"}, name="no-prefix-cache")
    try:
        lz.start()
        info = requests.get(lz.url + "/info", timeout=10).json()
        assert info["prefix_caching"] is False
        text = "The same prompt, twice over, with enough words to fill a block or two"
        for _ in range(2):
            post(lz, "/generate", {"inputs": text, "parameters": {"max_new_tokens": 1}})
        metrics = requests.get(lz.url + "/metrics", timeout=10).text
        assert "sonde_prefix_cache_hit_tokens_total 0" in metrics
    finally:
        lz.stop()


def _stream(lz, i, out):
    body = {"inputs": f"Story {i}: once upon a time", "parameters": {"max_new_tokens": 48, "details": True}}
    with requests.post(lz.url + "/generate_stream", json=body, stream=True, timeout=TIMEOUT_S) as r:
        out[i] = list(sse_events(r))


def test_sigterm_with_8_streams_in_flight_lets_them_finish_and_exits_0():
    grace = 60
    lz = launch(["--graceful-termination-timeout", grace], name="sigterm")
    try:
        lz.start()
        results = [None] * 8
        threads = generating(lz, 8, lambda i: _stream(lz, i, results))
        signalled = time.monotonic()
        lz.signal(signal.SIGTERM)
        for t in threads:
            t.join(grace)
        for i, events in enumerate(results):
            assert events and "error" not in events[-1], (i, events and events[-1])
            assert events[-1]["details"]["finish_reason"] in ("length", "eos_token")
        assert lz.wait_exit(grace) == 0, lz.logs()
        assert time.monotonic() - signalled < grace
    finally:
        lz.stop()


def test_killed_shard_fails_requests_with_424_and_is_restarted():
    lz = launch(name="shardkill")
    try:
        lz.start()
        results = {}

        def run(i):
            r = post(lz, "/generate", {"inputs": f"Tale {i}", "parameters": {"max_new_tokens": 300}})
            results[i] = (r.status_code, r.json(), time.monotonic())

        threads = generating(lz, 4, run)
        old = lz.shard_pid()
        os.kill(old, signal.SIGKILL)
        killed = time.monotonic()
        for t in threads:
            t.join(10)
        for i, (status, body, at) in results.items():
            assert status == 424 and body["error_type"] == "generation", (i, status, body)
            assert at - killed < 5, f"request {i} took {at - killed:.1f} s to fail"
        r = requests.get(lz.url + "/health", timeout=10)
        assert r.status_code == 503, r.text
        lz.wait_healthy(timeout=60)
        assert lz.shard_pid() != old
        out = post(lz, "/generate", {"inputs": "Once upon a time", "parameters": {"max_new_tokens": 3}})
        assert out.status_code == 200, out.text
        assert "restarting the shard" in lz.logs(200)
    finally:
        lz.stop()


def _run_to_exit(args, env=None, timeout=120):
    lz = launch(args, env=env, name="badstart")
    try:
        lz.start(wait=False)
        code = lz.wait_exit(timeout)
        return code, lz.logs(100)
    finally:
        lz.stop()


@pytest.fixture
def junk_model(tmp_path):
    path = tmp_path / "broken.gguf"
    path.write_bytes(b"GGUF" + os.urandom(4096))
    return path


def test_bad_flags_exit_non_zero_with_a_clear_sentence():
    code, logs = _run_to_exit(["--num-shard", "2"])
    assert code != 0 and "--num-shard 2 is not supported" in logs, logs
    code, logs = _run_to_exit(["--max-best-of", "many"])
    assert code != 0 and "--max-best-of" in logs and "invalid value" in logs, logs


def test_missing_model_path_exits_non_zero(tmp_path):
    missing = tmp_path / "nowhere" / "model.gguf"
    code, logs = _run_to_exit(["--model-id", missing])
    assert code != 0 and str(missing) in logs and "does not exist" in logs, logs


def test_unloadable_model_exits_non_zero_naming_the_shard(junk_model):
    code, logs = _run_to_exit(["--model-id", junk_model])
    assert code != 0, logs
    assert "shard 0 exited" in logs and "while loading the model" in logs, logs


def test_refused_model_exits_in_seconds_with_one_line_naming_file_and_reason(tmp_path):
    # The default model relabelled as an architecture Sonde does not implement: the key's
    # value is patched in place, so the rest of the file stays a valid GGUF.
    data = MODEL.read_bytes()
    key = b"general.architecture"
    at = data.index(key) + len(key)
    # value type (u32 8 = string), length (u64 5), then the bytes "llama"
    assert data[at:at + 17] == (8).to_bytes(4, "little") + (5).to_bytes(8, "little") + b"llama"
    bad = tmp_path / "mamba.gguf"
    bad.write_bytes(data[:at + 12] + b"mamba" + data[at + 17:])
    started = time.monotonic()
    code, logs = _run_to_exit(["--model-id", bad])
    elapsed = time.monotonic() - started
    assert code != 0, logs
    assert elapsed < 30, f"{elapsed:.1f} s:\n{logs}"
    reason = [line for line in logs.splitlines() if 'architecture "mamba" is not supported' in line]
    assert reason and str(bad) in reason[0], logs
    assert "restarting the shard" not in logs, logs


def test_port_in_use_exits_non_zero():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        lz = Launched([], name="portinuse", port=port)
        lz.cmd = [str(c) for c in launcher_cmd(port, lz.uds_prefix)]
        try:
            lz.start(wait=False)
            code = lz.wait_exit(60)
            logs = lz.logs()
        finally:
            lz.stop()
    assert code != 0 and f"port {port}" in logs and "already in use" in logs, logs


def test_unreachable_hub_exits_non_zero_with_a_clear_sentence():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    code, logs = _run_to_exit(["--model-id", "HuggingFaceTB/SmolLM2-135M-Instruct"],
                              env={"HF_ENDPOINT": f"http://127.0.0.1:{closed}"})
    assert code != 0, logs
    assert "could not reach the Hugging Face Hub" in logs and "HuggingFaceTB/SmolLM2-135M-Instruct" in logs, logs


def test_dead_router_stops_everything_and_exits_non_zero():
    lz = launch(name="routerkill")
    try:
        lz.start()
        out = subprocess.run(["pgrep", "-f", f"sonde-router .*{lz.uds_prefix}"], capture_output=True, text=True)
        pids = [int(p) for p in out.stdout.split()]
        assert len(pids) == 1, pids
        os.kill(pids[0], signal.SIGKILL)
        code = lz.wait_exit(30)
        assert code != 0, lz.logs()
        assert "the router exited" in lz.logs(), lz.logs()
        # The shard went with it: nothing is left listening for a router that is gone.
        left = subprocess.run(["pgrep", "-f", f"sonde-shard .*{lz.uds_prefix}"], capture_output=True, text=True)
        assert left.stdout.strip() == "", f"shard still running: {left.stdout}"
    finally:
        lz.stop()
