#!/bin/bash
# A `tessera characterize` study as a Slurm batch job: every pending cell is one job step
# (srun), several at a time, and a final `tessera characterize` writes cells.csv,
# summary.json, report.md and the plots. Finished cells are records in OUT/cells/, so a
# resubmitted or requeued job runs only what is left (a cell cut off mid-way reruns).
#
#   STUDY=$PWD/studies/paper-8b.json OUT=$PWD/results/paper-8b sbatch -N 4 slurm/characterize.sh
#
# Before the time limit Slurm sends USR1 to this shell (--signal below); the script stops
# launching cells, forwards the signal to the running steps (their cells are not recorded and
# rerun next time) and requeues the job. See docs/characterize.md.
#
#SBATCH --job-name=tessera-characterize
#SBATCH --nodes=1
#SBATCH --time=04:00:00
#SBATCH --signal=B:USR1@180
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=tessera-characterize-%j.log
#
# Parameters (environment variables, exported to the job by sbatch):
#   STUDY          the study JSON (required; its relative paths are from the job's directory)
#   OUT            the results directory (required; reused to resume)
#   TESSERA        the tessera binary (default: tessera on PATH)
#   PARALLEL       cells running at once (default: the job's nodes, SLURM_JOB_NUM_NODES)
#   STEP_ARGS      more srun options per cell step (default: "--exclusive -N1 -n1"; a GPU
#                  study adds e.g. "--gres=gpu:1"). Cells with tp x pp > 1 run the study's
#                  "launcher" (e.g. "mpirun -np {ranks}") inside their step's node.
#   MAX_REQUEUES   how often the job requeues itself at the time limit (default 10)
set -uo pipefail
: "${STUDY:?set STUDY to the study JSON}"
: "${OUT:?set OUT to the results directory}"
TESSERA=${TESSERA:-tessera}
PARALLEL=${PARALLEL:-${SLURM_JOB_NUM_NODES:-1}}
STEP_ARGS=${STEP_ARGS:-"--exclusive -N1 -n1"}
MAX_REQUEUES=${MAX_REQUEUES:-10}
[ "$(id -u)" = 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

stop=0
on_stop() {
    stop=$1
    echo "characterize.sh: $1: stopping the running cells"
    jobs -p | xargs -r kill -TERM 2>/dev/null
}
trap 'on_stop USR1' USR1
trap 'on_stop TERM' TERM

# The pending cells (done ones have records; skipped ones say why).
if ! LIST=$("$TESSERA" characterize --study "$STUDY" --out "$OUT" --list-cells); then
    echo "characterize.sh: cannot list the cells of $STUDY" >&2
    exit 2
fi
mapfile -t PENDING < <(awk -F'\t' '$2 == "pending" {print $1}' <<<"$LIST")
echo "characterize.sh: $(wc -l <<<"$LIST") cells, ${#PENDING[@]} pending, $PARALLEL at a time"

for id in "${PENDING[@]}"; do
    [ "$stop" = 0 ] || break
    while [ "$(jobs -pr | wc -l)" -ge "$PARALLEL" ]; do
        wait -n 2>/dev/null || true
        [ "$stop" = 0 ] || break 2
    done
    # shellcheck disable=SC2086
    srun $STEP_ARGS --job-name="cell:$id" \
        "$TESSERA" characterize --study "$STUDY" --out "$OUT" --cell "$id" --quiet &
done
# `wait` returns early on a trapped signal: wait again until every step is gone.
while [ -n "$(jobs -pr)" ]; do wait; done

if [ "$stop" != 0 ]; then
    n=${SLURM_RESTART_COUNT:-0}
    if [ "$stop" = USR1 ] && [ -n "${SLURM_JOB_ID:-}" ] && [ "$n" -lt "$MAX_REQUEUES" ]; then
        echo "characterize.sh: requeueing (restart $((n + 1)) of at most $MAX_REQUEUES)"
        scontrol requeue "$SLURM_JOB_ID"
    fi
    exit 3
fi
# Every cell has run: the outputs (a cell a step missed runs here).
exec "$TESSERA" characterize --study "$STUDY" --out "$OUT"
