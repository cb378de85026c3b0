#!/usr/bin/env bash
# The device check: one script for the GPU machine (one NVIDIA GPU; CUDA toolkit, CMake,
# ninja, Python with PyTorch and transformers; no Debian -dev packages, no MPI, no network).
# Meant to finish in < 10 minutes on a bare H200, build included (about 5 in practice), and to
# print everything in one go:
#   machine    GPU, driver, CUDA, toolkit, torch
#   configure  tessera with CUDA into build-device/ (missing libraries from carried .debs)
#   build      only the targets below, -j$(nproc)
#   backend_ops  every backend op, CUDA against the CPU, then GEMM/attention timings (the
#              reference attention kernels: TSR_CUDA_ATTN=reference, FP32 tolerances)
#   flash_attn the tensor-core attention (flash prefill, split-K paged decode) against the
#              reference kernels and the CPU on random shapes, then a LONG_N-token prefill
#              of one 8B-shape layer against the BF16 tensor-core peak (tests/unit/
#              test_flash_attn.c; ~30 s)
#   cuda_mem   the backend memory contract on the GPU
#   dist_plane the CUDA backend as a device data plane
#   logits     CUDA against the CPU backend and against PyTorch (tools/torch_reference.py,
#              computed here and now) and the bundled golden files, on models/stories260K.bin
#              and tests/data/synth_bf16_gqa; CUDA against the CPU on two GGUF K-quant test
#              llamas (requantized to Q8_0 on both: TSR_GGUF_Q8=1) and on the Llama-3.1-8B
#              shape (2 layers); max abs / rel diff, top-1 and greedy agreement
#              (bench/logits_check.c states the tolerance)
#   gptoss     GPT-OSS's ops on the GPU against the CPU (YaRN rope, attention with sinks and
#              sliding windows on every attn.cu path and attention_paged, the mixture-of-
#              experts op with MXFP4/BF16/F32 experts: tests/unit/test_backend_ops_gptoss.c),
#              the tiny GPT-OSS models on cuda against transformers' goldens (test_gptoss),
#              and a synthetic:gpt-oss-20b decode at batch 1 (tessera bench; GPTOSS_LAYERS)
#   roofline   this GPU's ceilings: HBM GB/s (copies) and cuBLAS BF16 GEMM TFLOP/s at the
#              prefill GEMM shapes of the 8B model (bench/gpu_roofline.cu)
#   throughput prefill tokens/s and decode tokens/s at batch 1 and 64 on the 8B shape
#              (bench/devbench.c), each set against its ceiling from `roofline`
#   quant      FP8 and Q8_0 weights (tests/unit/test_cuda_quant.c): every quantized kernel
#              against host references on odd shapes at batch 1..8 and 37, the batch-1 GEMVs
#              on 14336x4096 against BF16; then decode at batch 1 on the 8B shape
#              (QUANT_SPEC) in fp8 and in bf16, against each other and the HBM ceiling
#   longctx    every policy the registry knows on a 128K-token prefill of the 8B shape
#              (LONG_LAYERS layers), with peak device memory (bench/longctx.sh)
#   ctest      the unit tests, if time is left
# then a summary: every section's status and time, and a block for docs/gpu-results.md.
#
#   here:    tools/fetch-device-debs.sh           # OpenBLAS, cJSON, PCRE2, hwloc, pkgconf
#   there:   bash tests/device/run.sh             # run tool: carry [".debs"], timeout_s 600
#
# Every section runs under its own time limit and the whole under DEVICE_BUDGET_S; a section
# that would start with less than its minimum left is skipped (SKIP in the summary), so a
# hang costs one section, not the session. The expensive sections come last. Another device
# test: add its target to DEVICE_TARGETS and one `section` line (one section per check).
#
# Logs: $OUT/run.log (all of stdout), $OUT/gpu-results.md (the summary block),
# $OUT/device-logs.tar.gz (each section's log, configure/build logs, the PyTorch reference
# JSON), packed again after every section so that a killed run still brings them back; the
# run tool returns at most 8 files from $OUT.
#
# Options (environment):
#   OUT (/tmp/tessera-device), BUILD_DIR (build-device), DEBROOT (/tmp/debroot), CUDA_ARCH
#   (from nvidia-smi, else 90), LONGCTX_LIMIT_S (330), CONFIGURE_ONLY=1 (stop after cmake), FORCE_DEBS=1 (use .debs
#   even if the system has the libraries), DEVICE_BUDGET_S (540), SECTIONS (names to run,
#   default all), SKIP_CTEST=1, LONG_N (131072), LONG_LAYERS (1), BENCH_LAYERS (32),
#   QUANT_SPEC (synthetic:llama-3.1-8b,layers=8), GPTOSS_LAYERS (24),
#   PREFILL (2048), CTX (512), GEN (32), BATCHES (1,64), BUILD_LIMIT_S (150), TORCH_DEVICE (cpu: the PyTorch
#   reference in float32 on the host; cuda also works).
#   DEVICE_BACKEND (cuda): any other backend (cpu, cpu-fenced) is the CPU rehearsal used by
#   tests/device/test_cpu.sh: no configure or build (BUILD_DIR must hold a build), small
#   models and sizes, the CPU's own ceilings (tsr_membw, tsr_sgemm) in `roofline`.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
export ROOT
export B=${BUILD_DIR:-build-device}
export DEBROOT=${DEBROOT:-/tmp/debroot}
export OUT=${OUT:-/tmp/tessera-device}
# The carried libraries' LD_LIBRARY_PATH (deps.env) is for tessera's binaries; Python and
# PyTorch get the machine's own.
export SYS_LD_LIBRARY_PATH=${LD_LIBRARY_PATH-}
export BACKEND=${DEVICE_BACKEND:-cuda}
BUDGET=${DEVICE_BUDGET_S:-540}
RESERVE=8 # seconds kept for the summary
mkdir -p "$OUT"
export LOGS=${LOGS_DIR:-$(mktemp -d /tmp/tessera-device-logs.XXXXXX)}
mkdir -p "$LOGS"
exec > >(tee "$OUT/run.log") 2>&1
TEE_PID=$!
T0=$(date +%s)
JOBS=$(nproc)
export JOBS
export MA=x86_64-linux-gnu
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
    export PATH=/usr/local/cuda/bin:$PATH
