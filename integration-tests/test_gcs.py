"""A model on gs://, as Vertex AI hands it over (AIP_STORAGE_URI), downloaded by the
launcher through the real GCS client from a local stand-in of GCS, then served — through
entrypoint.sh with Vertex's variables. An interrupted download leaves no model behind."""

import signal
import time
from pathlib import Path

import pytest
import requests

import fake_gcs
from conftest import BIN_DIR, MODEL, REPO
from launched import Launched, launcher_cmd

BUCKET = "models"
KEY = f"smollm2/{MODEL.name}"


@pytest.fixture
def gcs(tmp_path):
    with fake_gcs.serving(tmp_path, MODEL, f"{BUCKET}/{KEY}") as served:
        yield served


def models_in(folder):
    """Anything a shard could mistake for a model: a finished .gguf file."""
    return [p for p in Path(folder).rglob("*.gguf") if not p.name.endswith(".partial")]


def test_interrupted_download_leaves_no_model_then_vertex_serves_it(gcs):
    env = {"GOOGLE_SERVICE_ACCOUNT": str(gcs.credentials)}
    # The stand-in drops every download of the model after 10 MB: the launcher retries;
    # kill it meanwhile, as a preempted VM would.
    gcs.control(f"fail?object={BUCKET}/{KEY}&after=10000000")
    first = Launched([], env={**env, "AIP_STORAGE_URI": f"gs://{BUCKET}/{KEY}"}, name="gcs-cut")
    first.cmd = [str(c) for c in launcher_cmd(first.port, first.uds_prefix)]
    try:
        first.start(wait=False)
        deadline = time.monotonic() + 60
        while gcs.gets() < 2:
            assert first.proc.poll() is None, first.logs()
            assert time.monotonic() < deadline, f"the download never started:\n{first.logs()}"
            time.sleep(0.1)
        # Minutes of download for a real model: the port answers 503 all along, so a
        # platform's probe sees a container loading, not a refused connection.
        r = requests.get(first.url + "/health", timeout=10)
        assert r.status_code == 503 and r.json()["error_type"] == "healthcheck", r.text
        first.signal(signal.SIGKILL)
        first.wait_exit(10)
        cache = first.env["SONDE_CACHE_DIR"]
        assert models_in(cache) == [], f"a cut download left a model: {models_in(cache)}"
    finally:
        first.stop()

    # Vertex's way: the entrypoint, AIP_* variables, the model folder's URI, same cache.
    gcs.control("fail")
    gcs.control("reset")
    port = first.port
    vertex_env = {
        **env,
        "SONDE_BIN_DIR": str(BIN_DIR),
        "SONDE_CACHE_DIR": cache,
        "AIP_HTTP_PORT": str(port),
        "AIP_HEALTH_ROUTE": "/ping",
        "AIP_PREDICT_ROUTE": "/v1/endpoints/123/deployedModels/456:predict",
        "AIP_STORAGE_URI": f"gs://{BUCKET}/smollm2",
    }
    served = Launched([REPO / "entrypoint.sh", "--hostname", "127.0.0.1",
                       "--shard-uds-path", first.uds_prefix], env=vertex_env, port=port,
                      name="gcs-vertex", health_route="/ping")
    try:
        served.start()
        assert gcs.gets() >= 1, "the model was not downloaded from the stand-in"
        logs = served.logs(300)
        assert "gs://" in logs and "MB" in logs, f"no download progress in the logs:\n{logs}"
        body = {"instances": [{"inputs": "Once upon a time",
                               "parameters": {"max_new_tokens": 4, "details": True, "top_n_tokens": 2}}]}
        r = requests.post(served.url + vertex_env["AIP_PREDICT_ROUTE"], json=body, timeout=120)
        assert r.status_code == 200, r.text
        pred = r.json()["predictions"][0]
        assert pred["details"]["generated_tokens"] == 4
        assert all(len(t) == 2 for t in pred["details"]["top_tokens"])
        downloaded = models_in(cache)
        assert len(downloaded) == 1 and downloaded[0].read_bytes() == MODEL.read_bytes()
        info = requests.get(served.url + "/info", timeout=10).json()
        assert info["model_id"] == vertex_env["AIP_STORAGE_URI"]
    finally:
        served.stop()
