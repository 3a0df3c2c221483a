# Sourced by scripts/check-cuda and scripts/gpu-check (not run on its own).
#
# Installs NVIDIA's CUDA 13.0 toolkit from its PyPI wheels into a cache and exports what a
# `--features cuda` build of the shard reads, so that build needs no system CUDA:
#
#   NVCC, CUDA_ROOT/CUDA_HOME   cudaforge (candle-kernels' build script) runs nvcc to compile
#                               candle's .cu kernels; cudarc adds <root>/lib{,/stubs} to the
#                               link search path
#   CUDARC_CUDA_VERSION         cudarc picks its bindings from it (otherwise it runs `nvcc` from
#                               PATH, and PATH is left alone so CPU builds keep their fingerprints)
#   CUDA_COMPUTE_CAP            the GPU generation the kernels are compiled for (cudaforge asks
#                               nvidia-smi when it is unset, which fails on a machine without a GPU)
#
# Why 13.0 and these wheels: the cu12 nvcc wheel ships only ptxas, so 13.x is the only nvcc on
# PyPI; cudarc 0.19 knows CUDA up to 13.4 (13.5 panics its build script); and a 13.0 build's
# PTX and libcudart run on every driver of the 13 series (580 and newer), later minors need
# newer drivers. The runtime libraries (cudart, cuBLAS, cuRAND, NVRTC) come along because
# cudarc links them by name and a GPU machine running the build needs them at run time.
#
# No wheel ships the driver (libcuda.so.1), which cudarc links too: a stub with the driver's
# soname and every entry point the bindings may call is compiled into <root>/lib/stubs, as
# the CUDA toolkit's own stubs/ folder provides. At run time the real driver is loaded.
#
# Inputs:  $root (the repository), $data (the data folder); SONDE_CUDA_TOOLKIT overrides the
#          cache folder (default $data/cuda-toolkit); CUDA_COMPUTE_CAP, if set, is kept.
# Outputs: the exports above and CUDA_TOOLKIT_LIB (the runtime libraries' folder).

CUDA_TOOLKIT_WHEELS=(
    nvidia-cuda-nvcc==13.0.88     # nvcc, ptxas, fatbinary, nvlink, cudafe++
    nvidia-nvvm==13.0.88          # cicc (nvcc's device front end) and libdevice
    nvidia-cuda-crt==13.0.88      # crt/ headers nvcc includes
    nvidia-cuda-cccl==13.0.85     # libcu++/CUB/Thrust headers (cuda_fp16.h etc. use them)
    nvidia-cuda-runtime==13.0.96  # cuda_runtime.h, libcudart.so.13 (linked by candle-kernels)
    nvidia-cuda-nvrtc==13.0.88    # libnvrtc.so.13 (linked by cudarc)
    nvidia-cublas==13.1.0.3       # libcublas.so.13, libcublasLt.so.13: candle's f32 matmuls
    nvidia-curand==10.4.0.35      # libcurand.so.10 (linked by cudarc)
)

cuda_toolkit_fail() {
    echo "cuda-toolkit: $*" >&2
    exit 1
}

# Installs the wheels once; a changed list (this file's pins) reinstalls them.
cuda_toolkit_install() {
    local dir=$1 stamp want python=${PYTHON:-python3}
    stamp=$dir/.wheels.sha256
    want=$(printf '%s\n' "${CUDA_TOOLKIT_WHEELS[@]}" | sha256sum | cut -d' ' -f1)
    if [[ -f $stamp && $(cat "$stamp") == "$want" ]]; then
        return
    fi
    command -v "$python" >/dev/null || cuda_toolkit_fail "needs $python with pip"
    echo "cuda-toolkit: installing the CUDA 13.0 toolkit wheels into $dir (about 1.2 GB)" >&2
    rm -rf "$dir" "$dir.part"
    mkdir -p "$(dirname "$dir")"
    # --no-deps: the pins above are the whole toolkit; --target: no venv is needed, nothing
    # here is imported by Python.
    "$python" -m pip install --quiet --disable-pip-version-check --root-user-action=ignore --no-deps \
        --target "$dir.part" "${CUDA_TOOLKIT_WHEELS[@]}" \
        || cuda_toolkit_fail "pip could not install ${CUDA_TOOLKIT_WHEELS[*]}"
    mv "$dir.part" "$dir"
    echo "$want" > "$stamp"
}

