#!/bin/bash
# characterize_tp2.sh TESSERA ROOT SCRATCH: a tp2 study cell (mpirun -np 2 under the
# study's launcher) whose ranks run out of memory under the cell's address-space limit is
# `oom`, with tessera's own line as its reason (not the launcher's help text, which comes
# before or after the ranks' lines), and the tokens it reached from one rank's heads.
# 77 (skipped) under ASan (it needs an unlimited address space).
set -u
source "$(dirname "$0")/../cli/common.sh"
if ldd "$BIN" 2>/dev/null | grep -q libasan; then
    echo "ASan build: no RLIMIT_AS cells"
    exit 77
fi
# 1 layer, 8 heads: the materialized matrix of a 12288-token prompt is 4 heads x 12288^2 x
# 4 B = 2.25 GiB per rank under tp2 (each rank has its own heads and its own limit), past
# the 1 GiB limit; 128 tokens fit. The report's arithmetic is one rank's.
cat >"$TMP/tp2.json" <<JSON
{"models": [{"label": "tiny", "path": "synthetic:tiny,ctx=131072,layers=1",
             "tokenizer": "$ROOT/models/tok512.bin"}],
 "policies": ["h2o-materialize"], "prompt_lengths": [128, 12288], "kv_budgets": [0.2],
 "layouts": ["tp2"], "gen_tokens": 2, "threads": 1,
 "launcher": "mpirun -np {ranks} --oversubscribe",
 "limits": {"memory": "1G", "time_s": 60}}
JSON
"$BIN" characterize --study "$TMP/tp2.json" --out "$TMP/out" 2>"$TMP/err" ||
    fail "study: exit $? ($(tail -1 "$TMP/err"))"
python3 - "$TMP/out/cells.csv" <<'PY' || fail "tp2 cells: $(cat "$TMP"/out/work/*12288*/stderr.txt)"
import csv, sys
rows = {r["prompt_tokens"]: r for r in csv.DictReader(open(sys.argv[1]))}
assert rows["128"]["status"] == "ok", (rows["128"]["status"], rows["128"]["reason"])
r = rows["12288"]
assert r["status"] == "oom", (r["status"], r["reason"])
assert r["reason"].startswith("tessera: rank ") and "score matrix" in r["reason"], r["reason"]
assert "MPI" not in r["reason"] and "----" not in r["reason"], r["reason"]
assert r["reached_tokens"] == "12288", r["reached_tokens"]
PY
grep -q "| tiny | h2o-materialize | 12288 | 1 | 4 | 2304.0 MiB | 1024 MiB | out of memory | oom |" \
    "$TMP/out/report.md" || fail "report: the n x n arithmetic row: $(grep '| tiny |' "$TMP/out/report.md")"
[ "$fails" = 0 ] && echo "characterize_tp2: ok"
exit $((fails > 0))
