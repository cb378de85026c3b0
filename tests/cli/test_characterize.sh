#!/usr/bin/env bash
# tessera characterize: a tiny study end to end (CSV figures present and in range, summary,
# report, plots when gnuplot is installed), failing cells recorded as such while the study
# goes on (the n x n baseline out of memory under the cell's limit; a time limit), resume
# (a rerun skips finished cells, a half-written record reruns), --list-cells / --cell,
# malformed studies (one line naming the file and the key, exit 2), and, when this build
# has `tessera fidelity`, the paged cell's fidelity against itself (agreement 1, KL 0).
source "$(dirname "$0")/common.sh"
cd "$ROOT" || exit 1
TOK=$ROOT/models/tok512.bin
TINY="synthetic:tiny,ctx=131072,layers=1"
HAVE_FID=0
"$BIN" fidelity --help >/dev/null 2>&1 && HAVE_FID=1
# ASan reserves terabytes of address space: no RLIMIT_AS cells under it (test_memlimit too)
MEM='"2G"'
ASAN=0
if ldd "$BIN" 2>/dev/null | grep -q libasan; then
    ASAN=1
    MEM=0
fi

# 1. A tiny study: the bundled model and a synthetic one, three policies.
FID=""
[ $HAVE_FID = 1 ] && FID=', "fidelity": {"text": "'$ROOT'/bench/data/heldout.txt", "probe_length": 256}'
cat >"$TMP/small.json" <<EOF
{"name": "tiny-study",
 "models": [{"label": "s260k", "path": "$MODEL", "tokenizer": "$TOK"},
            {"label": "tiny", "path": "$TINY", "tokenizer": "$TOK"}],
 "policies": ["paged", "h2o", "offload"],
 "prompt_lengths": [64, 200, 600], "batch_sizes": [2], "kv_budgets": [0.5],
 "gen_tokens": 4, "threads": 1, "limits": {"memory": $MEM, "time_s": 120}$FID}
EOF
OUT=$TMP/out
"$BIN" characterize --study "$TMP/small.json" --out "$OUT" 2>"$TMP/err1" ||
    fail "small study: exit $? ($(tail -1 "$TMP/err1"))"
grep -q "tessera characterize: \[1/" "$TMP/err1" || fail "no progress lines on stderr"
grep -q "ETA" "$TMP/err1" || fail "no ETA in the progress"
for f in cells.csv summary.json report.md; do
    [ -s "$OUT/$f" ] || fail "no $f"
done
if command -v gnuplot >/dev/null; then
    ls "$OUT"/memory_vs_prompt_*.png >/dev/null 2>&1 || fail "no memory plot with gnuplot installed"
fi
python3 - "$OUT" "$HAVE_FID" <<'PY' || fail "cells.csv figures"
import csv, json, math, sys
out, have_fid = sys.argv[1], sys.argv[2] == "1"
rows = list(csv.DictReader(open(out + "/cells.csv")))
def f(r, k):
    return float(r[k]) if r[k] != "" else None
perf = [r for r in rows if r["kind"] == "perf"]
# 2 models x (paged + h2o + offload) x 3 lengths; s260k's context (512) skips 600
assert len(perf) == 18, len(perf)
skipped = [r for r in perf if r["status"] == "skipped"]
assert len(skipped) == 3 and all(r["model"] == "s260k" and r["prompt_tokens"] == "600"
                                 and "context" in r["reason"] for r in skipped), skipped
