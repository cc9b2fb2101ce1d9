#!/usr/bin/env bash
# Run berth's fuzz targets (every func FuzzXxx in a _test.go file of this module) for a
# bounded time each, one target per go test invocation as Go requires (docs/fuzzing.md).
#
#   scripts/fuzz.sh                       # every target for 20s (.ci/run gives 6s)
#   scripts/fuzz.sh 10m                   # every target for 10 minutes
#   scripts/fuzz.sh 10m 'ExtractTar$'     # the targets whose name matches a regexp
#   scripts/fuzz.sh 1m . -parallel 1      # further arguments go to go test
#
# Each target prints its last progress line (executions, new interesting inputs). A
# failure prints go test's output, including where the failing input was written
# (PKG/testdata/fuzz/FuzzXxx/...: commit it with the fix as a regression seed), and
# the script exits 1 after trying the other targets.
set -euo pipefail
cd "$(dirname "$0")/.."

duration=${1:-20s}
filter=${2:-.}
shift $(( $# < 2 ? $# : 2 ))

failed=0
out=$(mktemp)
trap 'rm -f "$out"' EXIT
while read -r file target; do
  [[ $target =~ $filter ]] || continue
  pkg=./$(dirname "$file")
  if go test -run '^$' -fuzz "^${target}\$" -fuzztime "$duration" "$@" "$pkg" >"$out" 2>&1; then
    printf '%-20s %-18s %s\n' "$target" "$pkg" "$(grep '^fuzz: elapsed' "$out" | tail -n 1 | sed 's/^fuzz: //')"
  elif ! grep -q 'Failing input written to' "$out" && grep -q '^    context deadline exceeded$' "$out" &&
    go test -count=1 -run "^${target}\$" "$pkg" >/dev/null 2>&1; then
    # Go 1.26's coordinator can miss its own -fuzztime deadline on a loaded machine and
    # report that as a failure with no input (go.dev/issue/75804, fixed in Go 1.27).
    printf '%-20s %-18s %s\n' "$target" "$pkg" "$(grep '^fuzz: elapsed' "$out" | tail -n 1 | sed 's/^fuzz: //') (ended by Go's deadline race, go.dev/issue/75804: no failing input, the corpus passes)"
  else
    echo "== $target ($pkg) failed:"
    cat "$out"
    failed=1
  fi
done < <(git grep -o '^func Fuzz[A-Za-z0-9_]*' -- '*_test.go' ':!examples' | sed 's/:func / /')
exit "$failed"
