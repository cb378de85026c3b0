#!/usr/bin/env bash
# slurm/*.sbatch under a real single-node Slurm started for the test (start-slurm.sh):
#   1. a bulk job runs to COMPLETED with the same records as a direct `tessera run`;
#   2. a bulk job signalled mid-run like at its time limit (`scancel --batch --signal=USR1`)
#      stops, requeues itself and resumes to a complete output, every id once;
#   3. a bulk job stopped by SIGTERM does not requeue (FAILED, exit 3); resubmitting resumes;
#   4. if `tessera generate --help` lists --tp: a 2-rank `srun --mpi=pmix` job of
#      `tessera generate --tp 2` prints what one process prints;
#   5. if `tessera run --help` lists --tp: a TP=2 bulk job on 2 ranks, stopped by USR1 (both
#      ranks get it from srun), requeued and completed;
#   6. the same with TP=auto and a checkpoint (HDF5 builds), requeued onto 1 task
#      (scontrol update NumTasks=1 NumCPUs=1): the 2 ranks' checkpoint resumes on 1 rank, and the
#      output equals a direct `tessera run`'s.
# Exits 77 (skipped) when not root or Slurm/munge are not installed. The daemons are
# stopped by PID when the script exits, however it exits.
# Args: $1 tessera binary, $2 repo root, $3 scratch dir.
set -u
BIN=$(realpath "$1")
ROOT=$(realpath "$2")
TMP=$3
MODEL=$ROOT/models/stories260K.bin
T0=$(date +%s)

skip() {
    echo "test_slurm: skipped: $*"
    exit 77
}
[ "$(id -u)" = 0 ] || skip "needs root (it starts slurmctld, slurmd and munged)"
for c in sbatch srun scontrol scancel sinfo munge unmunge; do
    command -v "$c" >/dev/null 2>&1 || skip "$c not found (apt-get install slurm-wlm slurmctld slurmd slurm-client munge)"
done
for d in /usr/sbin/slurmctld /usr/sbin/slurmd /usr/sbin/munged; do
    [ -x "$d" ] || skip "$d not found (apt-get install slurm-wlm slurmctld slurmd slurm-client munge)"
done
# shellcheck source=tests/slurm/start-slurm.sh
source "$ROOT/tests/slurm/start-slurm.sh"
mkdir -p "$TMP"
TMP=$(realpath "$TMP")
SDIR=$TMP/slurm
# Daemons left by an earlier run of this test that was killed (their PID files are here).
slurm_stop "$SDIR"
if command -v ss >/dev/null 2>&1 && ss -ltn 2>/dev/null | grep -q ':6817 '; then
    skip "port 6817 is in use (a Slurm controller runs here already)"
fi
rm -rf "$TMP"
mkdir -p "$TMP"
# An outer Slurm job's variables would leak into sbatch/srun.
for v in $(env | sed -n 's/^\(SLURM_[A-Za-z0-9_]*\)=.*/\1/p'); do unset "$v"; done
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
trap 'slurm_stop "$SDIR"' EXIT
trap 'exit 143' TERM INT # so that the EXIT trap runs when ctest's timeout stops the test

