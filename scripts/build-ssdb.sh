#!/usr/bin/env bash
# Builds an ssdb-server binary from SSDB's source tarball, for the SSDB cache store's tests
# (SSDB_SERVER) and for trying `store: ssdb://…` by hand. SSDB is in no package registry; its
# bundled leveldb, snappy and jemalloc build offline in about a minute on 2 cores.
#
#   scripts/build-ssdb.sh SSDB-SOURCE.tar.gz [PREFIX]    # default PREFIX: ~/.cache/rls-ssdb
#
# The tarball is SSDB's source as released (e.g. ssdb-1.9.8.tar.gz: one top folder ssdb-*).
# Prints the path of the ssdb-server binary on its last line, so that
#   export SSDB_SERVER="$(scripts/build-ssdb.sh ssdb-1.9.8.tar.gz | tail -n 1)"
# works; a binary already built from a tarball of the same name is reused.
# Needs make, g++ and autoconf (scripts/install-test-deps.sh installs them).
set -euo pipefail
if [ $# -lt 1 ] || [ $# -gt 2 ]; then
    echo "usage: $0 SSDB-SOURCE.tar.gz [PREFIX]" >&2; exit 2
fi
tarball="$1"
[ -f "$tarball" ] || { echo "$tarball: no such file (SSDB's source tarball)" >&2; exit 2; }
prefix="${2:-$HOME/.cache/rls-ssdb}"
version="$(basename "$tarball" .tar.gz)"
bin="$prefix/$version/ssdb-server"
if [ -x "$bin" ]; then echo "$bin"; exit 0; fi
missing=()
for tool in make g++ autoconf; do command -v "$tool" >/dev/null || missing+=("$tool"); done
if [ ${#missing[@]} -gt 0 ]; then
    echo "missing build tools: ${missing[*]} (scripts/install-test-deps.sh installs them)" >&2
    exit 1
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
tar -xzf "$tarball" -C "$work"
src="$(find "$work" -mindepth 1 -maxdepth 1 -type d | head -n 1)"
[ -f "$src/Makefile" ] || { echo "$tarball: no Makefile in its top folder (not SSDB's source?)" >&2; exit 2; }
echo "building SSDB from $(basename "$tarball") (about a minute)..." >&2
if ! (cd "$src" && make -j"$(nproc)" >"$work/build.log" 2>&1); then
    tail -n 30 "$work/build.log" >&2; echo "SSDB build failed" >&2; exit 1
fi
mkdir -p "$prefix/$version"
cp "$src/ssdb-server" "$bin.tmp.$$" && mv "$bin.tmp.$$" "$bin"
echo "$bin"
