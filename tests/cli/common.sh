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
