#!/usr/bin/env bash
# Fails on an #include that points up the layering (docs/architecture in README.md):
#   base < comm < kernels < memory < policies < runtime < jobs
# A file may include its own folder or any folder below it; tests/, bench/ and tools/ sit
# above everything. Also refuses a header of a backend's private insides (kernels/X/*_internal.h)
# included from outside kernels/X. Usage: tools/check_layers.sh [REPO_ROOT]
set -euo pipefail
cd "${1:-$(dirname "$0")/..}"
declare -A RANK=([base]=0 [comm]=1 [kernels]=2 [memory]=3 [policies]=4 [runtime]=5 [jobs]=6)
bad=0
for dir in "${!RANK[@]}"; do
    [ -d "$dir" ] || continue
    while IFS= read -r hit; do
        file=${hit%%:*}; rest=${hit#*:}; line=${rest%%:*}
        inc=$(sed -E 's/.*#[[:space:]]*include[[:space:]]+"([^"]+)".*/\1/' <<<"$rest")
        to=${inc%%/*}
        [ -n "${RANK[$to]+x}" ] || continue
        if [ "${RANK[$to]}" -gt "${RANK[$dir]}" ]; then
            echo "$file:$line: $dir/ includes $inc, a folder above it" >&2
            bad=$((bad + 1))
        fi
        if [[ $inc == kernels/*/*_internal.h ]]; then
            owner=$(dirname "$inc")
            if [[ $file != "$owner"/* ]]; then
                echo "$file:$line: includes $inc, the private header of $owner/" >&2
                bad=$((bad + 1))
            fi
        fi
    done < <(grep -rnE --include='*.c' --include='*.h' --include='*.cu' --include='*.cuh' \
                 '^[[:space:]]*#[[:space:]]*include[[:space:]]+"' "$dir" || true)
done
if [ "$bad" -gt 0 ]; then
    echo "check_layers: $bad include(s) against the layering" >&2
    exit 1
fi
echo "check_layers: every include follows base < comm < kernels < memory < policies < runtime < jobs"
