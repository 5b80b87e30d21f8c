#!/usr/bin/env bash
# Passes `go test -v` output through and ends with a count of top-level
# tests, failing when go test failed or ran no test at all.
set -uo pipefail
tier=${1:-tests}
pass=0 fail=0 skip=0 status=0
while IFS= read -r line; do
  printf '%s\n' "$line"
  case "$line" in
    "--- PASS: "*) pass=$((pass + 1)) ;;
    "--- FAIL: "*) fail=$((fail + 1)) ;;
    "--- SKIP: "*) skip=$((skip + 1)) ;;
    FAIL*|"panic: "*) status=1 ;;
  esac
done
echo "$tier: $pass passed, $fail failed, $skip skipped"
if [ "$status" != 0 ] || [ "$fail" != 0 ]; then exit 1; fi
if [ "$skip" != 0 ]; then echo "$tier: a skipped test is a failure in this tier" >&2; exit 1; fi
if [ "$pass" = 0 ]; then echo "$tier: no test ran" >&2; exit 1; fi