fi
if ! command -v timeout >/dev/null; then
    timeout() { shift 3; "$@"; } # "-k N LIMIT cmd...": no limits without coreutils' timeout
fi

if [ "$BACKEND" = cuda ]; then
    export SMALL=${SMALL:-0}
else
    export SMALL=${SMALL:-1}
fi
if [ "$SMALL" = 1 ]; then # CPU rehearsal: the same steps on small shapes
    export LONG_MODEL=${LONG_MODEL:-tiny} LONG_N=${LONG_N:-2048} LONG_LAYERS=${LONG_LAYERS:-1}
    export BENCH_SPEC=${BENCH_SPEC:-synthetic:tiny,dtype=bf16} PREFILL=${PREFILL:-128}
    export CTX=${CTX:-32} GEN=${GEN:-4} BATCHES=${BATCHES:-1,8}
    export SHAPE_SPEC=${SHAPE_SPEC:-synthetic:tiny,dtype=bf16,layers=2}
    export GEMM_DIMS=${GEMM_DIMS:-64,64,32,172}
    export QUANT_SPEC=${QUANT_SPEC:-synthetic:tiny}
    # the tiny MXFP4 GPT-OSS (the 20B shape's 2.3 GB of BF16 embeddings is too much here)
    export GPTOSS_SPEC=${GPTOSS_SPEC:-tests/data/arch/gptoss_mxfp4} GPTOSS_GEN=${GPTOSS_GEN:-4}
else
    export LONG_MODEL=${LONG_MODEL:-llama-3.1-8b} LONG_N=${LONG_N:-131072}
    export LONG_LAYERS=${LONG_LAYERS:-1}
    export BENCH_SPEC=${BENCH_SPEC:-synthetic:llama-3.1-8b,layers=${BENCH_LAYERS:-32}}
    export PREFILL=${PREFILL:-2048} CTX=${CTX:-512} GEN=${GEN:-32} BATCHES=${BATCHES:-1,64}
    export SHAPE_SPEC=${SHAPE_SPEC:-synthetic:llama-3.1-8b,layers=2}
    # dim, q_dim, kv_dim, hidden of Llama-3.1-8B: the GEMMs of one prefill chunk
    export GEMM_DIMS=${GEMM_DIMS:-4096,4096,1024,14336}
    # 8 of the 32 layers: the fp8 run quantizes them on the host at load
    export QUANT_SPEC=${QUANT_SPEC:-synthetic:llama-3.1-8b,layers=8}
    export GPTOSS_SPEC=${GPTOSS_SPEC:-synthetic:gpt-oss-20b,layers=${GPTOSS_LAYERS:-24}}
    export GPTOSS_GEN=${GPTOSS_GEN:-16}
fi
export TORCH_DEVICE=${TORCH_DEVICE:-cpu}
# The targets this check runs (more device tests: add them here and a section below).
DEVICE_TARGETS=(tessera tsr_longctx tsr_devbench tsr_logits_check tsr_gpu_roofline
    tsr_membw tsr_sgemm test_backend_ops test_cuda_mem test_dist_plane test_flash_attn
    test_cuda_quant test_backend_ops_gptoss test_gptoss)

say() { printf '\n==== %s (%ds) ====\n' "$*" "$(($(date +%s) - T0))"; }
pack_logs() { tar -czf "$OUT/device-logs.tar.gz" -C "$LOGS" . 2>/dev/null || true; }

S_NAME=() S_STATUS=() S_SECS=() S_NOTE=()
record() { S_NAME+=("$1") S_STATUS+=("$2") S_SECS+=("$3") S_NOTE+=("$4"); }
FAILED=0

