#!/usr/bin/env bash
# Regenerates berth's gRPC wire code from its .proto files:
#   agent/internal/agentpb     (agent.proto, the exec agent's protocol)
#   backends/internal/driverpb (driver.proto, the driver plugin protocol)
# with protoc (Debian's protobuf-compiler) and the Go generators pinned below, which
# it installs into $(go env GOPATH)/bin when they are missing or another version.
#
#   scripts/generate.sh          rewrite the generated files in place
#   scripts/generate.sh --check  generate into a scratch copy and fail, showing the
#                                diff, when the committed files differ (CI runs this)
#
# The check ignores the generators' version lines in the headers ("// versions:"
# block): a machine with another protoc makes the same code.
set -euo pipefail
cd "$(dirname "$0")/.."

PROTOC_GEN_GO=v1.36.12       # google.golang.org/protobuf, as in go.mod
PROTOC_GEN_GO_GRPC=v1.6.2    # google.golang.org/grpc/cmd/protoc-gen-go-grpc
pkgs=(agent/internal/agentpb backends/internal/driverpb)

command -v protoc >/dev/null || { echo "generate.sh: protoc is missing: apt-get install protobuf-compiler libprotobuf-dev" >&2; exit 1; }
# The well-known types the .proto files import (google/protobuf/timestamp.proto) are
# Debian's libprotobuf-dev, not protobuf-compiler.
probe=$(mktemp -d)
printf 'syntax = "proto3";\nimport "google/protobuf/timestamp.proto";\n' > "$probe/probe.proto"
if ! (cd "$probe" && protoc --descriptor_set_out=/dev/null probe.proto 2>/dev/null); then
  rm -rf "$probe"
  echo "generate.sh: protoc does not find protobuf's well-known .proto files (google/protobuf/timestamp.proto): apt-get install libprotobuf-dev" >&2
  exit 1
fi
rm -rf "$probe"
bin=$(go env GOPATH)/bin
export PATH="$bin:$PATH"
have() { command -v "$1" >/dev/null && "$1" --version 2>&1 | grep -q -- "${2#v}"; }
have protoc-gen-go "$PROTOC_GEN_GO" || go install "google.golang.org/protobuf/cmd/protoc-gen-go@$PROTOC_GEN_GO"
have protoc-gen-go-grpc "$PROTOC_GEN_GO_GRPC" || go install "google.golang.org/grpc/cmd/protoc-gen-go-grpc@$PROTOC_GEN_GO_GRPC"

gen() { # gen DIR: runs protoc on every .proto in DIR, output beside it
  (cd "$1" && for p in *.proto; do
    protoc --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative "$p"
  done)
}

if [ "${1:-}" != --check ]; then
  for p in "${pkgs[@]}"; do gen "$p"; done
  exit 0
fi
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
rc=0
for p in "${pkgs[@]}"; do
  mkdir -p "$scratch/$p"
  cp "$p"/*.proto "$scratch/$p/"
  gen "$scratch/$p"
  for f in "$scratch/$p"/*.pb.go; do
    if ! diff -u -I '^// *-\? *protoc' "$p/$(basename "$f")" "$f"; then
      echo "generate.sh: $p/$(basename "$f") is not what $p/*.proto generates: run scripts/generate.sh and commit the result" >&2
      rc=1
    fi
  done
done
exit $rc