ok = [r for r in perf if r["status"] == "ok"]
assert len(ok) == 15, [(r["id"], r["status"], r["reason"]) for r in perf]
for r in ok:
    for lat in ("ttft", "tpot", "e2e", "itl"):
        p = [f(r, "%s_%s_s" % (lat, q)) for q in ("p50", "p90", "p99")]
        if lat == "itl" and p[0] is None:
            continue  # before tessera run reports inter-token latency
        assert all(x is not None and 0 < x < 60 for x in p), (r["id"], lat, p)
        assert p[0] <= p[1] + 1e-12 <= p[2] + 2e-12, (r["id"], lat, p)
    assert f(r, "ttft_p50_s") <= f(r, "e2e_p99_s") + 1e-9, r["id"]
    for k in ("input_tok_s", "output_tok_s", "peak_host_bytes", "kv_peak_bytes", "wall_s"):
        assert f(r, k) is not None and f(r, k) > 0, (r["id"], k, r[k])
    assert 1e6 < f(r, "peak_host_bytes") < 2 * 2**30, (r["id"], r["peak_host_bytes"])
    for k in ("evictions", "bytes_moved", "preemptions", "peak_device_bytes"):
        assert f(r, k) is not None and f(r, k) >= 0, (r["id"], k)
    assert f(r, "prompt_tokens_actual") == f(r, "prompt_tokens"), (r["id"], r["prompt_tokens_actual"])
    assert f(r, "requests_ok") == 2 and f(r, "requests_failed") == 0, r["id"]
    assert 0 < f(r, "completion_tokens") <= 8, r["id"]
    assert f(r, "nxn_bytes") == 8 * f(r, "prompt_tokens") ** 2 * 4, r["id"]
    if r["kv_policy"] == "paged":
        assert f(r, "evictions") == 0 and f(r, "budget") == 0, r["id"]
    if r["kv_policy"] == "offload" and f(r, "prompt_tokens") >= 200:
        assert f(r, "bytes_moved") > 0, r["id"]
fid = [r for r in rows if r["kind"] == "fidelity"]
if have_fid:
    assert len(fid) == 6, len(fid)
    for r in fid:
        assert r["status"] == "ok", (r["id"], r["reason"])
        ag, kl = f(r, "fid_agreement"), f(r, "fid_kl")
        assert ag is not None and 0 <= ag <= 1, (r["id"], ag)
        assert kl is not None and kl >= -1e-9, (r["id"], kl)
        for k in ("fid_ppl", "fid_ppl_full"):
            assert f(r, k) is None or f(r, k) >= 1, (r["id"], k)
        for k in ("fid_probe_text_recall", "fid_probe_attention_recall"):
            assert f(r, k) is None or 0 <= f(r, k) <= 1, (r["id"], k)
        if r["kv_policy"] == "paged":
            # the full cache against itself is exact
            assert ag == 1 and abs(kl) < 1e-9, (r["id"], ag, kl)
else:
    assert not fid, "fidelity cells without a fidelity section"
s = json.load(open(out + "/summary.json"))
assert s["cells"] == len(rows) and s["status_counts"]["ok"] == len(ok) + (6 if have_fid else 0), s["status_counts"]
assert len(s["findings"]) == 4 and all(x["verdict"] for x in s["findings"])
rep = open(out + "/report.md").read()
assert "n x n" in rep and "heads x n^2 x 4" in rep and "| vLLM (the full cache) is the fastest" in rep
assert "their vLLM is the full cache (paged)" in rep and "their H2O is eviction by" in rep, rep[:2000]
PY
[ $HAVE_FID = 1 ] || echo "NOTE: this build has no 'tessera fidelity': the fidelity checks (paged against itself: agreement 1, KL 0) were skipped"

# 2. Resume: a rerun runs nothing; a missing or half-written record reruns that cell only.
stat -c %Y "$OUT/cells/s260k_tp1_h2o_k0.5_n64_b2_roffline.json" >"$TMP/mtime"
sleep 1
"$BIN" characterize --study "$TMP/small.json" --out "$OUT" 2>"$TMP/err2" || fail "rerun: exit $?"
grep -q "0 to run" "$TMP/err2" || fail "rerun ran cells: $(head -1 "$TMP/err2")"
[ "$(stat -c %Y "$OUT/cells/s260k_tp1_h2o_k0.5_n64_b2_roffline.json")" = "$(cat "$TMP/mtime")" ] ||
    fail "rerun rewrote a finished cell"