# section NAME LIMIT_S FUNCTION [MIN_S]: FUNCTION in a child bash under min(LIMIT_S, time
# left), output to the terminal and $LOGS/NAME.log. Exit 0 PASS, 77 SKIP, 124/137 TIMEOUT,
# else FAIL; the function's last line starting "NOTE " becomes the summary's note.
section() {
    local name=$1 limit=$2 fn=$3 min=${4:-10}
    if [ -n "${SECTIONS:-}" ] && ! grep -qw -- "$name" <<<"$SECTIONS"; then return 0; fi
    local left=$((BUDGET - ($(date +%s) - T0) - RESERVE))
    say "$name (limit ${limit}s, ${left}s left)"
    if [ "$left" -lt "$min" ]; then
        echo "skipped: ${left}s left, the section needs at least ${min}s"
        record "$name" SKIP 0 "out of time (${left}s left of ${BUDGET}s)"
        return 0
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    local t rc
    t=$(date +%s)
    SECTION_LIMIT=$limit timeout -k 10 "$limit" bash -c "$fn" 2>&1 | tee "$LOGS/$name.log"
    rc=${PIPESTATUS[0]}
    local secs=$(($(date +%s) - t)) st note
    note=$(sed -n 's/^NOTE //p' "$LOGS/$name.log" | tail -n 1)
    case $rc in
    0) st=PASS ;;
    77) st=SKIP ;;
    124 | 137)
        st=TIMEOUT
        note="killed after ${limit}s${note:+; $note}"
        ;;
    *)
        st=FAIL
        note="exit $rc${note:+; $note}"
        ;;
    esac
    [ "$st" = FAIL ] || [ "$st" = TIMEOUT ] && FAILED=1
    record "$name" "$st" "$secs" "$note"
    pack_logs
}

# ---- the sections ------------------------------------------------------------------------

sec_machine() {
    command -v nvidia-smi >/dev/null &&
        nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap,clocks.max.sm \
            --format=csv,noheader | sed 's/^/gpu /'
    command -v nvidia-smi >/dev/null && nvidia-smi | sed -n 's/.*CUDA Version: *\([0-9.]*\).*/driver CUDA \1/p'
    command -v nvcc >/dev/null && nvcc --version | grep -m1 release
    cmake --version | head -n 1
    echo "cpus $JOBS, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)"
    # Information only, so bounded: a first torch import from a cold page cache on a loaded
    # 2-core machine once took the whole section (transformers' version from its metadata,
    # without importing it).
    { timeout 20 python3 -c 'import importlib.metadata as md, torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", md.version("transformers"))' 2>&1 ||
        echo 'torch: not imported within 20 s'; } | tail -n 1
    echo "backend $BACKEND, bench $BENCH_SPEC, longctx synthetic:$LONG_MODEL x $LONG_N tokens, $LONG_LAYERS layer(s)"
    return 0
}