# The linker is given unversioned names (-lcudart, -lcublas …); the wheels ship only the
# versioned files a program loads at run time.
cuda_toolkit_dev_links() {
    local lib=$1 f
    for f in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libcurand.so.10 libnvrtc.so.13; do
        [[ -f $lib/$f ]] || cuda_toolkit_fail "$lib/$f is missing from the wheels"
        ln -sfn "$f" "$lib/${f%.so.*}.so"
    done
}

# libcuda.so with soname libcuda.so.1 whose functions do nothing: enough to link, never run
# (a program linked against it loads the driver's libcuda.so.1). Its entry points are every
# cu* function of this toolkit's cuda.h and of cudarc's driver bindings (which also name
# entry points of other CUDA versions, behind cfgs).
cuda_toolkit_driver_stub() {
    local cuda_root=$1 stubs=$1/lib/stubs cudarc_src want have
    cudarc_src=$(cargo metadata --format-version 1 --locked --features sonde-shard/cuda \
        --manifest-path "$root/Cargo.toml" 2>/dev/null | "${PYTHON:-python3}" -c '
import json, sys, pathlib
for p in json.load(sys.stdin)["packages"]:
    if p["name"] == "cudarc":
        print(pathlib.Path(p["manifest_path"]).parent / "src" / "driver" / "sys" / "mod.rs")
') || cuda_toolkit_fail "cargo metadata could not find cudarc (is the lock file current?)"
    [[ -f $cudarc_src ]] || cuda_toolkit_fail "cudarc's driver bindings are not at $cudarc_src"
    want=$(cat "$cudarc_src" "$cuda_root/include/cuda.h" | sha256sum | cut -d' ' -f1)
    have=$(cat "$stubs/.sources.sha256" 2>/dev/null || true)
    if [[ -f $stubs/libcuda.so && $have == "$want" ]]; then
        return
    fi
    command -v cc >/dev/null || cuda_toolkit_fail "needs a C compiler (cc) for the driver stub"
    mkdir -p "$stubs"
    {
        cc -E -P -I"$cuda_root/include" "$cuda_root/include/cuda.h" \
            | grep -oP '\bcu[A-Z]\w*(?=\s*\()'
        grep -oP '^\s*fn \Kcu\w+(?=\()' "$cudarc_src"
    } | sort -u | sed 's/.*/void &(void) {}/' > "$stubs/libcuda-stub.c"
    cc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$stubs/libcuda.so" "$stubs/libcuda-stub.c" \
        || cuda_toolkit_fail "could not compile the driver stub"
    echo "$want" > "$stubs/.sources.sha256"
}

cuda_toolkit_setup() {
    local dir=${SONDE_CUDA_TOOLKIT:-$data/cuda-toolkit}
    cuda_toolkit_install "$dir"
    local cuda_root=$dir/nvidia/cu13
    [[ -x $cuda_root/bin/nvcc && -x $cuda_root/nvvm/bin/cicc ]] \
        || cuda_toolkit_fail "$cuda_root has no bin/nvcc or nvvm/bin/cicc: delete $dir and rerun"
    cuda_toolkit_dev_links "$cuda_root/lib"
    cuda_toolkit_driver_stub "$cuda_root"
    "$cuda_root/bin/nvcc" --version | grep -q 'release 13\.0,' \
        || cuda_toolkit_fail "$cuda_root/bin/nvcc is not CUDA 13.0: delete $dir and rerun"
    export NVCC=$cuda_root/bin/nvcc
    export CUDA_ROOT=$cuda_root CUDA_HOME=$cuda_root
    export CUDARC_CUDA_VERSION=13000
    # Without a GPU to ask, compile for Ampere (sm_80): any supported value proves the build.
    export CUDA_COMPUTE_CAP=${CUDA_COMPUTE_CAP:-80}
    export CUDA_TOOLKIT_LIB=$cuda_root/lib
}