rm "$OUT/cells/tiny_tp1_paged_k0_n200_b2_roffline.json"
head -c 40 "$OUT/cells/tiny_tp1_h2o_k0.5_n64_b2_roffline.json" >"$TMP/half"
mv "$TMP/half" "$OUT/cells/tiny_tp1_h2o_k0.5_n64_b2_roffline.json"
"$BIN" characterize --study "$TMP/small.json" --out "$OUT" 2>"$TMP/err3" || fail "resume: exit $?"
grep -q "2 to run" "$TMP/err3" || fail "resume: $(head -1 "$TMP/err3")"
[ "$(grep -c ': ok in' "$TMP/err3")" = 2 ] || fail "resume did not rerun the two cells"
"$BIN" characterize --study "$TMP/small.json" --out "$OUT" --list-cells >"$TMP/list"
[ "$(grep -v '^fidelity_' "$TMP/list" | grep -c $'\tdone')" = 15 ] ||
    fail "--list-cells: $(grep -vc done "$TMP/list") not done"
grep -q $'s260k_tp1_paged_k0_n600_b2_roffline\tskipped: prompt 600' "$TMP/list" || fail "--list-cells skip reason"

# 3. Failing cells: the n x n baseline out of memory under the limit, the study goes on;
#    a time limit stops a cell; --cell runs one cell.
if [ $ASAN = 1 ]; then
    echo "NOTE: ASan build: the out-of-memory cell under RLIMIT_AS was skipped (ASan needs an unlimited address space)"
else
cat >"$TMP/fail.json" <<EOF
{"models": [{"label": "tiny", "path": "$TINY", "tokenizer": "$TOK"}],
 "policies": ["h2o-materialize"], "prompt_lengths": [128, 8192, 256],
 "kv_budgets": [0.2], "gen_tokens": 2, "threads": 1,
 "limits": {"memory": "1G", "time_s": 120}}
EOF
"$BIN" characterize --study "$TMP/fail.json" --out "$TMP/fail" 2>"$TMP/err4" || fail "failing study: exit $?"
python3 - "$TMP/fail/cells.csv" <<'PY' || fail "failing cells"
import csv, sys
rows = {r["prompt_tokens"]: r for r in csv.DictReader(open(sys.argv[1]))}
assert rows["128"]["status"] == "ok" and rows["256"]["status"] == "ok", rows
r = rows["8192"]
assert r["status"] == "oom", (r["status"], r["reason"])
assert "score matrix" in r["reason"], r["reason"]
assert float(r["nxn_bytes"]) == 8 * 8192**2 * 4 > float(r["mem_limit_bytes"]) == 2**30
PY
grep -q "| tiny | h2o-materialize | 8192 | 1 | 8 | 2048.0 MiB | 1024 MiB | out of memory | oom |" \
    "$TMP/fail/report.md" || fail "report: the n x n arithmetic row of the failed cell"
fi
cat >"$TMP/slow.json" <<EOF
{"models": [{"label": "tiny", "path": "$TINY", "tokenizer": "$TOK"}],
 "policies": ["paged"], "prompt_lengths": [128, 16384], "batch_sizes": [4], "gen_tokens": 64,
 "threads": 1, "limits": {"time_s": 1.5}}
EOF
"$BIN" characterize --study "$TMP/slow.json" --out "$TMP/slow" --cell tiny_tp1_paged_k0_n16384_b4_roffline \
    2>"$TMP/err5" || fail "--cell: exit $?"
[ -f "$TMP/slow/cells/tiny_tp1_paged_k0_n16384_b4_roffline.json" ] || fail "--cell wrote no record"
[ -f "$TMP/slow/cells/tiny_tp1_paged_k0_n128_b4_roffline.json" ] && fail "--cell ran another cell"
[ -f "$TMP/slow/cells.csv" ] && fail "--cell wrote the outputs"
grep -q '"status":[[:space:]]*"timeout"' "$TMP/slow/cells/tiny_tp1_paged_k0_n16384_b4_roffline.json" ||
    fail "time limit not recorded: $(tail -1 "$TMP/err5")"
# the rest of the study, and the outputs without gnuplot: one line, CSV and report still written
PATH=/nonexistent "$BIN" characterize --study "$TMP/slow.json" --out "$TMP/slow" 2>"$TMP/err6" ||
    fail "no-gnuplot run: exit $?"
grep -q "gnuplot is not installed" "$TMP/err6" || fail "no line about the missing gnuplot"
[ -s "$TMP/slow/cells.csv" ] && [ -s "$TMP/slow/report.md" ] || fail "no CSV/report without gnuplot"
grep -q "^tiny_tp1_paged_k0_n16384_b4_roffline,.*,timeout,time limit of 1.5 s," "$TMP/slow/cells.csv" ||
    fail "timeout row in the CSV"