sec_configure() {
    set -e
    # ---- dependencies: the system's when complete, else the carried .debs ----
    have_pc() { command -v pkg-config >/dev/null && pkg-config --exists "$@" 2>/dev/null; }
    local deps=() f m L PKGCONF
    if [ -z "${FORCE_DEBS:-}" ] && have_pc openblas libcjson libpcre2-8 hwloc; then
        echo "dependencies: from the system"
    else
        echo "dependencies: unpacking .debs into $DEBROOT"
        shopt -s nullglob
        local debs=("$ROOT"/.debs/*.deb)
        if [ ${#debs[@]} -eq 0 ]; then
            echo "run.sh: no .debs/*.deb (run tools/fetch-device-debs.sh and carry .debs)"
            echo "NOTE no .debs carried"
            return 2
        fi
        mkdir -p "$DEBROOT"
        for f in "${debs[@]}"; do
            if command -v dpkg >/dev/null; then
                dpkg -x "$f" "$DEBROOT"
            else # dpkg-less: a .deb is an ar archive holding data.tar.*
                local tmp
                tmp=$(mktemp -d)
                (cd "$tmp" && ar x "$f" && tar -xf data.tar.* -C "$DEBROOT")
                rm -rf "$tmp"
            fi
        done
        L=$DEBROOT/usr/lib/$MA
        # openblas.pc lives in openblas-openmp/ (Debian's OpenMP flavour, which the build
        # prefers, cmake/TesseraDeps.cmake; the alternatives link is not in the .deb); the
        # sysroot rewrites every -I/-L into the prefix; the system-path filters would drop
        # them once rewritten. The multiarch include folder (hwloc/autogen/config.h) is one
        # the compiler searches by itself under /usr but not under the prefix: CPATH.
        # deps.env carries this to the later sections.
        cat >"$LOGS/deps.env" <<EOF
export PKG_CONFIG_LIBDIR=$L/pkgconfig:$L/openblas-openmp/pkgconfig:$DEBROOT/usr/share/pkgconfig
export PKG_CONFIG_SYSROOT_DIR=$DEBROOT PKG_CONFIG_PATH=
export PKG_CONFIG_ALLOW_SYSTEM_CFLAGS=1 PKG_CONFIG_ALLOW_SYSTEM_LIBS=1
export LD_LIBRARY_PATH=$L:$L/openblas-openmp${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export CPATH=$DEBROOT/usr/include/$MA${CPATH:+:$CPATH}
EOF
        . "$LOGS/deps.env"
        # without pkg-config, the unpacked pkgconf (PKG_CONFIG_LIBDIR replaces its
        # personality files, which would point at /usr)
        PKGCONF=$(command -v pkg-config || echo "$DEBROOT/usr/bin/pkgconf")
        deps+=(-DPKG_CONFIG_EXECUTABLE="$PKGCONF")
        for m in openblas libcjson libpcre2-8 hwloc; do
            printf '  %-11s %s\n' "$m" "$("$PKGCONF" --cflags --libs "$m")"
        done
    fi
    # NCCL: the toolkit's, else pip's nvidia-nccl wheel (PyTorch brings one).
    local nccl=${NCCL_ROOT:-}
    if [ -z "$nccl" ] && [ ! -f "$(dirname "$(command -v nvcc)")/../include/nccl.h" ] &&
        command -v python3 >/dev/null; then
        nccl=$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null ||
            true)
    fi
    [ -n "$nccl" ] && deps+=(-DNCCL_ROOT="$nccl")
    local arch=${CUDA_ARCH:-} cap gen=()
    if [ -z "$arch" ]; then
        cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null |
            head -n 1 | tr -d . || true)
        arch=${cap:-90}
    fi
    command -v ninja >/dev/null && gen=(-G Ninja)
    echo "configure $B for sm_$arch"
    rm -rf "$B"
    cmake -S . -B "$B" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DTESSERA_WERROR=OFF \
        -DTESSERA_CUDA=ON -DTESSERA_MPI=OFF -DTESSERA_HDF5=OFF \
        -DCMAKE_CUDA_ARCHITECTURES="$arch" "${deps[@]}" >"$LOGS/configure-cmake.log" 2>&1 || {
        tail -n 30 "$LOGS/configure-cmake.log"
        return 1
    }
    grep -E "tessera|NCCL|CUDA|Warn|Error" "$LOGS/configure-cmake.log" || true
    grep -q "^TESSERA_CUDA:BOOL=ON" "$B/CMakeCache.txt"
}

sec_build() {
    local t rc=0 keep=(-k) missing=0
    # keep going past a target that fails, so that the checks of the others still run
    grep -q '^CMAKE_GENERATOR:INTERNAL=Ninja' "$B/CMakeCache.txt" && keep=(-k 0)
    echo "targets: ${DEVICE_TARGETS_S}"
    # shellcheck disable=SC2086
    cmake --build "$B" -j"$JOBS" --target $DEVICE_TARGETS_S -- "${keep[@]}" \
        >"$LOGS/build-cmake.log" 2>&1 || rc=1
    [ $rc = 0 ] || grep -E -B2 -A12 'error|Error' "$LOGS/build-cmake.log" | head -n 60
    for t in $DEVICE_TARGETS_S; do
        [ -n "$(find "$B" -name "$t" -type f -perm -u+x | head -n 1)" ] || {
            echo "missing: $t"
            missing=$((missing + 1))
        }
    done
    [ $missing = 0 ] || echo "NOTE $missing target(s) did not build"
    echo "built in $B"
    return $rc
}

# A check's own output goes to a file of its own (the section's log is still being written by
# tee while the function runs, so reading that one races with the tee).
sec_backend_ops() {
    [ "$BACKEND" != cuda ] && { "$B/tests/test_backend_ops"; return; } # no timings on a CPU
    local log=$LOGS/backend_ops.out
    # FP32 tolerances: the reference kernels (the BF16 tensor-core ones: sec_flash_attn)
    TSR_CUDA_ATTN=reference TSR_BENCH=1 "$B/tests/test_backend_ops" 2>&1 | tee "$log"
    [ "${PIPESTATUS[0]}" = 0 ] || return 1
    grep -q "backend cuda on" "$log" || {
        echo "run.sh: the CUDA backend did not come up"
        echo "NOTE no CUDA backend"
        return 1
    }
    # split-K decode, tiled prefill and the sample op must have met the CPU on the GPU
    local k rc=0
    for k in "attn split-K" "attn prefill tiled" "sample vocab 50000"; do
        grep -q "^  $k.* cuda " "$log" || {
            echo "run.sh: no cuda line for '$k'"
            rc=1
        }
    done
    return $rc
}

# The tensor-core attention against the reference kernels and the CPU, then the timing of a
# LONG_N-token prefill (flash, flash with h2o's key scores; both kernels at 8K).
sec_flash_attn() {
    local log=$LOGS/flash_attn.out
    TSR_FLASH_LONG=$([ "$BACKEND" = cuda ] && echo "$LONG_N" || echo 0) \
        "$B/tests/test_flash_attn" 2>&1 | tee "$log"
    [ "${PIPESTATUS[0]}" = 0 ] || return 1
    [ "$BACKEND" != cuda ] && return 0
    grep -q "^flash_timing flash n=$LONG_N " "$log" || {
        echo "run.sh: no flash timing for $LONG_N tokens"
        return 1
    }
}

# The memory contract (kernels/backend.h) on the GPU: host staging, sync and stream copies,
# events, KV rows by slot (kv.cu), attention with host positions; CUDA against the CPU.
sec_cuda_mem() {
    local log=$LOGS/cuda_mem.out
    "$B/tests/test_cuda_mem" 2>&1 | tee "$log"
    [ "${PIPESTATUS[0]}" = 0 ] || return 1
    [ "$BACKEND" != cuda ] && return 0
    grep -q "cuda: attention with host positions" "$log" || {
        echo "run.sh: test_cuda_mem did not run on the CUDA backend"
        return 1
    }
}

# No MPI here, so no multi-rank NCCL run: the real CUDA backend must count as a device
# backend with its own stream, i.e. what would put a multi-rank data plane on NCCL.
sec_dist_plane() {
    local log=$LOGS/dist_plane.out
    "$B/tests/test_dist_plane" test_cuda_backend_if_present 2>&1 | tee "$log"
    [ "${PIPESTATUS[0]}" = 0 ] || return 1
    [ "$BACKEND" != cuda ] && return 0
    grep -q "cuda backend on GPU" "$log" || {
        echo "run.sh: test_dist_plane did not get the CUDA backend"
        return 1
    }
}

sec_logits() {
    local rc=0 torch=1 r name model gold refs
    local check=("$B/bench/tsr_logits_check")
    for name in stories260K synth_bf16_gqa; do
        if [ $name = stories260K ]; then model=models/stories260K.bin; else model=tests/data/$name; fi
        gold=tests/data/golden/$name.json
        refs=(--ref "golden=$gold")
        if [ $torch = 1 ]; then
            r=0
            LD_LIBRARY_PATH=$SYS_LD_LIBRARY_PATH PYTHONUNBUFFERED=1 python3 tools/torch_reference.py --model "$model" \
                --prompts-from "$gold" --device "$TORCH_DEVICE" --threads "$JOBS" \
                --out "$LOGS/torch_$name.json" || r=$?
            if [ $r = 0 ]; then
                refs=(--ref "torch=$LOGS/torch_$name.json" "${refs[@]}")
            elif [ $r = 3 ]; then
                torch=0 # no torch/transformers: the golden files (transformers, made ahead)
            else
                rc=1
            fi
        fi
        "${check[@]}" "$model" --backend "$BACKEND" --against cpu "${refs[@]}" \
            --label "$name" --threads "$JOBS" || rc=1
    done
    # GGUF K-quant llamas (Q4_K with Q6_K; Q5_0/Q5_1 with Q8_0 and Q6_K): CUDA has no kernels
    # for those types and requantizes them to Q8_0 at load; TSR_GGUF_Q8=1 gives the CPU the
    # same Q8_0 weights (runtime/model/quantize.h). The CPU quantizes the activations to 8
    # bits, CUDA's Q8_0 GEMVs keep them f32: on these llamas that moves logits by up to 8 % of
    # their rms (test_quant_q5k/q6k's native against f32 runs), hence the tolerance.
    for model in tests/data/q6k/tiny_q6k.gguf tests/data/q5k/tiny_q5_01.gguf; do
        TSR_GGUF_Q8=1 "${check[@]}" "$model" --backend "$BACKEND" --against cpu --random 16 \
            --greedy 8 --tol-rel 0.1 --label "$(basename "$model")" --threads "$JOBS" || rc=1
    done
    # The 8B shape (GQA 32/8, head_dim 128, vocab 128256, llama3 rope), 2 layers: CUDA vs CPU.
    "${check[@]}" "$SHAPE_SPEC" --backend "$BACKEND" --against cpu --random 32 --greedy 8 \
        --label "$SHAPE_SPEC" --threads "$JOBS" || rc=1
    [ $torch = 1 ] || echo "NOTE PyTorch reference skipped (no torch/transformers here); golden files used"
    return $rc
}

# GPT-OSS: its ops against the CPU, the tiny models against transformers (their test runs
# cpu, cpu-fenced and cuda when it answers), then the 20B shape's decode at batch 1.
sec_gptoss() {
    local log=$LOGS/gptoss_ops.out mlog=$LOGS/gptoss_model.out blog=$LOGS/gptoss_bench.out
    local rc=0 k t
    "$B/tests/test_backend_ops_gptoss" 2>&1 | tee "$log"
    [ "${PIPESTATUS[0]}" = 0 ] || rc=1
    for t in test_gptoss_f32 test_gptoss_mxfp4; do
        "$B/tests/test_gptoss" "$t" 2>&1 | tee -a "$mlog"
        [ "${PIPESTATUS[0]}" = 0 ] || rc=1
    done
    if [ "$BACKEND" = cuda ]; then
        for k in "rope yarn" "sink split-K" "sink prefill tiled" "attention_paged sinks" \
            "moe mxfp4 37 rows"; do
            grep -q "^  $k.* cuda " "$log" || {
                echo "run.sh: no cuda line for '$k'"
                rc=1
            }
        done
        [ "$(grep -c '\[cuda\]: max abs logit diff' "$mlog")" = 2 ] || {
            echo "run.sh: the tiny GPT-OSS models did not run on cuda"
            rc=1
        }
    fi
    "$B/tessera" bench --model "$GPTOSS_SPEC" --backend "$BACKEND" --threads "$JOBS" \
        --prompt-tokens 128 --gen-tokens "$GPTOSS_GEN" --repeat 1 --json 2>&1 | tee "$blog"
    [ "${PIPESTATUS[0]}" = 0 ] || rc=1
    local tps gbs act
    tps=$(sed -n 's/.*"decode_tok_s":\([0-9.]*\).*/\1/p' "$blog")
    gbs=$(sed -n 's/.*"decode_gb_s":\([0-9.]*\).*/\1/p' "$blog")
    act=$(sed -n 's/.*"active_weight_bytes":\([0-9.]*\).*/\1/p' "$blog")
    echo "NOTE $GPTOSS_SPEC decode ${tps:-?} tok/s, ${gbs:-?} GB/s ($(awk -v a="${act:-0}" 'BEGIN {printf "%.4g", a / 1e6}') MB active/token)"
    return $rc
}

sec_roofline() {
    local d q kv h
    IFS=, read -r d q kv h <<<"$GEMM_DIMS"
    if [ "$BACKEND" = cuda ]; then
        "$B/bench/tsr_gpu_roofline" --copy-mib 4096 --repeat 20 \
            --layer "$PREFILL,$d,$q,$kv,$h" --gemm 8192x8192x8192
        return
    fi
    # CPU rehearsal: the host's streaming-read bandwidth and OpenBLAS SGEMM, in the GPU
    # tool's keys (hbm_gbs, gemm_layer tflops).
    local bw g
    bw=$("$B/bench/tsr_membw" --mib 256 --repeat 3 --max-threads "$JOBS") || return 1
    echo "$bw"
    g=$("$B/bench/tsr_sgemm" --m "$PREFILL" --n "$h" --k "$d" --threads "$JOBS" --repeat 3) ||
        return 1
    echo "$g"
    echo "hbm_gbs=$(sed -n "s/.*\"read_gb_s_${JOBS}t\":\([0-9.]*\).*/\1/p" <<<"$bw")"
    echo "gemm_layer tokens=$PREFILL tflops=$(sed -n 's/.*"gflops_best":\([0-9.]*\).*/\1/p' <<<"$g" |
        awk '{print $1 / 1000}')"
}

