#!/usr/bin/env bash
# Peak RSS and wall time of one short `tessera generate` on the bundled model, for two
# builds side by side: the CUDA-enabled one (binary + libtessera-cuda.so, which a CPU run
# must never load) against the CPU-only one. Each figure is the median of RUNS runs
# (default 11, the two builds in turns), all on the CPU backend as `auto` picks it on a node without a GPU.
#
#   bench/startup_rss.sh CUDA_BUILD_DIR CPU_BUILD_DIR
#   e.g. bench/startup_rss.sh build build-cpu
#
# Prints one row per build and the differences; exits 1 when the CUDA-enabled build is more
# than 2 MB or 10 % above the CPU-only one (docs/perf.md, "Start-up and memory").
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
if [ $# -ne 2 ]; then
    sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
fi
RUNS=${RUNS:-11}
MODEL=${MODEL:-$ROOT/models/stories260K.bin}
PROMPT=${PROMPT:-Once upon a time}
TOKENS=${TOKENS:-32}

# Both builds measured in turns (A B A B ...), so that a load change on the machine falls
# on both alike. Prints "rss_kib_a wall_s_a rss_kib_b wall_s_b" (medians).
read -r rss_g wall_g rss_c wall_c < <(python3 - "$1/tessera" "$2/tessera" "$MODEL" "$PROMPT" \
    "$TOKENS" "$RUNS" <<'PY'
import os, statistics, subprocess, sys, time
exes, model, prompt, tokens, runs = sys.argv[1:3], sys.argv[3], sys.argv[4], sys.argv[5], int(sys.argv[6])
res = {e: ([], []) for e in exes}
for _ in range(runs):
    for exe in exes:
        cmd = [exe, "generate", "--model", model, "--prompt", prompt, "--max-tokens", tokens,
               "--temperature", "0"]
        t0 = time.monotonic()
        # one child at a time, so wait4's rusage is this run's alone
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _, status, ru = os.wait4(p.pid, 0)
        res[exe][1].append(time.monotonic() - t0)
        if status != 0:
            sys.exit("%s failed (status %d)" % (" ".join(cmd), status))
        res[exe][0].append(ru.ru_maxrss)  # KiB on Linux
print(" ".join("%d %.4f" % (statistics.median(res[e][0]), statistics.median(res[e][1]))
               for e in exes))
PY
)
has_module=no
[ -f "$1/libtessera-cuda.so" ] && has_module=yes
row() { awk -v n="$1" -v r="$2" -v w="$3" 'BEGIN { printf "%-34s %14.1f %12.1f\n", n, r / 1024, w * 1000 }'; }
printf '%-34s %14s %12s\n' "build ($RUNS runs, median)" "peak RSS MiB" "wall ms"
row "$1 (module: $has_module)" "$rss_g" "$wall_g"
row "$2" "$rss_c" "$wall_c"
python3 - "$rss_g" "$rss_c" "$wall_g" "$wall_c" <<'PY'
import sys
rg, rc, wg, wc = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
drss = (rg - rc) / 1024.0
dwall = (wg - wc) / wc * 100.0 if wc > 0 else 0.0
ok = drss <= 2.0 and dwall <= 10.0
print("difference: %+.1f MiB peak RSS (target <= 2), %+.1f %% wall time (target <= 10): %s"
      % (drss, dwall, "ok" if ok else "ABOVE TARGET"))
sys.exit(0 if ok else 1)
PY
