#!/usr/bin/env bash
# Passes `go test -v` output through and ends with a count of top-level
# tests, failing when go test failed or ran no test at all.
set -uo pipefail
tier=${1:-tests}
pass=0 fail=0 skip=0 status=0 timedout=0 unfinished=""
while IFS= read -r line; do
  printf '%s\n' "$line"
  case "$line" in
    "--- PASS: "*) pass=$((pass + 1)) ;;
    "--- FAIL: "*) fail=$((fail + 1)) ;;
    "--- SKIP: "*) skip=$((skip + 1)) ;;
    "panic: test timed out"*) status=1 timedout=1 ;;
    FAIL*|"panic: "*) status=1 ;;
    # go test lists the tests still running below its timeout's panic;
    # each counts as failed.
    $'\t\t'Test*) if [ "$timedout" = 1 ]; then fail=$((fail + 1)) unfinished="$unfinished ${line#$'\t\t'}"; fi ;;
    "") timedout=0 ;;
  esac
done
echo "$tier: $pass passed, $fail failed, $skip skipped"
if [ -n "$unfinished" ]; then echo "$tier: go test's timeout ended the tier; still running then:$unfinished"; fi
if [ "$status" != 0 ] || [ "$fail" != 0 ]; then exit 1; fi
if [ "$skip" != 0 ]; then echo "$tier: a skipped test is a failure in this tier" >&2; exit 1; fi
if [ "$pass" = 0 ]; then echo "$tier: no test ran" >&2; exit 1; fi