sec_throughput() {
    "$B/bench/tsr_devbench" "$BENCH_SPEC" --backend "$BACKEND" --threads "$JOBS" \
        --prefill "$PREFILL" --ctx "$CTX" --gen "$GEN" --batch "$BATCHES" --repeat 3
}

# Quantized weights: the kernels against host references (any failure fails the section),
# then decode at batch 1 in fp8 and bf16 (tessera bench). Bytes per fp8 step: the bf16
# step's with the layers halved, the bf16 classifier kept (B16 / 2 + vocab * dim).
sec_quant() {
    local log=$LOGS/quant.out rc=0 dt hbm
    TSR_BENCH=1 "$B/tests/test_cuda_quant" 2>&1 | tee "$log"
    [ "${PIPESTATUS[0]}" = 0 ] || rc=1
    if [ "$BACKEND" = cuda ] && ! grep -q "backend cuda on" "$log"; then
        echo "run.sh: test_cuda_quant did not get the CUDA backend"
        rc=1
    fi
    for dt in bf16 fp8; do
        "$B/tessera" bench --model "$QUANT_SPEC" --dtype $dt --backend "$BACKEND" \
            --threads "$JOBS" --prompt-tokens 16 --gen-tokens "$GEN" --repeat 3 --json \
            >"$LOGS/quant_$dt.json" || rc=1
    done
    hbm=$(sed -n 's/.*hbm_gbs=\([0-9.]*\).*/\1/p' "$LOGS/roofline.log" 2>/dev/null | tail -n 1)
    LD_LIBRARY_PATH=$SYS_LD_LIBRARY_PATH python3 - "$LOGS/quant_bf16.json" "$LOGS/quant_fp8.json" "${hbm:-0}" <<'PY' || rc=1
import json, sys
b, f = (json.load(open(p)) for p in sys.argv[1:3])
hbm = float(sys.argv[3])
fp8_bytes = b["decode_bytes_per_token"] / 2 + b["vocab_size"] * b["dim"]
gbs = fp8_bytes * f["decode_tok_s"] / 1e9
x = f["decode_tok_s"] / b["decode_tok_s"]
of = "%.0f %%" % (100 * gbs / hbm) if hbm else "? %"
# the bytes ratio: the speed-up a bandwidth-bound decode can reach at this layer count
ideal = b["decode_bytes_per_token"] / fp8_bytes
print("quant_decode batch=1 bf16_tok_s=%.1f fp8_tok_s=%.1f speedup=%.2f bytes_ratio=%.2f "
      "fp8_gbs=%.0f hbm_gbs=%.0f of_hbm=%s" % (b["decode_tok_s"], f["decode_tok_s"], x, ideal,
                                               gbs, hbm, of))
print("NOTE fp8 decode b1 %.2fx bf16 (bytes %.2fx), %.0f GB/s (%s of HBM)" % (x, ideal, gbs, of))
PY
    return $rc
}

