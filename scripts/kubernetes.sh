#!/usr/bin/env bash
# Start a real single-node Kubernetes cluster for the kubernetes driver's tests, inside a
# network namespace of its own, for development and CI.
#
#   sudo scripts/kubernetes.sh              # start (or reuse) it; prints export lines
#   eval "$(sudo scripts/kubernetes.sh)"    # ... and use them in this shell
#   sudo scripts/kubernetes.sh env          # print the export lines of a running cluster
#   sudo scripts/kubernetes.sh stop         # stop what this script started
#   sudo scripts/kubernetes.sh build        # only build (or find) the cached binaries
#
# What it runs: kube-apiserver, kube-controller-manager, kube-scheduler, kubelet and
# kubectl $BERTH_K8S_VERSION (default v1.37.2), built from Go modules through the wrapper
# module scripts/k8s/wrap (one `go build`, CGO disabled, -trimpath, no inlining, the version stamped in
# with -ldflags), and etcd (scripts/k8s/etcdwrap, v3.7.3), built once and cached by version
# in $BERTH_K8S_CACHE/VERSION/bin (default /var/cache/berth-k8s; a cold build takes 15-30
# minutes on 2 loaded cores and needs ~5 GB of Go build and module cache, then ~500 MB
# of binaries stay); a private containerd (Debian's 1.6, with CRI, its own config, root,
# state and socket, apart from scripts/runtimes.sh's) and Debian's CNI bridge plugin.
#
# Everything listens only inside the network namespace $BERTH_K8S_NETNS (default
# berth-k8s), which this script creates: its loopback carries etcd (2379), the API server
# (127.0.0.1:6443) and the components' health ports, and the bridge k8sbr0 (10.233.0.1/24,
# the node IP and the kubelet's 10250) joins the Pods, with no gateway, NAT or forwarding:
# Pods reach each other and the node, nothing else. Processes are started with
# `nsenter --net=/run/netns/NAME` (not `ip netns exec`, which remounts /sys so that the
# kubelet finds no cgroup mounts); so must every client be: see internal/testsupport/k8stest.
#
# Nothing host-wide changes: no sysctl, no iptables rule (kubelet makeIPTablesUtilChains
# off, no kube-proxy, CNI without ipMasq/portmap), no address in the host's network. The
# kubelet runs in a mount namespace of its own where the three /proc/sys files it would
# rewrite (vm.overcommit_memory, kernel.panic, kernel.panic_on_oops) are bind-mounted from
# copies holding the values it wants; its root dir is bind-mounted onto itself and made
# rshared so that volume mounts propagate to containerd. Its cgroups live under
# /NETNS (/berth-k8s) in each cgroup v1 hierarchy (cgroupRoot), removed by stop; so two
# clusters with their own BERTH_K8S_DIR and BERTH_K8S_NETNS run side by side. This host is
# cgroup v1 without systemd and root lacks CAP_SYS_RESOURCE: failCgroupV1 false, the
# cgroupfs driver, oomScoreAdj 0, containerd oom_score 0 and CRI restrict_oom_score_adj.
#
# Storage: the StorageClass $BERTH_K8S_STORAGE_CLASS (default berth-hostpath) uses
# Kubernetes' own host-path provisioner (kube-controller-manager
# --enable-hostpath-provisioner, the one hack/local-up-cluster.sh uses): a claim gets a
# new directory /tmp/hostpath_pv/UUID (the path is fixed in Kubernetes, mode 0750, owned
# by root), and when the claim is deleted the volume is deleted with its directory
# (reclaimPolicy Delete), so claims come and go without end.
#
# Images (containerd's k8s.io namespace, for imagePullPolicy Never; no registry): the
# pause image registry.k8s.io/pause:3.10 (scripts/k8s/pause.c, built static with gcc),
# berth's busybox test image (internal/testsupport/testimage, from Debian's busybox-static) and the
# agent image that `berth image agent` builds from a static berth of this checkout.
#
# In the namespace $BERTH_K8S_NAMESPACE (default berth-test) it creates the ServiceAccount
# berth with the Role of docs/kubernetes-rbac.yaml and writes a kubeconfig for it; KUBECONFIG
# names that kubeconfig (what berth should use), BERTH_K8S_ADMIN_KUBECONFIG the admin's.
#
# State lives under $BERTH_K8S_DIR (default /tmp/berth-k8s): pki/, logs/*.log, run/*.pid,
# run/containerd.sock, etcd/, kubelet/, containerd/, cni/, images/, env. A second start
# reuses a cluster whose components are alive and whose node is Ready; stop ends the
# processes it recorded (by pid), removes the Pods' containers, the mounts under the
# state dir, the kubelet's cgroups and the network namespace, and keeps the state (etcd
# data, certificates) so that the next start finds the same cluster. When a component
# does not come up within BERTH_K8S_TIMEOUT seconds (default 180) its log is printed to
# stderr and the script exits 1. Only the export lines go to stdout.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
VERSION=${BERTH_K8S_VERSION:-v1.37.2}
ETCD_VERSION=v3.7.3 # scripts/k8s/etcdwrap/go.mod
CACHE=${BERTH_K8S_CACHE:-/var/cache/berth-k8s}
BIN=$CACHE/$VERSION/bin
DIR=${BERTH_K8S_DIR:-/tmp/berth-k8s}
NETNS=${BERTH_K8S_NETNS:-berth-k8s}
NS=${BERTH_K8S_NAMESPACE:-berth-test}
SC=${BERTH_K8S_STORAGE_CLASS:-berth-hostpath}
TIMEOUT=${BERTH_K8S_TIMEOUT:-180}
NODE=berth-node
NODE_IP=10.233.0.1
API=https://127.0.0.1:6443
CGROUP=$NETNS # one cgroup root per cluster
RUN=$DIR/run
PKI=$DIR/pki
LOGS=$DIR/logs
CSOCK=$RUN/containerd.sock
COMPONENTS=(kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl)