# 5. Needle cells in the outputs: the study's needle keys (policy_lengths: the full cache
#    alone at 128 tokens; multi_lengths: three keys at 128 only; perf_budgets), then records
#    of the needle cells written here (as `tessera needle` cells leave them; the real model's
#    runs are test_fidelity_gguf's) and the outputs: the heat maps and the needle-vs-budget
#    plot, findings 2 and 3 judged from the needle figures.
cat >"$TMP/nd.json" <<EOF
{"name": "needle-outputs",
 "models": [{"label": "s260k", "path": "$MODEL", "tokenizer": "$TOK"}],
 "policies": ["paged", "h2o", "offload", {"label": "stream", "policy": "streaming"}],
 "prompt_lengths": [32], "kv_budgets": [0.2, 0.5], "perf_budgets": [0.5], "gen_tokens": 2,
 "threads": 1, "limits": {"memory": $MEM, "time_s": 120},
 "needle": {"haystack": "$ROOT/bench/data/heldout.txt", "lengths": [64, 128], "needles": [1, 3],
            "depths": "0,50,100", "multi_lengths": [128], "policy_lengths": [64]}}
EOF
ND=$TMP/nd
"$BIN" characterize --study "$TMP/nd.json" --out "$ND" --list-cells >"$TMP/ndlist" ||
    fail "needle study: --list-cells"
# 4 perf cells (one budget each); needle: paged at 64, 128 and 128 x 3, then 3 policies x
# 2 budgets x the same 3, those at 128 skipped
[ "$(grep -c '_n32_b1_roffline' "$TMP/ndlist")" = 4 ] || fail "perf_budgets: $(cat "$TMP/ndlist")"
[ "$(grep -c '^needle_' "$TMP/ndlist")" = 21 ] || fail "needle cells: $(grep -c '^needle_' "$TMP/ndlist")"
[ "$(grep -c 'skipped: needle at 128 tokens: the full cache only' "$TMP/ndlist")" = 12 ] ||
    fail "policy_lengths: $(grep skipped "$TMP/ndlist")"
mkdir -p "$ND/cells"
awk -F'\t' '$1 ~ /^needle_/ && $2 == "pending" {print $1}' "$TMP/ndlist" >"$TMP/ndids"
python3 - "$ND" "$TMP/ndids" <<'PY' || fail "needle records"
import json, sys
out, ids = sys.argv[1], open(sys.argv[2]).read().split()
marks = {"paged": "0:1/1 50:1/1 100:0/0", "offload": "0:1/1 50:1/1 100:0/-",
         "h2o": "0:1/0 50:1/1 100:0/0", "stream": "0:1/0 50:1/0 100:0/0"}
assert len(ids) == 9, ids
for cid in ids:
    _, model, pol, k, n, x = cid.split("_")
    rec = {"id": cid, "kind": "needle", "model": model, "policy": pol,
           "kv_policy": {"stream": "streaming"}.get(pol, pol), "budget": float(k[1:]),
           "prompt_tokens": int(n[1:]), "needles": int(x[1:]), "status": "ok", "reason": "",
           "needle_by_depth": marks[pol]}
    json.dump(rec, open("%s/cells/%s.json" % (out, cid), "w"))
PY
"$BIN" characterize --study "$TMP/nd.json" --out "$ND" 2>"$TMP/nderr" ||
    fail "needle study: exit $? ($(tail -1 "$TMP/nderr"))"
grep -q "4 to run" "$TMP/nderr" || fail "needle study: $(head -1 "$TMP/nderr")"
# the tiled policies' memory table reads the perf cells at their budget (perf_budgets' 0.5)
grep -q '^| s260k | h2o | 0.5 | 32 | 32 |' "$ND/report.md" ||
    fail "tiled memory table at the perf budget: $(grep -A8 '^Tiled policies' "$ND/report.md")"