sec_longctx() {
    local n_pol out deadline
    if [ -n "${POLICIES:-}" ]; then n_pol=$(wc -w <<<"$POLICIES")
    else n_pol=$("$B/bench/tsr_longctx" --policies | wc -l); fi
    # paged first (the registry's order); each run gets the time left over the runs left,
    # so the fast budgeted policies leave their share to the slow ones
    deadline=$(($(date +%s) + SECTION_LIMIT - 5))
    echo "$n_pol policies in ${SECTION_LIMIT}s, each the time left over the runs left"
    out=$(BACKEND=$BACKEND MODEL=$LONG_MODEL THREADS=$JOBS DEADLINE=$deadline \
        bash bench/longctx.sh "$B" "$LONG_N" "$LONG_LAYERS") || return 1
    echo "$out"
    if grep -q FAILED <<<"$out"; then
        echo "NOTE $(grep -c FAILED <<<"$out") of $n_pol policies failed"
        return 1
    fi
}

sec_ctest() {
    [ -n "${SKIP_CTEST:-}" ] && { echo "NOTE SKIP_CTEST set"; return 77; }
    cmake --build "$B" -j"$JOBS" >"$LOGS/build-all.log" 2>&1 || {
        tail -n 30 "$LOGS/build-all.log"
        return 1
    }
    ctest --test-dir "$B" -L unit -LE "slurm|fenced" -j"$JOBS" --timeout 60 \
        --output-on-failure 2>&1 | tail -n 25
    return "${PIPESTATUS[0]}"
}

