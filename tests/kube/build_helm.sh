#!/usr/bin/env bash
# Builds helm (the chart tests' `helm lint` / `helm template`) from the Go module proxy, once,
# into the same cache directory as the control-plane binaries (tests/kube/build.sh):
#   ${GPUMETER_CACHE_DIR:-~/.cache/gpumeter}/kube-<k8s version>/bin/helm
# and reuses it afterwards (a fast no-op when the cached binary is this version).
#
# Prints the helm binary's path on the last line of stdout.
set -euo pipefail

HELM_MODULE="helm.sh/helm/v4"
HELM_VERSION="v4.3.2"

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

die() { echo "build_helm.sh: error: $*" >&2; exit 1; }
log() { echo "build_helm.sh: $*" >&2; }

command -v go >/dev/null 2>&1 || die "the Go toolchain is required (go not found in PATH)"

kube_version="$(awk '$1 == "k8s.io/kubernetes" { sub(/^v/, "", $2); print $2; exit }' "$here/go.mod")"
[[ -n "$kube_version" ]] || die "cannot read the k8s.io/kubernetes version from $here/go.mod"

cache_root="${GPUMETER_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/gpumeter}"
bin_dir="$cache_root/kube-$kube_version/bin"
stamp_file="$bin_dir/.helm-stamp"
stamp="$HELM_MODULE@$HELM_VERSION $(go env GOVERSION)"

mkdir -p "$bin_dir"
exec 9>"$bin_dir/.helm-lock"
if command -v flock >/dev/null 2>&1; then flock 9; fi

if [[ -x "$bin_dir/helm" && -f "$stamp_file" && "$(cat "$stamp_file")" == "$stamp" ]]; then
    log "helm $HELM_VERSION up to date in $bin_dir"
    echo "$bin_dir/helm"
    exit 0
fi

staging="$(mktemp -d "$bin_dir/../helm.tmp.XXXXXX")"
trap 'rm -rf "$staging"' EXIT
start=$SECONDS
log "go install $HELM_MODULE/cmd/helm@$HELM_VERSION (a cold build takes a few minutes on 2 cores)"
# Built outside any module so helm keeps its own tested dependency versions.
(cd "$staging" && GOFLAGS= CGO_ENABLED=0 GOBIN="$staging" go install -trimpath -ldflags="-s -w" \
    "$HELM_MODULE/cmd/helm@$HELM_VERSION") \
    || die "go install of $HELM_MODULE $HELM_VERSION failed (see output above)"
[[ -x "$staging/helm" ]] || die "go install produced no helm binary"
mv -f "$staging/helm" "$bin_dir/helm"
echo "$stamp" >"$stamp_file"
log "done in $((SECONDS - start))s"
echo "$bin_dir/helm"
