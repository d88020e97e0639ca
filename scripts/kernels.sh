#!/usr/bin/env bash
# The kernel matrix: boots Debian kernels under qemu and runs the tool in
# each (scripts/kernel-guest.sh: check, then workloads whose findings are
# asserted), with this machine's root shared read-only, so the guest runs
# the binaries built here.
#
#   scripts/kernels.sh [KERNEL...]     default: every kernel in the table below
#
# KERNELS_ARCH=arm64 boots Debian's arm64 kernels under qemu-system-aarch64
# instead (emulated, with pointer authentication), their root an arm64
# userland made here from Debian's arm64 packages (mmdebstrap, cached under
# bin/kernels/cache), with the repository shared at its path here and the
# cross-built tool, fixtures and test binaries (make kernels-arm64); their
# outputs go to bin/kernels/arm64/KERNEL/.
#
# Kernels are apt packages pinned by version, unpacked under
# bin/kernels/cache (KERNELS_CACHE); each kernel's console log, reports and
# outputs go to bin/kernels/KERNEL/ (KERNELS_OUT). KERNEL_STEPS="check fd"
# runs some steps only; KERNEL_TIMEOUT (900 s) bounds a guest. Exits
# non-zero when a step that must pass on a kernel failed, the guest did not
# reach its end, or its console shows a kernel warning, oops or panic.
# Needs root, and what `scripts/install-deps.sh kernels` installs.
#
# Emulated (TCG), one vCPU: /dev/kvm here is nested and unusable, and
# multi-threaded TCG once oopsed a guest while the kernel patched its text
# for the first syscall tracepoint. Kernels run one after another.
set -euo pipefail

cd "$(dirname "$0")/.."
repo=$PWD
arch=${KERNELS_ARCH:-amd64}
case $arch in
amd64) out=${KERNELS_OUT:-$repo/bin/kernels} ;;
arm64) out=${KERNELS_OUT:-$repo/bin/kernels/arm64} ;;
*)
	echo "kernels: KERNELS_ARCH=$arch: amd64 or arm64" >&2
	exit 1
	;;
esac
cache=${KERNELS_CACHE:-$repo/bin/kernels/cache}
timeout_s=${KERNEL_TIMEOUT:-900}

# The kernels: package, exact version and the Debian suite that has it
# (fetched from the archives this machine's apt uses). Security suites drop old versions in time: when a download
# fails, pick the newest that `apt-cache policy` lists (the failure shows it).
#       name    package                                   version              suite
kernel_table_amd64='
	5.10    linux-image-5.10.0-32-amd64-unsigned      5.10.223-1           bullseye
	6.1     linux-image-6.1.0-57-amd64-unsigned       6.1.192-3            bookworm-security
	6.1-rt  linux-image-6.1.0-57-rt-amd64-unsigned    6.1.192-3            bookworm-security
	6.12    linux-image-6.12.117+deb12-amd64-unsigned 6.12.117-1~deb12u1   bookworm-security
'
kernel_table_arm64='
	6.1     linux-image-6.1.0-57-arm64-unsigned       6.1.192-3            bookworm-security
	6.12    linux-image-6.12.117+deb12-arm64-unsigned 6.12.117-1~deb12u1   bookworm-security
'

# What must pass where: "pass" fails the matrix when it fails; "off" is run
# and shown, and fails nothing. The first line names the columns.
expect_table_amd64='
	name    check fd   fork cuda oomsnap gpuleak nccl ncclstall sched sock python
	5.10    pass  pass pass pass pass    pass    pass pass      pass  pass pass
	6.1     pass  pass pass pass pass    pass    pass pass      pass  pass pass
	6.1-rt  pass  pass pass pass pass    pass    pass pass      pass  pass pass
	6.12    pass  pass pass pass pass    pass    pass pass      pass  pass pass
'
# eustack: pkg/fdtrack's test of stacks without frame pointers, held to
# eu-stack's frame for frame (AArch64 CFI, the link register, PAC). Off
# until arm64 has them (issue 34): nccl and ncclstall (the nccl object is
# refused: "dereference of modified ctx ptr" in nccl_enter), python (no
# Python frames), eustack (the unwinder stops at the first frame without
# a frame pointer).
expect_table_arm64='
	name    check fd   fork cuda oomsnap gpuleak nccl ncclstall sched sock python eustack
	6.1     pass  pass pass pass pass    pass    pass pass      pass  pass pass   pass
	6.12    pass  pass pass pass pass    pass    pass pass      pass  pass pass   pass
