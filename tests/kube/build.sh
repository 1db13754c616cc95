#!/usr/bin/env bash
# Builds the control-plane binaries used by the `kube` pytest fixtures
# (tests/kube/fixtures.py) from source with Go, once, into
#   ${GPUMETER_CACHE_DIR:-~/.cache/gpumeter}/kube-<k8s version>/bin
# and reuses that cache afterwards (a fast no-op when it is up to date).
#
#   etcd, kube-apiserver, kube-controller-manager, kube-scheduler
#       from this directory's go.mod (k8s.io/kubernetes + its pinned etcd)
#   kwok, kwok-stages.yaml
#       sigs.k8s.io/kwok/cmd/kwok at $KWOK_VERSION (go install; no replaces needed)
#       and the default node/pod Stage objects that `kwokctl` would feed it
#       (the bare controller has no built-in stages), copied from that release.
#
# Prints the bin directory on the last line of stdout.
set -euo pipefail

KWOK_VERSION="v0.8.0"

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"

die() { echo "build.sh: error: $*" >&2; exit 1; }
log() { echo "build.sh: $*" >&2; }

command -v go >/dev/null 2>&1 || die "the Go toolchain is required (go not found in PATH)"

kube_version="$(awk '$1 == "k8s.io/kubernetes" { sub(/^v/, "", $2); print $2; exit }' go.mod)"
[[ -n "$kube_version" ]] || die "cannot read the k8s.io/kubernetes version from $here/go.mod"

cache_root="${GPUMETER_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/gpumeter}"
kube_dir="$cache_root/kube-$kube_version"
bin_dir="$kube_dir/bin"
binaries=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok)

# The stamp ties the cache to the exact inputs: editing go.mod/go.sum, the etcd
# main or the kwok version triggers a rebuild; anything else is a no-op.
stamp() {
    {
        echo "kwok=$KWOK_VERSION"
        go env GOVERSION
        cat go.mod cmd/etcd/main.go tools.go
        [[ -f go.sum ]] && cat go.sum
    } | sha256sum | cut -d' ' -f1
}

up_to_date() {
    local b
    for b in "${binaries[@]}"; do [[ -x "$bin_dir/$b" ]] || return 1; done
    [[ -f "$bin_dir/kwok-stages.yaml" ]] || return 1
    [[ -f "$bin_dir/.stamp" && "$(cat "$bin_dir/.stamp")" == "$(stamp)" ]]
}

mkdir -p "$kube_dir"
# Serialise concurrent invocations (e.g. two `make test` runs) on one cache.
exec 9>"$kube_dir/.lock"
if command -v flock >/dev/null 2>&1; then flock 9; fi

if up_to_date; then
    log "kube $kube_version binaries up to date in $bin_dir"
    echo "$bin_dir"
    exit 0
fi

export GOFLAGS="-mod=mod"
export CGO_ENABLED=0
ldflags="-s -w"
staging="$(mktemp -d "$kube_dir/bin.tmp.XXXXXX")"
trap 'rm -rf "$staging"' EXIT

start=$SECONDS
log "building Kubernetes $kube_version control plane into $bin_dir (cold builds take 10-20 min on 2 cores)"

log "[1/2] go build etcd kube-apiserver kube-controller-manager kube-scheduler"
go build -trimpath -ldflags="$ldflags" -o "$staging/" \
    ./cmd/etcd \
    k8s.io/kubernetes/cmd/kube-apiserver \
    k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler \
    || die "go build of the Kubernetes binaries failed (see output above)"

log "[2/2] go install sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
# Built outside this module so kwok keeps its own tested k8s.io/* versions.
(cd "$staging" && GOFLAGS= GOBIN="$staging" go install -trimpath -ldflags="$ldflags" \
    "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION") \
    || die "go install of kwok $KWOK_VERSION failed (see output above)"

# Same stage set as kwokctl's defaults: node init + heartbeat with lease, and
# pod ready/complete/delete (the latter removes evicted/deleted pods).
kwok_dir="$(GOFLAGS= go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" \
    | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
[[ -d "$kwok_dir/kustomize/stage" ]] || die "kwok $KWOK_VERSION sources not found in the Go module cache"
for f in node/fast/node-initialize.yaml \
         node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
         pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
    echo "---"
    grep -v '^#' "$kwok_dir/kustomize/stage/$f"
done >"$staging/kwok-stages.yaml"

for b in "${binaries[@]}"; do
    [[ -x "$staging/$b" ]] || die "expected binary $b was not produced"
done
stamp >"$staging/.stamp"

# helm (build_helm.sh) shares this directory: carried over, not rebuilt.
for f in helm .helm-stamp; do
    if [[ -e "$bin_dir/$f" ]]; then cp -p "$bin_dir/$f" "$staging/$f"; fi
done

# Swap the finished directory in whole, so a failed build never leaves a
# half-populated cache that the fixtures would try to use.
rm -rf "$bin_dir"
mv "$staging" "$bin_dir"
trap - EXIT

log "done in $((SECONDS - start))s:"
ls -l "$bin_dir" >&2
echo "$bin_dir"
