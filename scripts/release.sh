#!/usr/bin/env bash
# Builds fencegate's release archives with checksums.
#
#   ./scripts/release.sh v0.1.0
#
# For each platform (default: linux/amd64 linux/arm64 darwin/amd64
# darwin/arm64; RELEASE_PLATFORMS overrides, space-separated, and may name
# windows/amd64, whose binary is fencegate.exe), a static,
# stripped binary built as the Dockerfile builds it (CGO_ENABLED=0,
# -trimpath, version, commit and date stamped), packed with LICENSE,
# README.md, the docs/ pages and the files they link to (see docs below)
# into DIST/fencegate_VERSION_OS_ARCH.tar.gz; then
# DIST/SHA256SUMS lists every archive (check with: cd dist && sha256sum -c
# SHA256SUMS). DIST is dist/ unless RELEASE_DIR says otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$#" -ne 1 ] || [ -z "$1" ]; then
	echo "usage: $0 VERSION   (such as v0.1.0)" >&2
	exit 2
fi
version="$1"
case "$version" in
*[!A-Za-z0-9._+-]*)
	echo "release.sh: VERSION may hold only A-Z a-z 0-9 . _ + -" >&2
	exit 2
	;;
esac
platforms="${RELEASE_PLATFORMS:-linux/amd64 linux/arm64 darwin/amd64 darwin/arm64}"
dist="${RELEASE_DIR:-dist}"
commit="$(git rev-parse HEAD 2>/dev/null || echo unknown)"
if [ -n "$(git status --porcelain 2>/dev/null)" ]; then
	commit="$commit-dirty"
fi
date="$(date -u +%Y-%m-%dT%H:%M:%SZ)"

# The archive's documentation: README.md, LICENSE, the docs/ pages, and
# every file they link to (the API description, the example workers), at
# the same paths as in the repository, so that no link in them is dead.
# deploy/release_test.go checks every relative link of the archive.
docs=(README.md LICENSE docs/*.md leaseapi/openapi.json
	examples/shell examples/python/worker.py examples/python/README.md examples/go/worker/main.go examples/go/README.md)

mkdir -p "$dist"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
archives=()
for p in $platforms; do
	os="${p%/*}" arch="${p#*/}"
	name="fencegate_${version}_${os}_${arch}"
	echo "release.sh: building $name" >&2
	mkdir -p "$work/$name"
	exe=fencegate
	[ "$os" = windows ] && exe=fencegate.exe
	CGO_ENABLED=0 GOOS="$os" GOARCH="$arch" go build -trimpath \
		-ldflags "-s -w -X main.version=$version -X main.commit=$commit -X main.date=$date" \
		-o "$work/$name/$exe" ./cmd/fencegate
	tar -cf - "${docs[@]}" | tar -C "$work/$name" -xf -
	tar -C "$work" --owner=0 --group=0 --numeric-owner -czf "$dist/$name.tar.gz" "$name"
	archives+=("$name.tar.gz")
done
(cd "$dist" && sha256sum "${archives[@]}" >SHA256SUMS)
echo "release.sh: ${#archives[@]} archives and SHA256SUMS in $dist" >&2