# ---- the summary -------------------------------------------------------------------------

# key=value of the last line of FILE starting with PREFIX
kv() { sed -n "/^$2/p" "$1" 2>/dev/null | tail -n 1 | tr ' ' '\n' | sed -n "s/^$3=//p"; }

perf_table() {
    local rl=$LOGS/roofline.log tp=$LOGS/throughput.log hbm gemm
    hbm=$(kv "$rl" hbm_gbs= hbm_gbs)
    gemm=$(kv "$rl" gemm_layer tflops)
    echo "| measure | tokens/s | achieved | ceiling, measured in this run | of ceiling | target | |"
    echo "|---|---:|---:|---:|---:|---:|---|"
    [ -f "$tp" ] || tp=/dev/null
    awk -v hbm="${hbm:-0}" -v gemm="${gemm:-0}" '
        function val(k,   i, a) { for (i = 2; i <= NF; i++) { split($i, a, "="); if (a[1] == k) return a[2] } return "" }
        function verdict(p, t) { return (hbm > 0 && gemm > 0) ? (p >= t ? "PASS" : "BELOW") : "no ceiling" }
        function floor_s(bytes, flops,   a, b) { a = hbm > 0 ? bytes / (hbm * 1e9) : 0; b = gemm > 0 ? flops / (gemm * 1e12) : 0; return a > b ? a : b }
        /^prefill / {
            n = val("tokens"); s = val("seconds"); f = n * val("flops_per_token")
            p = 100 * floor_s(val("bytes"), f) / s
            printf "| prefill, %d tokens in one call | %.0f | %.3g TFLOP/s | %.3g TFLOP/s cuBLAS BF16 GEMM at this shape | %.1f %% | >= 60 %% | %s |\n", n, val("tok_s"), f / s / 1e12, gemm, p, verdict(p, 60)
            seen = 1
        }
        /^decode / {
            s = val("step_s"); by = val("bytes_per_step"); fl = val("flops_per_step")
            p = 100 * floor_s(by, fl) / s
            printf "| decode, batch %d, context %d | %.1f | %.4g GB/s (weights + KV) | %.4g GB/s HBM copy | %.1f %% | >= 80 %% | %s |\n", val("batch"), val("ctx"), val("tok_s"), by / s / 1e9, hbm, p, verdict(p, 80)
            seen = 1
        }
        END { if (!seen) print "| not measured (see the throughput section) | | | | | | |" }
    ' "$tp" 2>/dev/null
    echo
    echo "Ceilings: HBM ${hbm:-?} GB/s (best device-to-device copy, bytes read + written);"
    echo "cuBLAS BF16 GEMM ${gemm:-?} TFLOP/s (the seven GEMMs of one layer at $PREFILL tokens:"
    echo "total flops / total best time). Of ceiling: the roofline time of the step (bytes/HBM or"
    echo "flops/GEMM, whichever is longer) over the measured time."
}

