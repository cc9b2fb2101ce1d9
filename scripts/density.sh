#!/usr/bin/env bash
# Measure what idle sandboxes cost on this machine (docs/performance.md, "Density"):
# builds the static berth-cli (the agent) and internal/testsupport/density/cmd/density, then
# creates N idle sandboxes through DRIVER beside a probe sandbox, prints per-sandbox
# agent/shim/cgroup figures and the probe's warm exec p50/p95 with 0 and N beside it,
# and removes everything it made (also on Ctrl-C). Run as root on the runtime's host.
#
#   scripts/density.sh docker 100
#   scripts/density.sh containerd 1000 -parallel 4 -json   # further flags: go run ... -h
#
# DOCKER_HOST / CONTAINERD_ADDRESS name the daemons; AGENT=berth-agent measures the
# stand-alone agent (cmd/berth-agent) instead of berth-cli, the default agent. It stops adding sandboxes when the
# host's threads reach 28000 or MemAvailable falls below 4 GiB, and says so.
set -euo pipefail
cd "$(dirname "$0")/.."
driver=${1:?usage: scripts/density.sh docker|containerd N [flags]}
n=${2:?usage: scripts/density.sh docker|containerd N [flags]}
shift 2
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
agent=${AGENT:-berth-cli}
case $agent in
  berth | berth-cli) agent=berth-cli ;; # berth is the thin front, not an agent
  berth-agent) ;;
  *) echo "AGENT must be berth-cli or berth-agent" >&2; exit 2 ;;
esac
CGO_ENABLED=0 go build -o "$bin/$agent" "./cmd/$agent"
go build -o "$bin/density" ./internal/testsupport/density/cmd/density
"$bin/density" -driver "$driver" -n "$n" -agent "$bin/$agent" "$@"
