#!/bin/bash
# Debian's SLURM and munge packages, the ones setup.sh stands a cluster up from. Installing them reaches the
# package registry, so no test does it: launchers/test.sh does, before the tests, and so does setup.sh when run by hand
# (a benchmark). `install.sh --check` installs nothing: it names what is missing and exits 1.
set -euo pipefail
PKGS="slurmctld slurmd slurm-client munge"
missing=""
for pkg in $PKGS; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing="$missing $pkg"
done
[ -z "$missing" ] && exit 0
if [ "${1:-}" = "--check" ]; then
  echo "not installed:$missing" >&2
  exit 1
fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