summary() {
    local md=$OUT/gpu-results.md i gpu drv cuda
    gpu=$(sed -n 's/^gpu //p' "$LOGS/machine.log" 2>/dev/null | head -n 1 | cut -d, -f1)
    drv=$(sed -n 's/^gpu //p' "$LOGS/machine.log" 2>/dev/null | head -n 1 | cut -d, -f2 | tr -d ' ')
    cuda=$(sed -n 's/^driver CUDA //p' "$LOGS/machine.log" 2>/dev/null)
    {
        echo "## Run of $(date -u '+%Y-%m-%d %H:%M UTC')"
        echo
        echo "- GPU: ${gpu:-?}; driver ${drv:-?}; CUDA (driver) ${cuda:-?};" \
            "$(grep -m1 -o 'release [0-9.]*' "$LOGS/machine.log" 2>/dev/null | sed 's/^/nvcc /')"
        echo "- $(grep -m1 '^torch' "$LOGS/machine.log" 2>/dev/null || echo 'torch: ?')"
        echo "- backend $BACKEND; tests/device/run.sh took $(($(date +%s) - T0)) s of a ${BUDGET} s budget"
        echo
        echo "| section | status | seconds | note |"
        echo "|---|---|---:|---|"
        for i in "${!S_NAME[@]}"; do
            echo "| ${S_NAME[$i]} | ${S_STATUS[$i]} | ${S_SECS[$i]} | ${S_NOTE[$i]} |"
        done
        echo
        echo "### Logits (bench/logits_check.c; CUDA vs CPU, vs PyTorch, vs the golden files)"
        echo
        echo '```'
        grep -h -E '^(== logits|RESULT logits|  [a-z0-9-]+ +max_abs)' "$LOGS/logits.log" 2>/dev/null ||
            echo "not run"
        echo '```'
        echo
        echo "### Attention kernels (tests/unit/test_flash_attn.c; of peak: BF16 tensor-core peak)"
        echo
        echo '```'
        grep -h '^flash_timing' "$LOGS/flash_attn.log" 2>/dev/null || echo "no timing"
        # the eight comparisons closest to their tolerance
        grep -h -E '^  .* (flash|ref) +max abs err' "$LOGS/flash_attn.log" 2>/dev/null |
            sort -t'(' -k2 -rn | head -n 8 || true
        echo '```'
        echo
        echo "### Throughput against the roofline ($BENCH_SPEC)"
        echo
        perf_table
        echo
        echo "### Quantized weights (tests/unit/test_cuda_quant.c; $QUANT_SPEC decode, batch 1)"
        echo
        echo '```'
        grep -h -E '^(quant_gemv|quant_decode|  cuda .*(cublasLt|tiles))' "$LOGS/quant.log" 2>/dev/null ||
            echo "not run"
        echo '```'
        echo
        echo "### 128K-token prefill per policy (synthetic:$LONG_MODEL, $LONG_LAYERS layer(s), budget 10 %)"
        echo
        echo '```'
        grep -h -E '^(# |policy |[a-z0-9_()-]+ +[0-9]+ )' "$LOGS/longctx.log" 2>/dev/null ||
            echo "not run"
        echo '```'
    } >"$md"
    say "summary (paste into docs/gpu-results.md)"
    echo "----- 8< -----"
    cat "$md"
    echo "----- >8 -----"
}

export -f sec_machine sec_configure sec_build sec_backend_ops sec_flash_attn sec_cuda_mem sec_dist_plane \
    sec_logits sec_gptoss sec_roofline sec_throughput sec_quant sec_longctx sec_ctest
export DEVICE_TARGETS_S="${DEVICE_TARGETS[*]}"

section machine 30 sec_machine 1
if [ "$BACKEND" = cuda ]; then
    section configure 90 sec_configure 20
    # the carried libraries' environment (sec_configure), for the build and every binary
    [ -f "$LOGS/deps.env" ] && . "$LOGS/deps.env"
    if [ -n "${CONFIGURE_ONLY:-}" ]; then
        say "configured (CONFIGURE_ONLY)"
        exit 0
    fi
    section build "${BUILD_LIMIT_S:-150}" sec_build 30
else
    echo "(rehearsal on $BACKEND: configure and build skipped, using $B)"
fi
if [ -x "$B/bench/tsr_logits_check" ]; then
    section backend_ops 60 sec_backend_ops
    section cuda_mem 30 sec_cuda_mem
    section dist_plane 20 sec_dist_plane
    section flash_attn 90 sec_flash_attn 20
    section logits 90 sec_logits 20
    section roofline 40 sec_roofline
    section throughput 90 sec_throughput 30
    # the 128K section before the newer ones: issue 24 asks that it is always reached
    section longctx "${LONGCTX_LIMIT_S:-330}" sec_longctx 30
    section quant 90 sec_quant 30
    section gptoss 120 sec_gptoss 40
    section ctest 120 sec_ctest 60
else
    echo "run.sh: $B has no build: the checks are skipped"
    FAILED=1
fi
summary
pack_logs
say "done: $([ $FAILED = 0 ] && echo PASS || echo FAIL)"
exec >&- 2>&-
wait "$TEE_PID" 2>/dev/null # run.log complete before the run tool collects $OUT
exit $FAILED