'
kernel_table_var=kernel_table_$arch
kernel_table=${!kernel_table_var}
expect_table_var=expect_table_$arch
expect_table=${!expect_table_var}
read -ra expect_cols <<<"$(awk '$1 == "name" { $1 = ""; print; exit }' <<<"$expect_table")"
steps=${KERNEL_STEPS:-${expect_cols[*]}}

# The initramfs's modules, in load order, with their dependencies from
# modules.dep: 9p over virtio for the shared roots, overlay for a writable
# /usr (the kernel's modules there for modprobe on demand), a virtio RNG
# (getrandom need not wait for entropy), and sock_diag for the socket view's
# TCP states. Built-in or absent ones are skipped.
modules=(virtio_ring virtio virtio_pci_legacy_dev virtio_pci_modern_dev virtio_pci virtio_mmio virtio_rng
	9pnet 9pnet_virtio netfs fscache 9p overlay inet_diag tcp_diag udp_diag unix_diag)

# Kernel lines that fail a guest; the kernel's command line echoes panic=-1.
console_bad='WARNING:|BUG:|Oops|Call Trace|[Pp]anic'
console_ok='[Cc]ommand line:'

die() {
	echo "kernels: $*" >&2
	exit 1
}

field() { # field TABLE NAME COLUMN
	awk -v n="$2" -v c="$3" '$1 == n { print $c }' <<<"$1"
}

[ "$(id -u)" = 0 ] || die "needs root: qemu shares all of / with the guest"
if [ "$arch" = amd64 ]; then
	for c in qemu-system-x86_64 cpio depmod dpkg-deb xz jq; do
		command -v "$c" >/dev/null || die "$c missing: run scripts/install-deps.sh kernels"
	done
	{ [ -x /bin/busybox ] && ! ldd /bin/busybox >/dev/null 2>&1; } || die "/bin/busybox is not a static build: run scripts/install-deps.sh kernels"
	[ -x bin/autoglm-ebpf ] || die "bin/autoglm-ebpf missing: make build fixtures"
	[ -x testdata/bin/fdwork ] || die "fixtures missing: make build fixtures"
	[[ " $steps " != *" oomsnap "* ]] || [ -x bin/cudatrack.test ] || die "bin/cudatrack.test missing: make bin/cudatrack.test"
else
	for c in qemu-system-aarch64 mmdebstrap cpio depmod dpkg-deb xz jq; do
		command -v "$c" >/dev/null || die "$c missing: run scripts/install-deps.sh kernels-arm64"
	done
	[ -x bin/arm64/autoglm-ebpf ] || die "bin/arm64/autoglm-ebpf missing: make bin/arm64/autoglm-ebpf"
	[ -x testdata/bin-arm64/fdwork ] || die "arm64 fixtures missing: make fixtures-arm64"
	[[ " $steps " != *" oomsnap "* ]] || [ -x bin/arm64/cudatrack.test ] || die "bin/arm64/cudatrack.test missing: make bin/arm64/cudatrack.test"
	[[ " $steps " != *" eustack "* ]] || [ -x bin/arm64/fdtrack.test ] || die "bin/arm64/fdtrack.test missing: make bin/arm64/fdtrack.test"
fi

