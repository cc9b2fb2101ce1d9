#!/usr/bin/env bash
# Regenerate the wrapper module scripts/k8s/wrap (go.mod, go.sum) for Kubernetes VERSION:
#
#   scripts/k8s/genwrap.sh v1.37.2
#
# `go install k8s.io/kubernetes/cmd/...@VERSION` refuses to build: k8s.io/kubernetes's
# go.mod replaces each of its staging modules (k8s.io/api, k8s.io/client-go, ...) with
# ./staging/src/..., and replace directives of a dependency do not apply. The wrapper
# requires k8s.io/kubernetes VERSION and replaces each module that go.mod replaces
# with its published version v0.MINOR.PATCH, so scripts/kubernetes.sh builds the five
# binaries with one `go build` in it. The module proxy resolves only exact versions.
set -euo pipefail
V=${1:?usage: $0 vX.Y.Z (a Kubernetes release)}
cd "$(dirname "$0")/wrap"
mod=$(go mod download -json "k8s.io/kubernetes@$V" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
[ -f "$mod" ] || { echo "genwrap: no go.mod of k8s.io/kubernetes@$V from the module proxy" >&2; exit 1; }
staging=v0.${V#v1.}
{
  printf 'module k8swrap\n\ngo 1.26.0\n\ngodebug default=go1.26\n\nrequire k8s.io/kubernetes %s\n\nreplace (\n' "$V"
  # Not the sample modules, which are not published.
  sed -n '/^replace (/,/^)/p' "$mod" | awk -v v="$staging" '/=>/ && $1 !~ /sample-c/ { print "\t" $1 " => " $1 " " v }'
  echo ')'
} >go.mod
rm -f go.sum
for c in kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl; do
  GOFLAGS=-mod=mod go get "k8s.io/kubernetes/cmd/$c@$V"
done
echo "genwrap: scripts/k8s/wrap now builds Kubernetes $V; scripts/kubernetes.sh checks the version with BERTH_K8S_VERSION=$V" >&2
