#!/usr/bin/env bash
# Installs the real CUDA runtime (libcudart.so.11.0), the driver's user-space
# library (libcuda.so.1) and NVML from Debian non-free, so the CUDA
# integration tests run against the real libraries and not only the
# stand-ins. No GPU or kernel driver is needed: cudaMalloc then fails with
# cudaErrorNoDevice (100; without libcuda1 it would be 35,
# cudaErrorInsufficientDriver), which is what the tests expect. Idempotent.
set -euo pipefail

pkgs=(libcudart11.0 libcuda1 libnvidia-ml1)
missing=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" != 0 ]; then
	echo "missing: ${missing[*]}; run as root or install them" >&2
	exit 1
fi

# Enable contrib and non-free on the mirror the system already uses.
src=/etc/apt/sources.list.d/debian-nonfree.sources
if [ ! -f "$src" ]; then
	uris=http://deb.debian.org/debian
	if [ -f /etc/apt/sources.list.d/debian.sources ]; then
		found=$(awk '/^URIs:/ && $2 !~ /security/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources)
		[ -n "$found" ] && uris=$found
	fi
	codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")
	cat >"$src" <<SRC
Types: deb
URIs: $uris
Suites: $codename $codename-updates
Components: contrib non-free
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
