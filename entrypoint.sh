#!/usr/bin/env bash
# The container's entrypoint (Vertex AI custom container, or plain `docker run`).
#
# Vertex AI sets AIP_HTTP_PORT, AIP_HEALTH_ROUTE and AIP_PREDICT_ROUTE, which the router
# reads, and AIP_STORAGE_URI (the model's gs:// folder), which the launcher downloads when
# no MODEL_ID is given. Every launcher flag also reads its TGI-named variable (MODEL_ID,
# MAX_INPUT_TOKENS, ...). The names Hugging Face's serving containers use are mapped here,
# so a deployment written for them carries over.
set -euo pipefail

if [[ -z ${MODEL_ID:-} && -n ${HF_MODEL_ID:-} ]]; then
    export MODEL_ID=$HF_MODEL_ID
fi
if [[ -z ${REVISION:-} && -n ${HF_MODEL_REVISION:-} ]]; then
    export REVISION=$HF_MODEL_REVISION
fi
if [[ -z ${HF_TOKEN:-} ]]; then
    token=${HUGGING_FACE_HUB_TOKEN:-${HF_API_TOKEN:-}}
    if [[ -n $token ]]; then
        export HF_TOKEN=$token
    fi
fi
# The shell's HOSTNAME is the machine's name, never an address to listen on; the launcher
# does not read it, and neither should anything it starts.
unset HOSTNAME

exec "${SONDE_BIN_DIR:-/usr/local/bin}/sonde-launcher" "$@"
