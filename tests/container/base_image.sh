#!/usr/bin/env bash
# The base image of the sky.Container tests, built from Debian's mirror (no image registry is
# reachable from CI): a minimal bookworm with python3 (the nodes' interpreter) and openssh-server,
# imported into podman under NAME. Cached: nothing is done when the image is there already.
# Run by .ci/run, and by tests/container/conftest.py when it finds no image.
set -euo pipefail
NAME="${1:-localhost/skyward-test-base:bookworm}"
BINARY="${SKYWARD_TEST_CONTAINER_BINARY:-podman}"
if "$BINARY" image exists "$NAME" 2>/dev/null; then
    exit 0
fi
command -v debootstrap >/dev/null || { echo "debootstrap is missing: apt-get install debootstrap" >&2; exit 1; }
DIR="$(mktemp -d /var/tmp/skyward-base-XXXXXX)"
trap 'rm -rf "$DIR"' EXIT
debootstrap --variant=minbase --include=python3,openssh-server bookworm "$DIR" \
    "${SKYWARD_DEBIAN_MIRROR:-http://deb.debian.org/debian}" >"$DIR.log" 2>&1 || {
    tail -n 20 "$DIR.log" >&2; rm -f "$DIR.log"; exit 1; }
rm -f "$DIR.log"
# apt's lists are dropped by minbase's cleanup; Image(apt=...) fetches them when it needs them.
tar -C "$DIR" -c . | "$BINARY" import --quiet - "$NAME" >/dev/null
echo "built $NAME"
