#!/usr/bin/env bash
# Start the container runtimes that berth's docker and containerd tests use: Debian's
# containerd 1.6, a containerd 2.x built from its Go module, and dockerd, each on
# private sockets and directories, for development and CI.
#
#   sudo scripts/runtimes.sh              # start (or reuse) them; prints export lines
#   eval "$(sudo scripts/runtimes.sh)"    # ... and use them in this shell
#   sudo scripts/runtimes.sh stop         # stop what this script started
#
# As root on Debian it installs docker.io, containerd, runc, busybox-static and
# docker-registry (for pull tests) when they are missing. Everything lives under $BERTH_RUNTIMES_DIR (default /tmp/berth-runtimes):
#
#   containerd.sock  containerd2.sock  dockerd.sock   the sockets
#   containerd/{root,state}  containerd2/{root,state}  docker/{data,exec}
#                                          the daemons' directories
#   containerd.log   containerd2.log   dockerd.log    the daemons' logs
#   containerd.pid   containerd2.pid   dockerd.pid    their pids
#   containerd2-bin/                       containerd 2.x and its runc shim
#   runsc-bin/                             gVisor's runsc and runsc-berth, its wrapper
#   env                                    the export lines below, for `. DIR/env`
#
# containerd 2.x (version $BERTH_CONTAINERD2_VERSION, default v2.4.2) is built with
# `go install` (CGO disabled, tags no_btrfs no_devmapper no_zfs; about 3 minutes, once)
# into containerd2-bin when its binaries are missing or of another version; it runs
# with that directory first on its PATH, so it starts its own shim (which uses the
# host's runc). Its exports: CONTAINERD2_ADDRESS.
#
# gVisor's runsc (version $BERTH_RUNSC_VERSION, a pseudo-version of the gvisor.dev/gvisor
# module's go branch, which the module proxy serves only at an explicit version) is
# built with `go install` into runsc-bin when it is missing or of another version
# (about 2 minutes, once; the version is kept in runsc-bin/VERSION), beside
# runsc-berth, a wrapper that runs it with the flags berth's sandboxes need
# (docs/gvisor.md): --host-uds=create (the host reaches the agent's socket; never
# "open"), --overlay2=none (a stopped sandbox keeps its files), --platform=systrap
# (no KVM needed) and --network=none (a loopback only). dockerd gets runsc as runtime
# "runsc" (daemon.json's "runtimes", with those flags but --network=none as
# runtimeArgs, so that docker's own network modes apply); containerd 2.x needs no
# registration: berth's containerd driver runs runsc-berth through the runc shim
# (driver "containerd" { runtimes = { runsc = "DIR/runsc-bin/runsc-berth" } }).
# BERTH_RUNSC_VERSION=none skips all of it. Its export: BERTH_RUNSC (runsc-berth's path). A
# dockerd that is already running keeps the runtimes it started with: `scripts/
# runtimes.sh stop` and a new run give it runsc.
#
# Nothing host-wide is changed for the tests' sake: dockerd runs with --bridge=none
# (no docker0), --iptables=false and --ip-masq=false (no firewall or NAT rules) and
# --ip-forward=false (its default would turn net.ipv4.ip_forward on for the whole host;
# berth's test sandboxes use network "none" and need no forwarding), and dockerd 20.10
# keeps its trust key in $DIR/docker/key.json instead of creating /etc/docker/key.json.
# Both containerds run without the CRI plugin (berth does not use it; in 1.6 it would
# listen on a TCP port of 127.0.0.1 and look for CNI in /etc/cni). What is left is what
# running containers at all needs: the kernel's overlay module (loaded on demand by
# the overlay snapshotter / storage driver, if it is not already), cgroups for the
# containers, runc's state under /run/containerd/runc, and on a host with AppArmor
# dockerd's loading of its docker-default profile. A second run reuses daemons that
# answer. BERTH_BUILD_NICE (default 0) is the niceness of the two builds, never of the
# daemons. When a daemon does not come up within BERTH_RUNTIMES_TIMEOUT seconds (default
# 60) its log is printed to stderr and the script exits 1. Only the export lines go to
# stdout; progress goes to stderr.
set -euo pipefail