say() { printf 'kubernetes: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }
T0=$SECONDS
ts() { say "[$((SECONDS - T0))s] $*"; }

alive() { # name
  [ -f "$RUN/$1.pid" ] && kill -0 "$(cat "$RUN/$1.pid")" 2>/dev/null
}

stop_one() { # name
  local pf=$RUN/$1.pid
  if alive "$1"; then
    local pid; pid=$(cat "$pf")
    say "stopping $1 (pid $pid)"
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$pf"
}

innet() { nsenter --net=/run/netns/"$NETNS" -- "$@"; }
kubectl_admin() { innet "$BIN/kubectl" --kubeconfig "$PKI/admin.kubeconfig" "$@"; }

# The processes that run inside a Pod sandbox are the shims' children; containerd's
# k8s.io namespace lists them. Ends every task and removes every container and image
# snapshot reference of the private containerd (its images stay).
remove_containers() {
  [ -S "$CSOCK" ] && ctr --address "$CSOCK" version >/dev/null 2>&1 || return 0
  local c="ctr --address $CSOCK -n k8s.io" t
  for t in $($c tasks ls -q 2>/dev/null); do $c tasks kill -s SIGKILL "$t" >/dev/null 2>&1 || true; done
  for t in $($c tasks ls -q 2>/dev/null); do
    for _ in $(seq 1 100); do $c tasks delete -f "$t" >/dev/null 2>&1 && break; sleep 0.1; done
  done
  for t in $($c containers ls -q 2>/dev/null); do $c containers delete "$t" >/dev/null 2>&1 || true; done
}

# Unmounts, deepest first, every mount point under the state dir (the kubelet's volume
# mounts and its rshared root, CRI's pod network namespaces, containerd's rootfs mounts).
unmount_all() {
  local m
  awk -v d="$DIR/" 'index($5, d) == 1 { print $5 }' /proc/self/mountinfo | sort -r | while read -r m; do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
  done
}

# Removes the kubelet's cgroups: /berth-k8s and everything under it in each hierarchy,
# deepest first (rmdir of an empty cgroup; a cgroup with a process left fails and stays).
remove_cgroups() {
  local h
  for h in /sys/fs/cgroup/*/; do
    [ -d "$h$CGROUP" ] || continue
    find "$h$CGROUP" -depth -type d -exec rmdir {} \; 2>/dev/null || true
  done
}

stop_cluster() {
  stop_one kubelet
  remove_containers
  stop_one kube-scheduler
  stop_one kube-controller-manager
  stop_one kube-apiserver
  stop_one etcd
  stop_one containerd
  unmount_all
  # The Pods' address leases: every Pod sandbox is gone, so are its addresses.
  rm -rf "$DIR/cni/ipam"
  remove_cgroups
  if [ -e "/run/netns/$NETNS" ]; then
    say "deleting network namespace $NETNS"
    ip netns delete "$NETNS"
  fi
  rm -f "$DIR/env"
}

print_env() {
  cat "$DIR/env"
}

case "${1:-start}" in
stop)
  [ "$(id -u)" = 0 ] || die "stopping the cluster needs root: run sudo $0 stop"
  stop_cluster
  exit 0
  ;;
env)
  [ -f "$DIR/env" ] || die "no cluster is running (no $DIR/env): start one with sudo $0"
  print_env
  exit 0
  ;;
start | build) ;;
*) die "usage: $0 [start|stop|env|build]" ;;
esac

# --- packages -------------------------------------------------------------------
[ "$(id -u)" = 0 ] || die "the cluster needs root (network and mount namespaces, containerd): run sudo $0"
missing=()
command -v containerd >/dev/null || missing+=(containerd)
command -v runc >/dev/null || missing+=(runc)
[ -x /usr/lib/cni/bridge ] || missing+=(containernetworking-plugins)
command -v openssl >/dev/null || missing+=(openssl)
command -v nsenter >/dev/null || missing+=(util-linux)
command -v ip >/dev/null || missing+=(iproute2)
command -v gcc >/dev/null || missing+=(gcc)
[ -f /usr/lib/x86_64-linux-gnu/libc.a ] || [ -f /usr/lib/aarch64-linux-gnu/libc.a ] || missing+=(libc6-dev)
if command -v dpkg-query >/dev/null; then
  [[ $(dpkg-query -W -f '${Status}' busybox-static 2>/dev/null) == *'ok installed'* ]] || missing+=(busybox-static)
fi
if [ ${#missing[@]} -gt 0 ]; then
  command -v apt-get >/dev/null || die "missing ${missing[*]}: install them"
  say "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi
if ! command -v go >/dev/null; then
  for g in /usr/local/go/bin /usr/lib/go/bin; do [ -x "$g/go" ] && PATH=$PATH:$g; done
fi

# --- binaries, built once per version ----------------------------------------------
built() {
  local c
  for c in "${COMPONENTS[@]}" etcd; do [ -x "$BIN/$c" ] || return 1; done
  # Not `| grep -q`: with pipefail, kubectl's SIGPIPE would fail the check.
  [[ "$("$BIN/kubectl" version --client 2>/dev/null)" == *"Client Version: $VERSION"* ]] &&
    [[ "$("$BIN/etcd" --version 2>/dev/null)" == *"etcd Version: ${ETCD_VERSION#v}"* ]]
}
if ! built; then
  command -v go >/dev/null || die "building Kubernetes $VERSION needs Go (https://go.dev/dl/) on PATH"
  grep -q "^require k8s.io/kubernetes $VERSION\$" "$ROOT/scripts/k8s/wrap/go.mod" ||
    die "scripts/k8s/wrap/go.mod does not require k8s.io/kubernetes $VERSION: regenerate it with scripts/k8s/genwrap.sh $VERSION"
  say "building Kubernetes $VERSION and etcd $ETCD_VERSION into $BIN (one go build; 15-30 minutes cold, once)"
  tmp=$CACHE/$VERSION/bin.tmp.$$
  rm -rf "$tmp"; mkdir -p "$tmp"
  # The version of the binaries: without these, they report v0.0.0 (and the kubelet's
  # node status says so).
  v=${VERSION#v}; minor=${v#*.}; minor=${minor%%.*}
  ld="-s -w"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld="$ld -X $p.gitVersion=$VERSION -X $p.gitMajor=${v%%.*} -X $p.gitMinor=$minor -X $p.gitTreeState=clean -X $p.buildDate=2026-01-01T00:00:00Z"
  done
  pkgs=(); for c in "${COMPONENTS[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$c"); done
  s=$SECONDS
  # -gcflags=all=-l (no inlining): the compile of Kubernetes' 2,750 packages (105 MB of
  # Go) is the longest step of a cold CI run, and without inlining it takes about a fifth
  # less CPU (measured: 325 -> 262 CPU-seconds for k8s.io/kubernetes/pkg/apis/core/v1 and
  # client-go); the binaries run a little slower, which a one-node test cluster does not
  # notice.
  (cd "$ROOT/scripts/k8s/wrap" && CGO_ENABLED=0 GOFLAGS=-mod=readonly go build -trimpath -gcflags=all=-l -ldflags "$ld" -o "$tmp/" "${pkgs[@]}") >&2 ||
    die "go build of Kubernetes $VERSION failed (output above)"
  ts "Kubernetes built in $((SECONDS - s))s"
  s=$SECONDS
  (cd "$ROOT/scripts/k8s/etcdwrap" && CGO_ENABLED=0 GOFLAGS=-mod=readonly go build -trimpath -gcflags=all=-l -ldflags "-s -w" -o "$tmp/etcd" go.etcd.io/etcd/server/v3) >&2 ||
    die "go build of etcd $ETCD_VERSION failed (output above)"
  ts "etcd built in $((SECONDS - s))s"
  rm -rf "$BIN"; mv "$tmp" "$BIN"
  built || die "$BIN does not hold Kubernetes $VERSION and etcd $ETCD_VERSION after the build"
fi

if [ "${1:-start}" = build ]; then
  say "Kubernetes $VERSION and etcd $ETCD_VERSION are in $BIN"
  exit 0
fi

# --- reuse a running cluster ----------------------------------------------------
all_alive() {
  local n
  for n in containerd etcd kube-apiserver kube-controller-manager kube-scheduler kubelet; do alive "$n" || return 1; done
}
# node_ready [SINCE]: the node's Ready condition is True, and when SINCE (RFC 3339, UTC)
# is given, the kubelet reported it at or after SINCE: after a restart etcd still holds
# the Ready=True of the kubelet before.
node_ready() {
  local got status beat
  got=$(kubectl_admin get node "$NODE" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status} {.status.conditions[?(@.type=="Ready")].lastHeartbeatTime}' 2>/dev/null) || return 1
  read -r status beat <<<"$got"
  [ "$status" = True ] && { [ -z "${1:-}" ] || [[ ! "$beat" < "$1" ]]; }
}
if [ -f "$DIR/env" ] && all_alive && node_ready; then
  say "cluster already running (node $NODE Ready)"
  print_env
  exit 0
fi
say "starting the cluster (stopping any half-started one first)"
stop_cluster

mkdir -p "$RUN" "$PKI" "$LOGS" "$DIR/etcd" "$DIR/containerd/root" "$DIR/containerd/state" \
  "$DIR/cni/net.d" "$DIR/cni/ipam" "$DIR/kubelet/root" "$DIR/kubelet/pod-logs" "$DIR/kubelet/sysctl" "$DIR/images"
chmod 711 "$DIR"
chmod 700 "$PKI" "$DIR/etcd"

# --- network namespace ------------------------------------------------------------
ip netns add "$NETNS"
ip -n "$NETNS" link set lo up
ip -n "$NETNS" link add k8sbr0 type bridge
ip -n "$NETNS" addr add "$NODE_IP/24" dev k8sbr0
ip -n "$NETNS" link set k8sbr0 up
ts "network namespace $NETNS with bridge k8sbr0 ($NODE_IP/24)"

# start NAME CMD...: runs CMD in its own session inside the network namespace, its pid
# in run/NAME.pid and its output in logs/NAME.log. nsenter without --fork execs CMD, so
# the pid is CMD's own.
start() {
  local n=$1; shift
  setsid nsenter --net=/run/netns/"$NETNS" -- "$@" </dev/null >>"$LOGS/$n.log" 2>&1 &
  echo $! >"$RUN/$n.pid"
}

wait_for() { # name check-command...
  local name=$1; shift
  local deadline=$((SECONDS + TIMEOUT))
  until "$@" >/dev/null 2>&1; do
    if [ $SECONDS -ge $deadline ] || ! alive "$name"; then
      say "$name did not come up within ${TIMEOUT}s (or exited); its log ($LOGS/$name.log):"
      tail -n 60 "$LOGS/$name.log" >&2 || true
      exit 1
    fi
    sleep 0.2
  done
  ts "$name up"
}

# --- certificates -----------------------------------------------------------------
# A CA, each component's certificate and the kubeconfigs, with openssl, once (kept
# across restarts).
cert() { # name CA CN O SANs extendedKeyUsage
  local n=$1 ca=$2 cn=$3 o=$4 san=$5 eku=$6
  [ -f "$PKI/$n.crt" ] && return 0
  local subj="/CN=$cn"; [ -n "$o" ] && subj="/O=$o/CN=$cn"
  openssl req -newkey rsa:2048 -nodes -keyout "$PKI/$n.key" -out "$PKI/$n.csr" -subj "$subj" 2>/dev/null
  {
    echo "basicConstraints=CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=$eku"
    [ -n "$san" ] && echo "subjectAltName=$san"
  } >"$PKI/$n.ext"
  openssl x509 -req -in "$PKI/$n.csr" -CA "$PKI/$ca.crt" -CAkey "$PKI/$ca.key" -CAcreateserial \
    -out "$PKI/$n.crt" -days 3650 -extfile "$PKI/$n.ext" 2>/dev/null
  rm -f "$PKI/$n.csr" "$PKI/$n.ext"
}
kubeconfig() { # name user cert [token]
  local auth
  if [ -n "${4:-}" ]; then
    auth="    token: $4"
  else
    auth="    client-certificate: $PKI/$3.crt
    client-key: $PKI/$3.key"
  fi
  cat >"$PKI/$1.kubeconfig.tmp" <<KC
apiVersion: v1
kind: Config
clusters:
- name: berth-k8s
  cluster:
    server: $API
    certificate-authority: $PKI/ca.crt
users:
- name: $2
  user:
$auth
contexts:
- name: berth-k8s
  context: {cluster: berth-k8s, user: $2}
current-context: berth-k8s
KC
  chmod 600 "$PKI/$1.kubeconfig.tmp"
  mv "$PKI/$1.kubeconfig.tmp" "$PKI/$1.kubeconfig"
}
for ca in ca front-proxy-ca; do
  [ -f "$PKI/$ca.crt" ] || openssl req -x509 -newkey rsa:2048 -nodes -keyout "$PKI/$ca.key" -out "$PKI/$ca.crt" \
    -days 3650 -subj "/CN=berth-k8s-$ca" 2>/dev/null
done
cert apiserver ca kube-apiserver "" "DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,IP:127.0.0.1,IP:$NODE_IP,IP:10.234.0.1" serverAuth
cert apiserver-kubelet-client ca kube-apiserver-kubelet-client system:masters "" clientAuth
cert admin ca kubernetes-admin system:masters "" clientAuth
cert controller-manager ca system:kube-controller-manager "" "" clientAuth
cert scheduler ca system:kube-scheduler "" "" clientAuth
cert kubelet-client ca "system:node:$NODE" system:nodes "" clientAuth
cert kubelet-server ca "$NODE" "" "DNS:$NODE,DNS:localhost,IP:$NODE_IP,IP:127.0.0.1" serverAuth
cert front-proxy-client front-proxy-ca front-proxy-client "" "" clientAuth
[ -f "$PKI/sa.key" ] || { openssl genrsa -out "$PKI/sa.key" 2048 2>/dev/null && openssl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null; }
chmod 600 "$PKI"/*.key
kubeconfig admin admin admin
kubeconfig controller-manager controller-manager controller-manager
kubeconfig scheduler scheduler scheduler
kubeconfig kubelet kubelet kubelet-client
ts "certificates in $PKI"

# --- containerd with CRI ------------------------------------------------------------
cat >"$DIR/containerd.toml" <<TOML
# The private containerd of scripts/kubernetes.sh: Debian's containerd 1.6 with CRI.
version = 2
root = "$DIR/containerd/root"
state = "$DIR/containerd/state"
# root here lacks CAP_SYS_RESOURCE: no negative OOM score for containerd or the Pods.
oom_score = 0
[grpc]
  address = "$CSOCK"
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "$DIR/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.k8s.io/pause:3.10"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  netns_mounts_under_state_dir = true
  disable_hugetlb_controller = true
  tolerate_missing_hugetlb_controller = true
  enable_unprivileged_ports = true
  enable_unprivileged_icmp = true
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$DIR/cni/net.d"
    max_conf_num = 1
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "$(command -v runc)"
        Root = "$RUN/runc"
        SystemdCgroup = false
TOML
# The Pods' network: the bridge in the namespace, no gateway, NAT or port mapping.
cat >"$DIR/cni/net.d/10-berth-k8s.conflist" <<JSON
{
  "cniVersion": "1.0.0",
  "name": "berth-k8s",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "k8sbr0",
      "isGateway": false,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$DIR/cni/ipam",
        "ranges": [[{"subnet": "10.233.0.0/24", "rangeStart": "10.233.0.10", "rangeEnd": "10.233.0.250"}]]
      }
    }
  ]
}
JSON
rm -f "$CSOCK"
start containerd containerd --config "$DIR/containerd.toml"
wait_for containerd ctr --address "$CSOCK" version

# --- images ---------------------------------------------------------------------------
# The pause image (the Pods' sandbox process), the test image and the agent image, as
# docker-save archives imported into the k8s.io namespace (Pods use imagePullPolicy Never).
gobuild() { (cd "$ROOT" && CGO_ENABLED=0 go build "$@") >&2; }
gcc -static -O2 -o "$DIR/images/pause" "$ROOT/scripts/k8s/pause.c" || die "gcc -static of scripts/k8s/pause.c failed"
gobuild -o "$DIR/images/testimage" ./internal/testsupport/testimage/cmd/testimage || die "building internal/testsupport/testimage/cmd/testimage failed"
gobuild -o "$DIR/images/berth-cli" ./cmd/berth-cli || die "building a static berth-cli failed"
"$DIR/images/testimage" -o "$DIR/images/test.tar" -pause "$DIR/images/pause" -pause-o "$DIR/images/pause.tar" >&2 ||
  die "building the test and pause images failed"
AGENT_IMAGE=$("$DIR/images/berth-cli" image agent -o "$DIR/images/agent.tar") || die "berth image agent failed"
for img in pause test agent; do
  ctr --address "$CSOCK" -n k8s.io images import "$DIR/images/$img.tar" >/dev/null ||
    die "importing $DIR/images/$img.tar into containerd failed"
done
# The list is read whole before grep looks at it: with pipefail, `ctr … | grep -m1` fails
# whenever grep exits before ctr has written its last line (ctr dies of SIGPIPE).
IMAGES=$(ctr --address "$CSOCK" -n k8s.io images ls -q) || die "listing containerd's images failed"
TEST_IMAGE=$(grep -m1 berth-test/busybox <<<"$IMAGES") || die "the test image is not in containerd after the import (it has: ${IMAGES//$'\n'/ })"
ts "images imported: registry.k8s.io/pause:3.10 $TEST_IMAGE $AGENT_IMAGE"

# --- etcd, API server, controller manager, scheduler --------------------------------
start etcd "$BIN/etcd" --name berth-k8s --data-dir "$DIR/etcd" \
  --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
  --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
  --initial-cluster berth-k8s=http://127.0.0.1:2380 --listen-metrics-urls http://127.0.0.1:2381 \
  --quota-backend-bytes=2147483648
etcd_healthy() { # GET /health on the client port, with bash's /dev/tcp (no curl needed)
  innet bash -c 'exec 3<>/dev/tcp/127.0.0.1/2379 && printf "GET /health HTTP/1.0\r\n\r\n" >&3 && grep -q "\"health\":\"true\"" <&3'
}
wait_for etcd etcd_healthy

start kube-apiserver "$BIN/kube-apiserver" --etcd-servers=http://127.0.0.1:2379 \
  --bind-address=127.0.0.1 --secure-port=6443 --advertise-address="$NODE_IP" \
  --service-cluster-ip-range=10.234.0.0/24 \
  --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" --client-ca-file="$PKI/ca.crt" \
  --kubelet-client-certificate="$PKI/apiserver-kubelet-client.crt" --kubelet-client-key="$PKI/apiserver-kubelet-client.key" \
  --kubelet-preferred-address-types=InternalIP --kubelet-certificate-authority="$PKI/ca.crt" \
  --service-account-issuer=https://kubernetes.default.svc.cluster.local \
  --service-account-key-file="$PKI/sa.pub" --service-account-signing-key-file="$PKI/sa.key" \
  --requestheader-client-ca-file="$PKI/front-proxy-ca.crt" --requestheader-allowed-names=front-proxy-client \
  --requestheader-username-headers=X-Remote-User --requestheader-group-headers=X-Remote-Group \
  --requestheader-extra-headers-prefix=X-Remote-Extra- \
  --proxy-client-cert-file="$PKI/front-proxy-client.crt" --proxy-client-key-file="$PKI/front-proxy-client.key" \
  --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction --allow-privileged=true --profiling=false
wait_for kube-apiserver kubectl_admin get --raw /readyz

start kube-controller-manager "$BIN/kube-controller-manager" --kubeconfig="$PKI/controller-manager.kubeconfig" \
  --authentication-kubeconfig="$PKI/controller-manager.kubeconfig" --authorization-kubeconfig="$PKI/controller-manager.kubeconfig" \
  --bind-address=127.0.0.1 --secure-port=10257 --leader-elect=false --use-service-account-credentials=true \
  --service-account-private-key-file="$PKI/sa.key" --root-ca-file="$PKI/ca.crt" \
  --cluster-signing-cert-file="$PKI/ca.crt" --cluster-signing-key-file="$PKI/ca.key" --profiling=false \
  --enable-hostpath-provisioner=true
start kube-scheduler "$BIN/kube-scheduler" --kubeconfig="$PKI/scheduler.kubeconfig" \
  --authentication-kubeconfig="$PKI/scheduler.kubeconfig" --authorization-kubeconfig="$PKI/scheduler.kubeconfig" \
  --bind-address=127.0.0.1 --secure-port=10259 --leader-elect=false --profiling=false

# --- kubelet --------------------------------------------------------------------------
cat >"$DIR/kubelet/config.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# cgroup v1 without systemd: the kubelet refuses cgroup v1 unless failCgroupV1 is false.
failCgroupV1: false
cgroupDriver: cgroupfs
# The Pods' cgroups under /$CGROUP in each hierarchy (created here, removed by stop).
cgroupRoot: /$CGROUP
containerRuntimeEndpoint: unix://$CSOCK
address: $NODE_IP
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
tlsCertFile: $PKI/kubelet-server.crt
tlsPrivateKeyFile: $PKI/kubelet-server.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: Webhook}
# root lacks CAP_SYS_RESOURCE here: no negative oom_score_adj.
oomScoreAdj: 0
# no KUBE-FIREWALL / KUBE-IPTABLES-HINT chains in the host's firewall.
makeIPTablesUtilChains: false
podLogsDir: $DIR/kubelet/pod-logs
resolvConf: /etc/resolv.conf
failSwapOn: false
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
imageGCHighThresholdPercent: 99
imageGCLowThresholdPercent: 98
serializeImagePulls: false
maxPods: 110
YAML
for h in /sys/fs/cgroup/*/; do
  # Every cgroup v1 hierarchy (not the v2 "unified" one the kubelet does not use here).
  [ -f "${h}cgroup.procs" ] && [ ! -f "${h}cgroup.controllers" ] || continue
  mkdir -p "$h$CGROUP"
  # A new cpuset cgroup has no CPUs or memory nodes until it is given its parent's.
  for f in cpuset.cpus cpuset.mems; do
    [ -f "$h$f" ] && [ -z "$(cat "$h$CGROUP/$f")" ] && cat "$h$f" >"$h$CGROUP/$f"
  done
done
# The kubelet's root dir: a shared mount, so that the volumes the kubelet mounts in its
# own mount namespace reach containerd's.
mountpoint -q "$DIR/kubelet/root" || mount --bind "$DIR/kubelet/root" "$DIR/kubelet/root"
mount --make-rshared "$DIR/kubelet/root"
echo 1 >"$DIR/kubelet/sysctl/overcommit_memory"
echo 10 >"$DIR/kubelet/sysctl/panic"
echo 1 >"$DIR/kubelet/sysctl/panic_on_oops"
kubelet_start=$(date -u +%Y-%m-%dT%H:%M:%SZ)
start kubelet unshare --mount --propagation unchanged -- /bin/sh -c '
  mount --bind "$1/overcommit_memory" /proc/sys/vm/overcommit_memory &&
  mount --bind "$1/panic" /proc/sys/kernel/panic &&
  mount --bind "$1/panic_on_oops" /proc/sys/kernel/panic_on_oops &&
  shift && exec "$@"' sh "$DIR/kubelet/sysctl" \
  "$BIN/kubelet" --config="$DIR/kubelet/config.yaml" --kubeconfig="$PKI/kubelet.kubeconfig" \
  --root-dir="$DIR/kubelet/root" --hostname-override="$NODE" --node-ip="$NODE_IP" --v=1
wait_for kubelet node_ready "$kubelet_start"

# --- what the tests need ----------------------------------------------------------------
# The namespace, the ServiceAccount berth with the Role of docs/kubernetes-rbac.yaml (its
# namespace replaced by $NS) and a kubeconfig for it, and the StorageClass.
kubectl_admin get namespace "$NS" >/dev/null 2>&1 || kubectl_admin create namespace "$NS" >/dev/null
sed "s/^\(  *namespace:\) berth\$/\1 $NS/" "$ROOT/docs/kubernetes-rbac.yaml" | kubectl_admin apply -f - >/dev/null
kubectl_admin apply -f - >/dev/null <<YAML
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: $SC
provisioner: kubernetes.io/host-path
reclaimPolicy: Delete
volumeBindingMode: Immediate
---
# A long-lived token of the ServiceAccount berth, for its kubeconfig.
apiVersion: v1
kind: Secret
metadata:
  name: berth-token
  namespace: $NS
  annotations:
    kubernetes.io/service-account.name: berth
type: kubernetes.io/service-account-token
YAML
token=""
deadline=$((SECONDS + TIMEOUT))
until token=$(kubectl_admin -n "$NS" get secret berth-token -o 'jsonpath={.data.token}' 2>/dev/null) && [ -n "$token" ]; do
  [ $SECONDS -lt $deadline ] || die "the token of ServiceAccount berth was not filled in within ${TIMEOUT}s (kube-controller-manager's log: $LOGS/kube-controller-manager.log)"
  sleep 0.2
done
kubeconfig berth "system:serviceaccount:$NS:berth" "" "$(printf %s "$token" | base64 -d)"
# The namespace's default ServiceAccount, which Pods that name none use.
wait_for kube-controller-manager kubectl_admin -n "$NS" get serviceaccount default
ts "cluster up: node $NODE Ready, namespace $NS, StorageClass $SC"

{
  echo "export KUBECONFIG=$PKI/berth.kubeconfig"
  echo "export BERTH_K8S_ADMIN_KUBECONFIG=$PKI/admin.kubeconfig"
  echo "export BERTH_K8S_NETNS=$NETNS"
  echo "export BERTH_K8S_NAMESPACE=$NS"
  echo "export BERTH_K8S_STORAGE_CLASS=$SC"
  echo "export BERTH_K8S_TEST_IMAGE=$TEST_IMAGE"
  echo "export BERTH_K8S_AGENT_IMAGE=$AGENT_IMAGE"
  echo "export BERTH_K8S_CONTAINERD_ADDRESS=$CSOCK"
  echo "export BERTH_K8S_KUBECTL=$BIN/kubectl"
} >"$DIR/env.tmp"
mv "$DIR/env.tmp" "$DIR/env"
print_env