if command -v gnuplot >/dev/null; then
    for f in needle_heatmap_s260k_x1.png needle_heatmap_s260k_x3.png needle_vs_budget_s260k.png; do
        [ -s "$ND/$f" ] || fail "no $f: $(grep gnuplot "$TMP/nderr")"
        grep -q "($f)" "$ND/report.md" || fail "the report does not show $f"
    done
    grep -q "gnuplot.*failed" "$TMP/nderr" && fail "a plot failed: $(grep gnuplot "$TMP/nderr")"
    # a box per point that ran: 7 rows x 3 depths at 64, the full cache's 3 at 128
    [ "$(wc -l <"$ND/plots/needle_heatmap_s260k_x1.dat")" = 24 ] ||
        fail "heat map points: $(cat "$ND/plots/needle_heatmap_s260k_x1.dat")"
fi
python3 - "$ND/summary.json" <<'PY' || fail "needle findings"
import json, sys
f = {x["id"]: x for x in json.load(open(sys.argv[1]))["findings"]}
m2, m3 = f["score_eviction_memory"]["measured"], f["host_tier_accuracy"]["measured"]
# h2o finds the key at 50 % only: 1 of the 2 keys the full cache found, per budget
assert "s260k h2o at budget 0.2: needle 1 of the 2 keys the full cache found" in m2, m2
assert "needle offload 1.00 vs h2o 0.50 (early keys 1.00 vs 0.00) (host tier best)" in m3, m3
assert "most accurate at 2 of 2 budgets" in m3, m3
PY
grep -q "^| s260k | 64 | 1 | 2 of 3 | 100 % |$" "$ND/report.md" || fail "report: the full cache's needle score"
grep -q "^| s260k | offload | 0.2 | - | - | - | 2 of 2 | - |$" "$ND/report.md" ||
    fail "report: the accuracy row: $(grep '^| s260k | offload' "$ND/report.md")"

# 4. Malformed studies: one line naming the file and the problem, exit 2.
bad() { # NAME JSON PATTERN
    printf '%s\n' "$2" >"$TMP/$1.json"
    "$BIN" characterize --study "$TMP/$1.json" --out "$TMP/bad" >"$TMP/bad.out" 2>"$TMP/bad.err"
    local rc=$?
    [ $rc = 2 ] || fail "$1: exit $rc, want 2"
    [ "$(wc -l <"$TMP/bad.err")" = 1 ] || fail "$1: $(wc -l <"$TMP/bad.err") lines: $(cat "$TMP/bad.err")"
    grep -q "$TMP/$1.json" "$TMP/bad.err" || fail "$1: the file is not named: $(cat "$TMP/bad.err")"
    grep -q -- "$3" "$TMP/bad.err" || fail "$1: want '$3' in: $(cat "$TMP/bad.err")"
}
bad notjson '{"models": ["m"], ' "not valid JSON"
bad nomodels '{"policies": ["paged"], "prompt_lengths": [8]}' "key 'models'"
bad badpolicy '{"models": ["'"$MODEL"'"], "policies": [3], "prompt_lengths": [8]}' "key 'policies\[0\]'"
bad nopolicy '{"models": ["'"$MODEL"'"], "policies": ["paged", "lru"], "prompt_lengths": [8]}' "key 'policies\[1\]': expected a registered policy (paged"
bad badlen '{"models": ["'"$MODEL"'"], "policies": ["paged"], "prompt_lengths": [8, -1]}' "key 'prompt_lengths\[1\]': expected an integer"
bad badrate '{"models": ["'"$MODEL"'"], "policies": ["paged"], "prompt_lengths": [8], "request_rates": ["fast"]}' "offline"
bad badmem '{"models": ["'"$MODEL"'"], "policies": ["paged"], "prompt_lengths": [8], "limits": {"memory": "lots"}}' "limits.memory"
bad unknown '{"models": ["'"$MODEL"'"], "policies": ["paged"], "prompt_lengths": [8], "budgets": [0.1]}' "key 'budgets'"
bad synth_notok '{"models": ["synthetic:tiny"], "policies": ["paged"], "prompt_lengths": [8]}' "tokenizer"
"$BIN" characterize --help | grep -q '"prompt_lengths"' || fail "--help does not document the study format"

exit $((fails > 0))