DIR=${BERTH_RUNTIMES_DIR:-/tmp/berth-runtimes}
# The niceness of the go install builds only (not of the daemons): .ci/run gives 10 so
# that they yield to the Kubernetes build beside them.
BUILD_NICE=${BERTH_BUILD_NICE:-0}
TIMEOUT=${BERTH_RUNTIMES_TIMEOUT:-60}
CSOCK=$DIR/containerd.sock
C2SOCK=$DIR/containerd2.sock
C2BIN=$DIR/containerd2-bin
C2VERSION=${BERTH_CONTAINERD2_VERSION:-v2.4.2}
RUNSC_BIN=$DIR/runsc-bin
RUNSC_VERSION=${BERTH_RUNSC_VERSION:-v0.0.0-20260905035102-160fafc42237}
DSOCK=$DIR/dockerd.sock

say() { printf 'runtimes: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

alive() { # pidfile
  [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null
}

stop_one() { # name
  local pf=$DIR/$1.pid
  if alive "$pf"; then
    local pid; pid=$(cat "$pf")
    say "stopping $1 (pid $pid)"
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$pf"
}

if [ "${1:-}" = stop ]; then
  stop_one dockerd
  stop_one containerd
  stop_one containerd2
  # runsc leaves an nsfs mount, null-netns, in each state root it used (under dockerd's
  # exec root, and /run/containerd/runsc/NAMESPACE for containerd 2.x) after its
  # sandboxes are gone; with the daemons stopped nothing uses them.
  while read -r _ mnt fstype _; do
    case $mnt in
      "$DIR"/*/null-netns | /run/containerd/runsc/*/null-netns)
        [ "$fstype" = nsfs ] && umount "$mnt" 2>/dev/null && say "unmounted $mnt" ;;
    esac
  done </proc/mounts
  exit 0
fi
[ $# -eq 0 ] || die "usage: $0 [stop]"

# --- packages -------------------------------------------------------------------
missing=()
command -v dockerd >/dev/null || missing+=(docker.io)
command -v containerd >/dev/null || missing+=(containerd)
command -v runc >/dev/null || missing+=(runc)
# Pull tests run their own registry processes on 127.0.0.1 (internal/testsupport/testregistry).
command -v docker-registry >/dev/null || missing+=(docker-registry)
# The test images are built from a static busybox; Debian's busybox-static puts it at
# /bin/busybox (the plain busybox package's is dynamic and will not do).
if command -v dpkg-query >/dev/null; then
  [[ $(dpkg-query -W -f '${Status}' busybox-static 2>/dev/null) == *'ok installed'* ]] || missing+=(busybox-static)
elif [ ! -x /bin/busybox ]; then
  missing+=(busybox-static)
fi
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    die "missing ${missing[*]}: install them (Debian: apt-get install -y ${missing[*]}) or run this script as root on Debian"
  fi
  say "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi
[ "$(id -u)" = 0 ] || die "containerd and dockerd need root: run sudo $0"

mkdir -p "$DIR"/containerd/root "$DIR"/containerd/state "$DIR"/containerd2/root "$DIR"/containerd2/state \
  "$DIR"/docker/data "$DIR"/docker/exec
chmod 711 "$DIR"

wait_for() { # name check-command...
  local name=$1; shift
  local deadline=$((SECONDS + TIMEOUT))
  until "$@" >/dev/null 2>&1; do
    if [ $SECONDS -ge $deadline ] || ! alive "$DIR/$name.pid"; then
      say "$name did not come up within ${TIMEOUT}s (or exited); its log ($DIR/$name.log):"
      tail -n 100 "$DIR/$name.log" >&2 || true
      exit 1
    fi
    sleep 0.2
  done
}

# --- containerd -------------------------------------------------------------------
if alive "$DIR/containerd.pid" && ctr --address "$CSOCK" version >/dev/null 2>&1; then
  say "containerd already running (pid $(cat "$DIR/containerd.pid"))"
else
  stop_one containerd
  rm -f "$CSOCK"
  say "starting containerd on $CSOCK"
  # A config of its own so that the host's /etc/containerd/config.toml (if any) does not
  # apply; the grpc socket, root and state come from the flags.
  # No CRI: berth does not use it (its stream server would listen on 127.0.0.1).
  printf 'version = 2\ndisabled_plugins = ["io.containerd.grpc.v1.cri"]\n' >"$DIR/containerd.toml"
  setsid containerd --config "$DIR/containerd.toml" --address "$CSOCK" \
    --root "$DIR/containerd/root" --state "$DIR/containerd/state" \
    </dev/null >>"$DIR/containerd.log" 2>&1 &
  echo $! >"$DIR/containerd.pid"
  wait_for containerd ctr --address "$CSOCK" version
  say "containerd up"
fi

# --- containerd 2.x, built from its Go module ------------------------------------------
c2_built() {
  [ -x "$C2BIN/containerd" ] && [ -x "$C2BIN/containerd-shim-runc-v2" ] &&
    [[ $("$C2BIN/containerd" --version 2>/dev/null) == *" ${C2VERSION#v}"* ]]
}
if ! c2_built; then
  if ! command -v go >/dev/null; then
    for g in /usr/local/go/bin /usr/lib/go/bin; do [ -x "$g/go" ] && PATH=$PATH:$g; done
  fi
  command -v go >/dev/null || die "building containerd $C2VERSION needs Go (https://go.dev/dl/) on PATH"
  say "building containerd $C2VERSION into $C2BIN (go install, about 3 minutes)"
  mkdir -p "$C2BIN"
  (cd "$DIR" && GOBIN=$C2BIN CGO_ENABLED=0 GOFLAGS= nice -n "$BUILD_NICE" go install -tags "no_btrfs no_devmapper no_zfs" \
    "github.com/containerd/containerd/v2/cmd/containerd@$C2VERSION" \
    "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@$C2VERSION") >&2 ||
    die "go install of containerd $C2VERSION failed (output above)"
  c2_built || die "$C2BIN/containerd is not version $C2VERSION after the build"
fi
if alive "$DIR/containerd2.pid" && ctr --address "$C2SOCK" version >/dev/null 2>&1; then
  say "containerd 2 already running (pid $(cat "$DIR/containerd2.pid"))"
else
  stop_one containerd2
  rm -f "$C2SOCK"
  say "starting containerd $C2VERSION on $C2SOCK"
  # Its own config: no CRI (berth does not use it, and it would look for CNI).
  cat >"$DIR/containerd2.toml" <<'TOML'
version = 3
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime", "io.containerd.cri.v1.images", "io.containerd.podsandbox.controller.v1.podsandbox", "io.containerd.sandbox.controller.v1.shim"]
TOML
  PATH=$C2BIN:$PATH setsid "$C2BIN/containerd" --config "$DIR/containerd2.toml" --address "$C2SOCK" \
    --root "$DIR/containerd2/root" --state "$DIR/containerd2/state" \
    </dev/null >>"$DIR/containerd2.log" 2>&1 &
  echo $! >"$DIR/containerd2.pid"
  wait_for containerd2 ctr --address "$C2SOCK" version
  say "containerd 2 up: $("$C2BIN/containerd" --version)"
fi

# --- gVisor's runsc, built from its Go module ----------------------------------------
if [ "$RUNSC_VERSION" != none ]; then
  if [ ! -x "$RUNSC_BIN/runsc" ] || [ "$(cat "$RUNSC_BIN/VERSION" 2>/dev/null)" != "$RUNSC_VERSION" ]; then
    command -v go >/dev/null || die "building runsc $RUNSC_VERSION needs Go (https://go.dev/dl/) on PATH"
    say "building gVisor's runsc $RUNSC_VERSION into $RUNSC_BIN (go install, about 2 minutes)"
    mkdir -p "$RUNSC_BIN"
    rm -f "$RUNSC_BIN/VERSION"
    (cd "$DIR" && GOBIN=$RUNSC_BIN CGO_ENABLED=0 GOFLAGS= nice -n "$BUILD_NICE" go install "gvisor.dev/gvisor/runsc@$RUNSC_VERSION") >&2 ||
      die "go install of runsc $RUNSC_VERSION failed (output above)"
    echo "$RUNSC_VERSION" >"$RUNSC_BIN/VERSION"
  fi
  # Written anew each run (then renamed into place), so a flag change takes effect.
  printf '#!/bin/sh\n# gVisor runsc with the flags berth needs (docs/gvisor.md); written by scripts/runtimes.sh.\nexec "%s" --host-uds=create --overlay2=none --platform=systrap --network=none "$@"\n' \
    "$RUNSC_BIN/runsc" >"$RUNSC_BIN/runsc-berth.new"
  chmod 755 "$RUNSC_BIN/runsc-berth.new"
  mv "$RUNSC_BIN/runsc-berth.new" "$RUNSC_BIN/runsc-berth"
fi

# --- dockerd ----------------------------------------------------------------------
if alive "$DIR/dockerd.pid" && docker -H "unix://$DSOCK" version >/dev/null 2>&1; then
  say "dockerd already running (pid $(cat "$DIR/dockerd.pid"))"
else
  stop_one dockerd
  rm -f "$DSOCK"
  say "starting dockerd on $DSOCK"
  # Not the host's /etc/docker/daemon.json. dockerd before 23.0 makes a trust key and
  # writes it to /etc/docker/key.json unless deprecated-key-path says where (23.0 and
  # later make none, and refuse the setting).
  # runsc as runtime "runsc", when built (see above).
  runtimes=
  if [ "$RUNSC_VERSION" != none ]; then
    runtimes=$(printf '"runtimes": {"runsc": {"path": "%s", "runtimeArgs": ["--host-uds=create", "--overlay2=none", "--platform=systrap"]}}' "$RUNSC_BIN/runsc")
  fi
  if [ "$(dockerd --version | sed -nE 's/^Docker version ([0-9]+)\..*/\1/p')" -lt 23 ] 2>/dev/null; then
    printf '{"deprecated-key-path": "%s"%s}\n' "$DIR/docker/key.json" "${runtimes:+, $runtimes}" >"$DIR/daemon.json"
  else
    printf '{%s}\n' "$runtimes" >"$DIR/daemon.json"
  fi
  # --pidfile is dockerd's own lock file; ours ($DIR/dockerd.pid) is written by us.
  setsid dockerd -H "unix://$DSOCK" --containerd "$CSOCK" \
    --data-root "$DIR/docker/data" --exec-root "$DIR/docker/exec" \
    --pidfile "$DIR/docker/dockerd.pid" \
    --bridge=none --iptables=false --ip-masq=false --ip-forward=false \
    --config-file "$DIR/daemon.json" \
    </dev/null >>"$DIR/dockerd.log" 2>&1 &
  echo $! >"$DIR/dockerd.pid"
  wait_for dockerd docker -H "unix://$DSOCK" version
  say "dockerd up: $(docker -H "unix://$DSOCK" version --format 'Engine {{.Server.Version}}, API {{.Server.APIVersion}}')"
fi

{
  echo "export DOCKER_HOST=unix://$DSOCK"
  echo "export CONTAINERD_ADDRESS=$CSOCK"
  echo "export CONTAINERD2_ADDRESS=$C2SOCK"
  if [ "$RUNSC_VERSION" != none ]; then echo "export BERTH_RUNSC=$RUNSC_BIN/runsc-berth"; fi
} >"$DIR/env"
cat "$DIR/env"
