# Sourced by the tessera run CLI tests: the arguments every test gets from ctest
# ($1 tessera binary, $2 repo root, $3 scratch dir, emptied here), the bundled model, and
# fail(), which counts a failure and lets the test go on (the test exits non-zero at the end
# when fails > 0).
BIN=$1
ROOT=$2
TMP=$3
MODEL=$ROOT/models/stories260K.bin
rm -rf "$TMP"
mkdir -p "$TMP"
fails=0
fail() {
    echo "FAIL: $*" >&2
    fails=$((fails + 1))
}
# On the fenced CPU device every backend call opens and closes an mprotect fence (~10 us
# each on these VMs), so the long bulk jobs use fewer requests there: what they check
# (records, signals, resume) does not depend on the count.
fenced_scale() {
    if [ "${TSR_TEST_BACKEND:-cpu}" = cpu-fenced ]; then echo "$2"; else echo "$1"; fi
}
# Lines of a file (0 when it does not exist yet).
nlines() { if [ -f "$1" ]; then wc -l <"$1"; else echo 0; fi; }
# term_after PID FILE N [TRIES]: SIGTERM to the background job PID once FILE has N lines
# (or after TRIES x 10 ms, default 800), then waits for it: returns its exit status.
term_after() {
    local k=0
    while [ "$(nlines "$2")" -lt "$3" ] && [ $k -lt "${4:-800}" ]; do
        sleep 0.01
        k=$((k + 1))
    done
    kill -TERM "$1"
    wait "$1"
}
# same_records A B WHAT: the same custom_ids once each with the same texts and reasons.
same_records() {
    python3 - "$1" "$2" <<'PY' || fail "$3: records differ"
import json, sys
def load(p):
    d = {}
    for line in open(p):
        r = json.loads(line)
        assert r["custom_id"] not in d, "duplicate " + r["custom_id"]
        c = r["response"]["body"]["choices"][0]
        d[r["custom_id"]] = (c["text"], c["finish_reason"])
    return d
a, b = load(sys.argv[1]), load(sys.argv[2])
bad = sorted(k for k in b if a.get(k) != b[k])
assert len(a) == len(b) and not bad, "%d vs %d records, differing: %s" % (len(a), len(b), bad[:5])
PY
}
