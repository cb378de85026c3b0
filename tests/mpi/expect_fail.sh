#!/bin/bash
# expect_fail.sh PATTERN COUNT -- command...: the command must exit non-zero, and its output
# must hold PATTERN (a grep -E regex) on exactly COUNT lines (0: any number >= 1).
pattern=$1 count=$2
shift 3
out=$("$@" 2>&1)
rc=$?
echo "$out"
if [ "$rc" -eq 0 ]; then echo "expect_fail: exit status 0, expected a failure"; exit 1; fi
n=$(printf '%s\n' "$out" | grep -cE -- "$pattern")
if [ "$n" -lt 1 ] || { [ "$count" -gt 0 ] && [ "$n" -ne "$count" ]; }; then
    echo "expect_fail: /$pattern/ on $n lines, expected ${count/#0/at least 1}"; exit 1
fi
echo "expect_fail: exit status $rc, /$pattern/ on $n line(s): ok"