all=$(awk 'NF { printf "%s%s", sep, $1; sep = " " }' <<<"$kernel_table")
kernels=("$@")
[ ${#kernels[@]} -gt 0 ] || read -ra kernels <<<"$all"
for k in "${kernels[@]}"; do
	[ -n "$(field "$kernel_table" "$k" 2)" ] || die "unknown kernel $k (one of: $all)"
done

# apt with its own sources and state under the cache: the host's apt
# configuration and lists stay as they are.
aptdir=$cache/apt
[ "$arch" = amd64 ] || aptdir=$cache/apt-$arch
apt_opts=(-o "Dir::Etc::SourceList=$aptdir/sources.list" -o Dir::Etc::SourceParts=/dev/null
	-o "Dir::State::Lists=$aptdir/lists" -o "Dir::Cache=$aptdir/cache" -o APT::Sandbox::User=root
	-o Acquire::Languages=none -o Debug::NoLocking=1)
# Another architecture's packages, as if it were this machine's (no
# multiarch set-up needed).
[ "$arch" = amd64 ] || apt_opts+=(-o "APT::Architecture=$arch" -o "APT::Architectures::=$arch")
apt_ready=
main=
apt_update() {
	[ -z "$apt_ready" ] || return 0
	mkdir -p "$aptdir/lists/partial" "$aptdir/cache/archives/partial"
	: >"$aptdir/sources.list"
	# The Debian archives this machine's apt already uses: the one of its
	# release (suite without a dash) and its security archive.
	local targets security url s
	targets=$(apt-get indextargets --format '$(REPO_URI) $(RELEASE)' 2>/dev/null | sort -u)
	main=$(awk '$2 !~ /-/ { print $1; exit }' <<<"$targets")
	security=$(awk '$2 ~ /-security$/ { print $1; exit }' <<<"$targets")
	[ -n "$main" ] && [ -n "$security" ] || die "no Debian archive (and its security archive) in this machine's apt sources"
	for s in $(awk 'NF { print $4 }' <<<"$kernel_table" | sort -u); do
		url=$main
		[[ $s == *-security ]] && url=$security
		echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $url $s main" >>"$aptdir/sources.list"
	done
	apt-get "${apt_opts[@]}" -qq update
	apt_ready=1
}

# fetch NAME: the kernel unpacked, once; prints its folder.
fetch() {
	local pkg ver dir
	pkg=$(field "$kernel_table" "$1" 2)
	ver=$(field "$kernel_table" "$1" 3)
	dir=$cache/${pkg}_$ver
	if [ ! -f "$dir/.unpacked" ]; then
		apt_update >&2
		rm -rf "$dir" "$cache/deb"
		mkdir -p "$cache/deb"
		if ! (cd "$cache/deb" && apt-get "${apt_opts[@]}" -qq download "$pkg=$ver") >&2; then
			# The same flavour of the same series, in the suites above.
			local series=${1%-rt} flavour others
			flavour=$(sed -E 's/^linux-image-[0-9.]+(-[0-9]+|\+[a-z0-9]+)-//' <<<"$pkg")
			mapfile -t others < <(apt-cache "${apt_opts[@]}" pkgnames "linux-image-$series" |
				grep -E "^linux-image-${series//./\\.}\.[^-]*-([0-9]+-)?$flavour\$")
			[ ${#others[@]} -eq 0 ] || apt-cache "${apt_opts[@]}" madison "${others[@]}" | sort -V | tail -3 >&2 || true
			die "$pkg $ver cannot be downloaded: pin a version apt has (above) in scripts/kernels.sh"
		fi
		dpkg-deb -x "$cache"/deb/*.deb "$dir"
		rm -rf "$cache/deb"
		touch "$dir/.unpacked"
	fi
	echo "$dir"
}

# The arm64 guests' root: Debian's packages for what the guest runs (the
# steps' shell tools, Python, eu-stack, the C++ runtime of a fixture) and a
# static busybox for the initramfs, unpacked, not installed: no maintainer
# script runs, so no arm64 emulation is needed here and it takes seconds.
# What a script would have made that the guest needs is made after
# (awk, an alternative). Rebuilt when the list changes.
userland_suite=bookworm
userland_packages=bash,coreutils,dash,sed,grep,mawk,findutils,util-linux,procps,jq,elfutils,python3.11,libstdc++6,busybox-static

# userland: the arm64 root, once; prints its folder.
userland() {
	local dir=$cache/rootfs-$arch t0
	if [ "$(cat "$dir.packages" 2>/dev/null)" != "$userland_suite $userland_packages" ]; then
		apt_update >&2
		rm -rf "$dir" "$dir.packages"
		t0=$(date +%s)
		mmdebstrap --quiet --architectures="$arch" --variant=extract --include="$userland_packages" \
			"$userland_suite" "$dir" "$main" >&2
		ln -s mawk "$dir/usr/bin/awk"
		echo "$userland_suite $userland_packages" >"$dir.packages"
		echo "== arm64 userland: $(du -sh "$dir" | cut -f1) in $(($(date +%s) - t0)) s" >&2
	fi
	echo "$dir"
}

# initramfs DIR KVER IMAGE: busybox, /init and the modules of kernel DIR.
initramfs() {
	local dir=$1 kver=$2 image=$3 mods root seen=" " m line path dep
	mods=$dir/lib/modules/$kver
	root=$(mktemp -d)
	mkdir -p "$root"/{bin,dev,proc,sys,newroot,modules}
	cp "${rootfs:-}/bin/busybox" "$root/bin/busybox"
	cp scripts/kernel-init.sh "$root/init"
	chmod +x "$root/init"
	for m in "${modules[@]}"; do
		grep -qE "/${m//_/[-_]}\.ko(\.[a-z]+)?$" "$mods/modules.builtin" && continue
		line=$(grep -E "(^|/)${m//_/[-_]}\.ko(\.[a-z]+)?:" "$mods/modules.dep" || true)
		[ -n "$line" ] || continue
		# modules.dep lists a module's dependencies last-loaded first.
		for dep in $(tr ' ' '\n' <<<"${line#*:}" | tac) "${line%%:*}"; do
			path=$(basename "$dep")
			path=${path%%.ko*}
			[[ $seen == *" $path "* ]] && continue
			seen+="$path "
			case $dep in
			*.ko.xz) xz -dc "$mods/$dep" ;;
			*.ko.zst) zstd -dcq "$mods/$dep" ;;
			*.ko.gz) gzip -dc "$mods/$dep" ;;
			*) cat "$mods/$dep" ;;
			esac >"$root/modules/$path.ko"
			echo "$path" >>"$root/modules/order"
		done
	done
	(cd "$root" && find . | cpio -o -H newc --quiet) | gzip -1 >"$image"
	rm -rf "$root"
}

# boot NAME: one guest; its results under $out/NAME.
boot() {
	local k=$1 dir kver kdir guest image t0 rc=0
	dir=$(fetch "$k")
	kver=$(ls "$dir/lib/modules")
	[ -f "$dir/lib/modules/$kver/modules.dep" ] || depmod -b "$dir" "$kver"
	kdir=$out/$k
	guest=$kdir/guest
	rm -rf "$kdir"
	mkdir -p "$guest"
	image=$kdir/initrd.cpio.gz
	initramfs "$dir" "$kver" "$image"
	echo "== $k: $kver (console: $kdir/console.log)"
	local qemu=(qemu-system-x86_64 -cpu max) console=ttyS0
	if [ "$arch" = arm64 ]; then
		# -cpu max: the only model of this qemu with pointer
		# authentication (the unwinder strips PAC from return
		# addresses); its implementation-defined algorithm is the
		# faster to emulate.
		qemu=(qemu-system-aarch64 -M virt -cpu max,pauth-impdef=on)
		console=ttyAMA0
	fi
	t0=$(date +%s)
	# The repository and modules are found at their paths here: the guest
	# sees this machine's root at /host, and takes its own root from
	# autoglm.root there.
	timeout -k 10 "$timeout_s" "${qemu[@]}" -accel tcg -m 4G -smp 1 -no-reboot \
		-nic none -display none -monitor none -serial stdio \
		-device virtio-rng-pci \
		-kernel "$dir/boot/vmlinuz-$kver" -initrd "$image" \
		-append "console=$console panic=-1 autoglm.root=${rootfs:-/} autoglm.repo=$repo autoglm.modules=$dir/lib/modules/$kver autoglm.steps=${steps// /,}" \
		-virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap \
		-virtfs "local,path=$guest,mount_tag=out,security_model=none" \
		</dev/null 2>&1 | tee "$kdir/console.log" | sed -un -E 's/^kernel-(guest|init): /  /p' || rc=${PIPESTATUS[0]}
	echo $(($(date +%s) - t0)) >"$kdir/seconds"
	echo "$rc" >"$kdir/qemu-exit"
}

# verdict NAME: prints its row of the table; returns 1 when it fails the matrix.
verdict() {
	local k=$1 kdir=$out/$1 bad=0 row col want got secs end console
	row=$(printf '%-8s' "$k")
	for i in "${!expect_cols[@]}"; do
		col=${expect_cols[$i]}
		want=$(field "$expect_table" "$k" $((i + 2)))
		got=$(awk -v s="$col" '$1 == s { print $2 }' "$kdir/guest/results" 2>/dev/null)
		if [[ " $steps " != *" $col "* ]]; then
			got=-
		elif [ -z "$got" ]; then
			got=NONE
		fi
		if [ "$want" = off ]; then
			got=off:$got
		elif [ "$got" != PASS ] && [ "$got" != - ]; then
			bad=1
		fi
		row+=$(printf ' %-8s' "$got")
	done
	console=ok
	if grep -E "$console_bad" "$kdir/console.log" | grep -vE "$console_ok" >"$kdir/console-problems"; then
		console=BAD
		bad=1
	fi
	end=yes
	if ! grep -q '^kernel-guest: done' "$kdir/console.log"; then
		end=NO
		bad=1
	fi
	secs=$(cat "$kdir/seconds")
	row+=$(printf ' %-8s %-4s %dm%02ds' "$console" "$end" $((secs / 60)) $((secs % 60)))
	echo "$row"
	return $bad
}

# details NAME: what check said of each view and of anything not ok, why steps
# failed and what the tool warned of (each once, with the steps that said
# it: they differ between steps only in which map was created first), and
# the console's kernel warnings.
details() {
	local k=$1 kdir=$out/$1 g=$out/$1/guest w
	echo "-- $k ($(awk '{ print $3 }' "$g/uname" 2>/dev/null))"
	[ "$(cat "$kdir/qemu-exit")" = 0 ] || echo "   qemu exit $(cat "$kdir/qemu-exit") (124: killed after ${timeout_s} s)"
	# No guest has a GPU: NVML and the CUDA libraries are not there.
	[ ! -f "$g/check.summary" ] || grep -vE '^(NVML|CUDA (runtime|driver))' "$g/check.summary" | sed 's/^/   check: /'
	{
		[ ! -f "$g/results" ] || awk '$2 == "FAIL" {
			s = $1
			sub(/^[^ ]+ FAIL /, "")
			n = split($0, r, / ;; /)
			for (i = 1; i <= n; i++) print s "\tFAIL " r[i]
		}' "$g/results"
		for w in "$g"/*.warnings; do
			[ -f "$w" ] || continue
			grep -v 'NVML unavailable' "$w" | sed "s|^|$(basename "$w" .warnings)\t|" || true
		done
	} | awk -F '\t' '{
		key = $2
		gsub(/map [a-z_0-9]+:/, "map *:", key)
		if (!(key in steps)) {
			order[++n] = key
			text[key] = $2
			steps[key] = $1
		} else if (index("," steps[key] ",", "," $1 ",") == 0) {
			steps[key] = steps[key] "," $1
		}
	}
	END { for (i = 1; i <= n; i++) print "   " steps[order[i]] ": " text[order[i]] }'
	if [ -s "$kdir/console-problems" ]; then
		sed -E 's/^\[ *[0-9.]+\] //' "$kdir/console-problems" | awk '!seen[$0]++' | sed -n '1,30s/^/   console: /p'
	fi
	if ! grep -q '^kernel-guest: done' "$kdir/console.log"; then
		echo "   the guest did not reach its end; last console lines:"
		tail -5 "$kdir/console.log" | sed 's/^/   | /'
	fi
}

mkdir -p "$out" "$cache"
rootfs=
[ "$arch" = amd64 ] || rootfs=$(userland)
for k in "${kernels[@]}"; do
	boot "$k"
done

echo
printf '%-8s' kernel
printf ' %-8s' "${expect_cols[@]}" console
printf ' %-4s %s\n' end time
failed=()
for k in "${kernels[@]}"; do
	verdict "$k" || failed+=("$k")
done
echo "(off:X: run, not required on that kernel; -: not run)"
for k in "${kernels[@]}"; do
	details "$k"
done
echo "kernels: $((${#kernels[@]} - ${#failed[@]})) passed, ${#failed[@]} failed"
if [ ${#failed[@]} -gt 0 ]; then
	echo "kernels: FAILED on ${failed[*]}" >&2
	exit 1
fi