fails=0
fail() {
    echo "FAIL: $*" >&2
    fails=$((fails + 1))
}
die() {
    fail "$*"
    echo "--- slurmctld.log (tail)" >&2
    tail -n 20 "$SDIR/log/slurmctld.log" >&2 2>/dev/null
    echo "--- slurmd.log (tail)" >&2
    tail -n 20 "$SDIR/log/slurmd.log" >&2 2>/dev/null
    for f in "$TMP"/*.log; do
        [ -f "$f" ] && { echo "--- $f" >&2; cat "$f" >&2; }
    done
    exit 1
}
slurm_start "$SDIR" || die "could not start Slurm"
echo "test_slurm: slurm up in $(($(date +%s) - T0)) s: $(sinfo -h -o '%P %a %D %T %N')"

# job_field ID NAME: a field of `scontrol show job`.
job_field() { scontrol show job "$1" 2>/dev/null | grep -o " $2=[^ ]*" | head -n 1 | cut -d= -f2; }
# wait_done ID SECONDS [release]: waits for a final state and prints it. With "release", a
# requeued job still PENDING is told StartTime=now again every 5 s: Slurm gives a requeued
# job a BeginTime ~2 minutes out, and an update that lands while the job is still completing
# its first run can be lost (seen once in CI: PENDING past the wait).
wait_done() {
    local id=$1 k=0 st
    while [ $k -lt $(($2 * 5)) ]; do
        st=$(job_field "$id" JobState)
        case "$st" in
        COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | BOOT_FAIL | DEADLINE | PREEMPTED)
            echo "$st"
            return 0
            ;;
        PENDING)
            if [ "${3:-}" = release ] && [ $((k % 25)) -eq 0 ]; then
                scontrol update JobId="$id" StartTime=now >/dev/null 2>&1 || true
            fi
            ;;
        esac
        sleep 0.2
        k=$((k + 1))
    done
    echo "TIMEOUT_IN_TEST($st, $(job_field "$id" Reason))"
}
# release ID: lets a requeued job start now instead of after its ~2-minute BeginTime. Slurm
# sets that BeginTime because slurmd refuses a credential issued in the same second as the
# old run's revocation ("Job credential revoked": the job ends FAILED; seen in CI when
# StartTime=now came 0.3 s after the requeue), so this waits for PENDING and 2 s more.
release() {
    local id=$1 k=0
    while [ "$(job_field "$id" JobState)" != PENDING ] && [ $k -lt 300 ]; do
        sleep 0.2
        k=$((k + 1))
    done
    sleep 2
    scontrol update JobId="$id" StartTime=now
}
nlines() { if [ -f "$1" ]; then wc -l <"$1"; else echo 0; fi; }
# wait_lines FILE N SECONDS: until FILE has at least N lines.
wait_lines() {
    local k=0
    while [ "$(nlines "$1")" -lt "$2" ] && [ $k -lt $(($3 * 20)) ]; do
        sleep 0.05
        k=$((k + 1))
    done
    [ "$(nlines "$1")" -ge "$2" ]
}
check_jsonl() { # FILE N WHAT: N valid records, each custom_id once
    local n ids
    n=$(wc -l <"$1")
    [ "$n" -eq "$2" ] || fail "$3: $n records, want $2"
    ids=$(grep -o '"custom_id":"[^"]*"' "$1" | sort -u | wc -l)
    [ "$ids" -eq "$2" ] || fail "$3: $ids distinct custom_ids, want $2"
    if command -v python3 >/dev/null 2>&1; then
        python3 -c 'import json,sys; [json.loads(l) for l in open(sys.argv[1])]' "$1" ||
            fail "$3: not valid JSONL"
    fi
}
make_input() { # FILE N MAX_TOKENS
    local i
    for i in $(seq 0 $(($2 - 1))); do
        printf '{"custom_id": "q-%03d", "url": "/v1/completions", "body": {"prompt": "Once upon a time", "max_tokens": %d, "temperature": 0.8, "seed": %d}}\n' "$i" "$3" "$i"
    done >"$1"
}
# Batches of <= 4 rows are bit-identical to solo rows, so cut runs equal uninterrupted ones.
RUN_ARGS="--max-batch-seqs 4 --max-batch-tokens 16 --progress-interval 0"
submit_bulk() { # INPUT OUTPUT LOGNAME [sbatch options]
    local in=$1 out=$2 log=$3
    shift 3
    MODEL=$MODEL INPUT=$in OUTPUT=$out TESSERA=$BIN EXTRA_ARGS=$RUN_ARGS \
        sbatch --parsable -D "$TMP" -o "$TMP/$log" -t 10 "$@" "$ROOT/slurm/tessera-bulk.sbatch"
}
cd "$TMP" || die "cd $TMP"

# --- 1. a small bulk job to COMPLETED (DTYPE=q8_0: quantized at load) ---------------------
make_input "$TMP/small.jsonl" 20 16
DT=()
if "$BIN" run --help 2>/dev/null | grep -q -- '--dtype'; then DT=(--dtype q8_0); fi
# shellcheck disable=SC2086  # RUN_ARGS is a list of options
"$BIN" run --model "$MODEL" --input "$TMP/small.jsonl" --output "$TMP/small.ref.jsonl" \
    $RUN_ARGS "${DT[@]}" --quiet || die "direct tessera run failed"
id=$(DTYPE=${DT[1]:-} submit_bulk "$TMP/small.jsonl" "$TMP/small.out.jsonl" small.log -n 1) ||
    die "sbatch failed"
st=$(wait_done "$id" 60)
[ "$st" = COMPLETED ] || die "job 1 ($id): $st, want COMPLETED"
[ "$(job_field "$id" ExitCode)" = 0:0 ] || fail "job 1: ExitCode $(job_field "$id" ExitCode)"
grep -q "JobId=$id .*JobState=COMPLETED" "$SDIR/log/jobcomp.txt" || fail "job 1: no jobcomp line"
check_jsonl "$TMP/small.out.jsonl" 20 "job 1"
diff <(sort "$TMP/small.ref.jsonl") <(sort "$TMP/small.out.jsonl") >/dev/null ||
    fail "job 1: records differ from a direct tessera run"
echo "test_slurm: job 1${DT[1]:+ (${DT[1]})} COMPLETED ($(($(date +%s) - T0)) s)"

# --- 2. USR1 as before the time limit: stop, requeue, resume ------------------------------
N=160
make_input "$TMP/big.jsonl" $N 150
# With CHECKPOINT (HDF5 builds) the stop also saves the requests in flight and the requeued
# run resumes them.
CK=""
if ! "$BIN" run --model "$MODEL" --input /dev/null --output "$TMP/ck-probe.jsonl" \
    --checkpoint "$TMP/ck-probe.h5" 2>&1 | grep -q "no HDF5"; then
    CK=$TMP/big.ck.h5
fi
id=$(CHECKPOINT=$CK submit_bulk "$TMP/big.jsonl" "$TMP/big.out.jsonl" big.log -n 1) ||
    die "sbatch failed"
wait_lines "$TMP/big.out.jsonl" 3 60 || die "job 2 ($id) wrote no records"
scancel --batch --signal=USR1 "$id" || fail "scancel --batch --signal=USR1 failed"
k=0
while [ "$(job_field "$id" Restarts)" != 1 ] && [ $k -lt 150 ]; do
    sleep 0.2
    k=$((k + 1))
done
[ "$(job_field "$id" Restarts)" = 1 ] || die "job 2 did not requeue ($(job_field "$id" JobState))"
n1=$(wc -l <"$TMP/big.out.jsonl")
grep -q "tessera run: stopped by SIGUSR1 after $n1 of $N requests" "$TMP/big.log" ||
    fail "job 2: no stop line for $n1 records"
grep -q "requeueing job $id" "$TMP/big.log" || fail "job 2: no requeue line"
[ "$n1" -lt $N ] || fail "job 2 finished before the signal; make the input bigger"
# A requeued job waits ~2 minutes (its BeginTime); the test does not.
release "$id" || fail "scontrol update StartTime failed"
st=$(wait_done "$id" 80 release)
[ "$st" = COMPLETED ] || die "job 2 ($id) after requeue: $st, want COMPLETED"
grep -q "resuming: .* holds $n1 records" "$TMP/big.log" || fail "job 2: the rerun did not resume"
if [ -n "$CK" ]; then
    grep -q "checkpoint: [1-9][0-9]* in-flight requests saved to $CK" "$TMP/big.log" ||
        fail "job 2: the stop saved no checkpoint"
    grep -q "resuming [1-9][0-9]* in-flight requests from $CK" "$TMP/big.log" ||
        fail "job 2: the requeued run did not resume the checkpoint"
    [ ! -e "$CK" ] || fail "job 2: checkpoint left after the job completed"
fi
check_jsonl "$TMP/big.out.jsonl" $N "job 2"
echo "test_slurm: job 2 stopped at $n1/$N, requeued, COMPLETED ($(($(date +%s) - T0)) s)"

# --- 3. SIGTERM: no requeue, exit 3; a resubmission resumes -------------------------------
id=$(submit_bulk "$TMP/big.jsonl" "$TMP/term.out.jsonl" term.log -n 1) || die "sbatch failed"
wait_lines "$TMP/term.out.jsonl" 3 60 || die "job 3 ($id) wrote no records"
scancel --batch --signal=TERM "$id" || fail "scancel --batch --signal=TERM failed"
st=$(wait_done "$id" 40)
n1=$(wc -l <"$TMP/term.out.jsonl")
if [ "$n1" -lt $N ]; then
    [ "$st" = FAILED ] || fail "job 3 ($id): $st, want FAILED"
    [ "$(job_field "$id" ExitCode)" = 3:0 ] || fail "job 3: ExitCode $(job_field "$id" ExitCode), want 3:0"
    [ "$(job_field "$id" Restarts)" = 0 ] || fail "job 3: requeued after SIGTERM"
    grep -q "got SIGTERM" "$TMP/term.log" || fail "job 3: the batch shell did not trap SIGTERM"
    grep -q "stopped by SIGUSR1 after $n1 of $N" "$TMP/term.log" || fail "job 3: no stop line"
fi
id=$(submit_bulk "$TMP/big.jsonl" "$TMP/term.out.jsonl" term2.log -n 1) || die "sbatch failed"
st=$(wait_done "$id" 80)
[ "$st" = COMPLETED ] || die "job 3 resubmitted ($id): $st, want COMPLETED"
check_jsonl "$TMP/term.out.jsonl" $N "job 3"
diff <(sort "$TMP/big.out.jsonl") <(sort "$TMP/term.out.jsonl") >/dev/null ||
    fail "jobs 2 and 3, cut at different points, differ"
echo "test_slurm: job 3 stopped at $n1/$N by SIGTERM, resubmitted, COMPLETED ($(($(date +%s) - T0)) s)"

# --- 4. two ranks: tessera generate --tp 2 under srun --mpi=pmix -------------------------
if "$BIN" generate --help 2>/dev/null | grep -q -- '--tp'; then
    "$BIN" generate --model "$MODEL" --prompt "Once upon a time" --max-tokens 40 \
        --temperature 0 >"$TMP/gen.ref.txt" 2>/dev/null || fail "direct generate failed"
    id=$(MODEL=$MODEL PROMPT="Once upon a time" MAX_TOKENS=40 TP=2 OUTPUT=$TMP/gen.tp2.txt \
        TESSERA=$BIN EXTRA_ARGS="--temperature 0" \
        sbatch --parsable -D "$TMP" -o "$TMP/gen.log" -n 2 -t 5 \
        "$ROOT/slurm/tessera-generate.sbatch") || die "sbatch failed"
    st=$(wait_done "$id" 60)
    [ "$st" = COMPLETED ] || fail "2-rank generate ($id): $st: $(cat "$TMP/gen.log")"
    cmp -s "$TMP/gen.ref.txt" "$TMP/gen.tp2.txt" ||
        fail "2-rank generate --tp 2 differs from one process: [$(cat "$TMP/gen.tp2.txt")] vs [$(cat "$TMP/gen.ref.txt")]"
    echo "test_slurm: 2-rank generate --tp 2 COMPLETED ($(($(date +%s) - T0)) s)"
else
    echo "test_slurm: 2-rank part skipped: $BIN generate --help has no --tp"
fi

# --- 5. two ranks: a bulk job with TP=2, stopped by USR1 on both ranks, requeued --------
if "$BIN" run --help 2>/dev/null | grep -q -- '--tp'; then
    id=$(TP=2 submit_bulk "$TMP/big.jsonl" "$TMP/tp2.out.jsonl" tp2.log -n 2) || die "sbatch failed"
    wait_lines "$TMP/tp2.out.jsonl" 3 60 || die "job 5 ($id) wrote no records"
    scancel --batch --signal=USR1 "$id" || fail "scancel --batch --signal=USR1 failed"
    k=0
    while [ "$(job_field "$id" Restarts)" != 1 ] && [ $k -lt 150 ]; do
        sleep 0.2
        k=$((k + 1))
    done
    n1=$(wc -l <"$TMP/tp2.out.jsonl")
    if [ "$(job_field "$id" Restarts)" = 1 ]; then
        grep -q "stopped by SIGUSR1 after $n1 of $N" "$TMP/tp2.log" || fail "job 5: no stop line"
        release "$id" || fail "scontrol update StartTime failed"
    else
        [ "$n1" -eq $N ] || die "job 5 ($id) did not requeue: $(job_field "$id" JobState)"
    fi
    st=$(wait_done "$id" 80 release)
    [ "$st" = COMPLETED ] || die "job 5 ($id), 2 ranks: $st, want COMPLETED"
    check_jsonl "$TMP/tp2.out.jsonl" $N "job 5 (2 ranks)"
    echo "test_slurm: job 5 (TP=2, 2 ranks) stopped at $n1/$N, requeued, COMPLETED ($(($(date +%s) - T0)) s)"
else
    echo "test_slurm: 2-rank bulk part skipped: $BIN run --help has no --tp"
fi

# --- 6. an elastic requeue: 2 ranks stop with a checkpoint, 1 rank resumes it ------------
if [ -n "$CK" ] && "$BIN" run --help 2>/dev/null | grep -q -- '--tp'; then
    CK6=$TMP/el.ck.h5
    N6=48
    make_input "$TMP/el.jsonl" $N6 100
    # shellcheck disable=SC2086  # RUN_ARGS is a list of options
    "$BIN" run --model "$MODEL" --input "$TMP/el.jsonl" --output "$TMP/el.ref.jsonl" \
        $RUN_ARGS --quiet || die "direct tessera run failed"
    id=$(TP=auto CHECKPOINT=$CK6 submit_bulk "$TMP/el.jsonl" "$TMP/el.out.jsonl" el.log -n 2) ||
        die "sbatch failed"
    wait_lines "$TMP/el.out.jsonl" 3 60 || die "job 6 ($id) wrote no records"
    scancel --batch --signal=USR1 "$id" || fail "scancel --batch --signal=USR1 failed"
    k=0
    while [ "$(job_field "$id" Restarts)" != 1 ] && [ $k -lt 150 ]; do
        sleep 0.2
        k=$((k + 1))
    done
    n1=$(wc -l <"$TMP/el.out.jsonl")
    if [ "$(job_field "$id" Restarts)" = 1 ]; then
        grep -q "checkpoint: [1-9][0-9]* in-flight requests saved to $CK6" "$TMP/el.log" ||
            fail "job 6: the stop saved no checkpoint"
        k=0
        while ! scontrol show job "$id" | grep -q JobState=PENDING && [ $k -lt 300 ]; do
            sleep 0.2
            k=$((k + 1))
        done
        scontrol update JobId="$id" NumTasks=1 NumCPUs=1 ||
            fail "scontrol update NumTasks=1 NumCPUs=1 failed"
        release "$id" || fail "scontrol update StartTime failed"
        st=$(wait_done "$id" 120 release)
        [ "$st" = COMPLETED ] || die "job 6 ($id) on 1 task: $st, want COMPLETED"
        grep -q "run 2 on .*: 1 task(s)" "$TMP/el.log" || fail "job 6: run 2 was not 1 task"
        grep -q "resuming [1-9][0-9]* in-flight requests from $CK6" "$TMP/el.log" ||
            fail "job 6: the 1-rank run did not resume the 2 ranks' checkpoint"
        [ ! -e "$CK6" ] || fail "job 6: checkpoint left after the job completed"
        check_jsonl "$TMP/el.out.jsonl" $N6 "job 6 (2 ranks, then 1)"
        diff <(sort "$TMP/el.out.jsonl") <(sort "$TMP/el.ref.jsonl") >/dev/null ||
            fail "job 6 (2 ranks, resumed on 1) differs from a direct tessera run"
        echo "test_slurm: job 6 stopped at $n1/$N6 on 2 ranks, requeued onto 1, resumed its" \
            "checkpoint, COMPLETED ($(($(date +%s) - T0)) s)"
    else
        [ "$n1" -eq $N6 ] || die "job 6 ($id) did not requeue: $(job_field "$id" JobState)"
    fi
fi

if [ $fails -ne 0 ]; then
    die "test_slurm: $fails failure(s)"
fi
echo "test_slurm: ok ($(($(date +%s) - T0)) s)"
