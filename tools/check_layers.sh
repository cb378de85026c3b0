#!/usr/bin/env bash
# Fails on an #include that points up the layering (docs/architecture.md):
#   base < comm < kernels < memory < policies < runtime < jobs
# A file may include its own folder or any folder below it; tests/, bench/ and tools/ sit
# above everything. Inside runtime/ and jobs/ the same holds between rooms:
#   runtime/format < runtime/text < runtime/model < runtime/exec < runtime/engine < runtime/eval
#   jobs < jobs/run < jobs/study        (a study reads run records, never the reverse)
# and a source file of runtime/ outside every room is refused (a new file goes into a room).
# Private headers: a *_internal.h, or a header listed in PRIVATE, may be included only from
# files under its own folder. Usage: tools/check_layers.sh [REPO_ROOT]
set -euo pipefail
cd "${1:-$(dirname "$0")/..}"
declare -A RANK=([base]=0 [comm]=1 [kernels]=2 [memory]=3 [policies]=4 [runtime]=5 [jobs]=6)
# Rooms of a layer and their order; the layer's own top folder is a room only when listed.
declare -A ROOM=([runtime/format]=0 [runtime/text]=1 [runtime/model]=2 [runtime/exec]=3
                 [runtime/engine]=4 [runtime/eval]=5
                 [jobs]=0 [jobs/run]=1 [jobs/study]=2)
declare -A HAS_ROOMS=([runtime]=1 [jobs]=1)
# Headers private to their folder that are not named *_internal.h.
PRIVATE=(jobs/run/run_job.h)

# The room of a path (its folder or the nearest folder above listed in ROOM), or "".
room_of() {
    local d
    d=$(dirname "$1")
    while [[ $d == */* || -n ${ROOM[$d]+x} ]]; do
        if [ -n "${ROOM[$d]+x}" ]; then echo "$d"; return; fi
        d=$(dirname "$d")
    done
    echo ""
}

bad=0
for dir in "${!RANK[@]}"; do
    [ -d "$dir" ] || continue
    if [ -n "${HAS_ROOMS[$dir]+x}" ]; then
        while IFS= read -r f; do
            if [ -z "$(room_of "$f")" ]; then
                echo "$f: in no room of $dir/ (tools/check_layers.sh lists them)" >&2
                bad=$((bad + 1))
            fi
        done < <(find "$dir" -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' \
                     -o -name '*.cuh' \) | sort)
    fi
    while IFS= read -r hit; do
        file=${hit%%:*}; rest=${hit#*:}; line=${rest%%:*}
        inc=$(sed -E 's/.*#[[:space:]]*include[[:space:]]+"([^"]+)".*/\1/' <<<"$rest")
        to=${inc%%/*}
        [ -n "${RANK[$to]+x}" ] || continue
        if [ "${RANK[$to]}" -gt "${RANK[$dir]}" ]; then
            echo "$file:$line: $dir/ includes $inc, a folder above it" >&2
            bad=$((bad + 1))
        elif [ "$to" = "$dir" ] && [ -n "${HAS_ROOMS[$dir]+x}" ]; then
            from_room=$(room_of "$file"); to_room=$(room_of "$inc")
            if [ -z "$to_room" ]; then
                echo "$file:$line: includes $inc, which is in no room of $dir/" >&2
                bad=$((bad + 1))
            elif [ -n "$from_room" ] && [ "${ROOM[$to_room]}" -gt "${ROOM[$from_room]}" ]; then
                echo "$file:$line: $from_room/ includes $inc, a room after it" >&2
                bad=$((bad + 1))
            fi
        fi
        private=0
        [[ $inc == *_internal.h ]] && private=1
        for p in "${PRIVATE[@]}"; do [ "$inc" = "$p" ] && private=1; done
        if [ "$private" = 1 ]; then
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
    echo "check_layers: $bad include(s) or file(s) against the layering" >&2
    exit 1
fi
echo "check_layers: every include follows base < comm < kernels < memory < policies < runtime < jobs,"
echo "  the rooms (runtime: format < text < model < exec < engine < eval; jobs < jobs/run < jobs/study)"
echo "  and the private headers"
