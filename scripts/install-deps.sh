#!/usr/bin/env bash
# Installs what building, testing and the demo need on Debian/Ubuntu:
# Go (must already be on PATH), a C compiler for the test fixtures; with
# "generate" the BPF toolchain (clang, llvm, libbpf headers, bpftool); with
# "test" what the tests run besides the tool: bpftool (nothing left loaded),
# Prometheus with promtool and Alertmanager with amtool (the alert rules,
# dashboard queries, the alerting loop, deploy/alertmanager's configuration),
# Debian's python3.11 (Python frames in
# stacks), g++, readelf (binutils) and eu-stack (elfutils) (stacks of
# code without frame pointers, held to elfutils' and binutils' unwind
# tables), Chromium (the HTML report is rendered in
# it), podman and runc (the image `make image` builds is loaded and run),
# qemu-user-static (its arm64 layer's tool is run);
# with "e2e" a one-node Kubernetes's parts besides Kubernetes itself
# (etcd, containerd, runc, the CNI plugins, nftables, iproute2) and
# bpftool, Prometheus and Alertmanager;
# with "screenshot" Chromium and pngquant (README's picture of the
# HTML report); with "kernels" what scripts/kernels.sh needs to boot
# Debian's kernels under qemu (qemu, a static busybox and cpio for the
# initramfs, kmod's depmod, xz for the modules, jq, Debian's archive keys
# for apt to fetch the kernels, and python3.11 for the guest's Python step);
# with "arm64" (and "test") the arm64 build and image: Debian's aarch64
# cross compiler and glibc for cgo, and the arm64 glibc package itself
# (libc6:arm64, dpkg's multiarch), whose files and records the arm64 image
# carries; with "kernels-arm64" what the arm64 matrix needs besides
# (qemu-system-arm, mmdebstrap for the guest's arm64 userland, the aarch64
# cross toolchain for the tool, fixtures and test binaries built for the
# guest).
set -euo pipefail

need=()
command -v gcc >/dev/null || need+=(gcc libc6-dev)
command -v git >/dev/null || need+=(git)
if [ "${1:-}" = generate ]; then
	command -v clang >/dev/null || need+=(clang)
	command -v llvm-strip >/dev/null || need+=(llvm)
	[ -f /usr/include/bpf/bpf_helpers.h ] || need+=(libbpf-dev)
	command -v bpftool >/dev/null || need+=(bpftool)
fi
if [ "${1:-}" = test ]; then
	command -v bpftool >/dev/null || need+=(bpftool)
	command -v promtool >/dev/null || need+=(prometheus)
	{ command -v prometheus-alertmanager && command -v amtool; } >/dev/null || need+=(prometheus-alertmanager)
	[ -x /usr/bin/python3.11 ] || need+=(python3.11) # Python frames: pkg/testutil.DebianPython
	command -v g++ >/dev/null || need+=(g++)
	command -v readelf >/dev/null || need+=(binutils)
	command -v eu-stack >/dev/null || need+=(elfutils)
	command -v podman >/dev/null || need+=(podman)
	command -v runc >/dev/null || need+=(runc)
	command -v qemu-aarch64-static >/dev/null || need+=(qemu-user-static) # the arm64 image's tool, run in a chroot of its layer
fi
if [ "${1:-}" = e2e ]; then
	command -v etcd >/dev/null || need+=(etcd-server)
	command -v containerd >/dev/null || need+=(containerd)
	command -v runc >/dev/null || need+=(runc)
	[ -x /usr/lib/cni/bridge ] || need+=(containernetworking-plugins)
	command -v nft >/dev/null || need+=(nftables)
	command -v ip >/dev/null || need+=(iproute2)
	command -v bpftool >/dev/null || need+=(bpftool)
	command -v prometheus >/dev/null || need+=(prometheus)
	command -v prometheus-alertmanager >/dev/null || need+=(prometheus-alertmanager)
fi
if [ "${1:-}" = arm64 ] || [ "${1:-}" = test ]; then
	command -v aarch64-linux-gnu-gcc >/dev/null || need+=(gcc-aarch64-linux-gnu)
	[ -f /usr/aarch64-linux-gnu/include/stdio.h ] || need+=(libc6-dev-arm64-cross)
	if ! dpkg-query --show libc6:arm64 >/dev/null 2>&1; then
		need+=(libc6:arm64)
		if ! dpkg --print-foreign-architectures | grep -qx arm64; then
			[ "$(id -u)" = 0 ] && dpkg --add-architecture arm64
		fi
	fi
fi
if [ "${1:-}" = test ] || [ "${1:-}" = screenshot ]; then
	command -v chromium >/dev/null || need+=(chromium)
fi
if [ "${1:-}" = screenshot ]; then
	command -v pngquant >/dev/null || need+=(pngquant)
fi
if [ "${1:-}" = kernels ]; then
	command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
	# The initramfs has no libc: busybox must be the static build.
	{ [ -x /bin/busybox ] && ! ldd /bin/busybox >/dev/null 2>&1; } || need+=(busybox-static)
	command -v cpio >/dev/null || need+=(cpio)
	command -v depmod >/dev/null || need+=(kmod)
	command -v xz >/dev/null || need+=(xz-utils)
	command -v jq >/dev/null || need+=(jq)
	[ -f /usr/share/keyrings/debian-archive-keyring.gpg ] || need+=(debian-archive-keyring)
	[ -x /usr/bin/python3.11 ] || need+=(python3.11)
fi
if [ "${1:-}" = kernels-arm64 ]; then
	command -v qemu-system-aarch64 >/dev/null || need+=(qemu-system-arm)
	command -v mmdebstrap >/dev/null || need+=(mmdebstrap)
	command -v aarch64-linux-gnu-gcc >/dev/null || need+=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross)
	command -v aarch64-linux-gnu-g++ >/dev/null || need+=(g++-aarch64-linux-gnu)
	command -v cpio >/dev/null || need+=(cpio)
	command -v depmod >/dev/null || need+=(kmod)
	command -v xz >/dev/null || need+=(xz-utils)
	command -v jq >/dev/null || need+=(jq)
	[ -f /usr/share/keyrings/debian-archive-keyring.gpg ] || need+=(debian-archive-keyring)
fi
if [ ${#need[@]} -gt 0 ]; then
	if [ "$(id -u)" != 0 ]; then
		echo "missing: ${need[*]}; run as root (sudo make ...) or install them" >&2
		exit 1
	fi
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
command -v go >/dev/null || { echo "Go is not on PATH (need Go >= 1.26)" >&2; exit 1; }
