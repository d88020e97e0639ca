package main

import (
	"archive/tar"
	"bytes"
	"crypto/md5"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/package-url/packageurl-go"
	spdxjson "github.com/spdx/tools-golang/json"
	"github.com/spdx/tools-golang/spdx"
	"github.com/spdx/tools-golang/spdx/v2/common"
	"github.com/spdx/tools-golang/spdxlib"
)

// archFiles are the files of the loader and glibc that an image of each
// architecture must have, where its loader looks for them.
var archFiles = map[string][]string{
	"amd64": {"lib64/ld-linux-x86-64.so.2", "lib/x86_64-linux-gnu/libc.so.6"},
	"arm64": {"lib/ld-linux-aarch64.so.1", "lib/aarch64-linux-gnu/libc.so.6"},
}

// tool builds the autoglm-ebpf binary for arch (amd64 or arm64, cgo
// cross-built by Debian's aarch64 compiler, as `make build-arm64` does)
// with version v.
func tool(t *testing.T, v, arch string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "autoglm-ebpf-"+arch)
	cmd := exec.Command("go", "build", "-ldflags", "-X main.version="+v, "-o", bin, "../../cmd/autoglm-ebpf")
	cmd.Env = append(os.Environ(), "GOOS=linux", "GOARCH="+arch, "CGO_ENABLED=1")
	if arch == "arm64" {
		if _, err := exec.LookPath("aarch64-linux-gnu-gcc"); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatal("CI needs the aarch64 cross compiler (scripts/install-deps.sh test)")
			}
			t.Skip("the arm64 image needs aarch64-linux-gnu-gcc and libc6:arm64: scripts/install-deps.sh arm64")
		}
		cmd.Env = append(cmd.Env, "CC=aarch64-linux-gnu-gcc")
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// untar extracts archive into a new folder.
func untar(t *testing.T, archive string) string {
	t.Helper()
	dir := t.TempDir()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return dir
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, h.Name)
		if h.Typeflag == tar.TypeDir {
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// The archive is an OCI layout whose index.json names, with the tag, an
// image index of an amd64 and an arm64 image, each holding the tool and
// the glibc it loads for its architecture, with the OCI labels and its own
// SBOM; Docker's manifest.json names the amd64 image. The archive is the
// same bytes when built twice from the same inputs, in either order. Where
// podman is installed (CI installs it), `podman load` takes this machine's
// (amd64) image and it runs `version`; where qemu-aarch64-static is, the
// arm64 layer's tool runs `version` in a chroot of the layer, with only
// the layer's loader and glibc.
func TestImage(t *testing.T) {
	const version = "imagetest"
	bins := []string{tool(t, version, "amd64"), tool(t, version, "arm64")}
	out := t.TempDir()
	o := options{binaries: bins, version: version, revision: "0123abc", source: "https://example.com/src", repo: "localhost/autoglm-ebpf-test",
		out: filepath.Join(out, "image.tar"), sbom: filepath.Join(out, "image"), created: time.Unix(1700000000, 0).UTC()}
	if err := build(o); err != nil {
		t.Fatal(err)
	}
	first, err := os.ReadFile(o.out)
	if err != nil {
		t.Fatal(err)
	}
	firstSBOM, err := os.ReadFile(sbomPath(o, "arm64"))
	if err != nil {
		t.Fatal(err)
	}
	o.binaries = []string{bins[1], bins[0]}
	if err := build(o); err != nil {
		t.Fatal(err)
	}
	if again, _ := os.ReadFile(o.out); !bytes.Equal(first, again) {
		t.Error("two builds from the same inputs differ")
	}
	if again, _ := os.ReadFile(sbomPath(o, "arm64")); !bytes.Equal(firstSBOM, again) {
		t.Error("two SBOMs from the same inputs differ")
	}

	// As an OCI image layout.
	dir := untar(t, o.out)
	top, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	tm, err := top.IndexManifest()
	if err != nil || len(tm.Manifests) != 1 || tm.Manifests[0].MediaType != types.OCIImageIndex {
		t.Fatalf("index.json: %+v, %v", tm, err)
	}
	ann := tm.Manifests[0].Annotations
	if ann["io.containerd.image.name"] != "localhost/autoglm-ebpf-test:imagetest" || ann["org.opencontainers.image.ref.name"] != version {
		t.Errorf("index annotations %v", ann)
	}
	idx, err := top.ImageIndex(tm.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	var platforms []string
	layerOf := map[string]map[string][]byte{}
	for _, m := range im.Manifests {
		if m.Platform == nil {
			t.Fatalf("the image index's %s has no platform", m.Digest)
		}
		arch := m.Platform.Architecture
		platforms = append(platforms, m.Platform.OS+"/"+arch)
		img, err := idx.Image(m.Digest)
		if err != nil {
			t.Fatal(err)
		}
		checkSBOM(t, sbomPath(o, arch), m.Digest.Hex, arch)
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		labels := cf.Config.Labels
		if labels["org.opencontainers.image.version"] != version || labels["org.opencontainers.image.revision"] != "0123abc" ||
			labels["org.opencontainers.image.source"] != "https://example.com/src" {
			t.Errorf("%s: labels %v", arch, labels)
		}
		if !slices.Equal(cf.Config.Entrypoint, []string{binaryPath}) || !slices.Equal(cf.Config.Cmd, []string{"daemon"}) || cf.Architecture != arch || cf.OS != "linux" {
			t.Errorf("%s: config %+v", arch, cf)
		}
		names, contents := layerFiles(t, img)
		layerOf[arch] = contents
		for _, want := range append([]string{"usr/local/bin/autoglm-ebpf", "tmp/", "etc/passwd", "etc/group",
			"etc/os-release", "etc/debian_version", "var/lib/dpkg/status.d/libc6", "usr/share/doc/libc6/copyright"}, archFiles[arch]...) {
			if !slices.Contains(names, want) {
				t.Errorf("%s: layer lacks %s: %v", arch, want, names)
			}
		}
		checkPackageRecords(t, contents)
	}
	if !slices.Equal(platforms, []string{"linux/amd64", "linux/arm64"}) {
		t.Errorf("the image index's platforms %v", platforms)
	}

	// As a Docker archive (manifest.json): the amd64 image.
	dimg, err := tarball.ImageFromPath(o.out, nil)
	if err != nil {
		t.Fatalf("not a Docker archive: %v", err)
	}
	if cf, err := dimg.ConfigFile(); err != nil || cf.Architecture != "amd64" {
		t.Errorf("manifest.json's image: %+v, %v", cf, err)
	}
	var docker []struct{ RepoTags []string }
	if b, err := os.ReadFile(filepath.Join(dir, "manifest.json")); err != nil || json.Unmarshal(b, &docker) != nil ||
		len(docker) != 1 || !slices.Equal(docker[0].RepoTags, []string{"localhost/autoglm-ebpf-test:imagetest"}) {
		t.Errorf("manifest.json: %+v, %v", docker, err)
	}

	t.Run("arm64 under qemu", func(t *testing.T) { runArm64Layer(t, layerOf["arm64"], "autoglm-ebpf "+version) })

	requirePodman(t)
	if out := podman(t, "load", "-i", o.out); !strings.Contains(out, "localhost/autoglm-ebpf-test:imagetest") {
		t.Fatalf("podman load: %s", out)
	}
	if arch := strings.TrimSpace(podman(t, "image", "inspect", "--format", "{{.Architecture}}", "localhost/autoglm-ebpf-test:imagetest")); arch != "amd64" {
		t.Errorf("podman loaded the %s image on amd64", arch)
	}
	runInPodman(t, "localhost/autoglm-ebpf-test:imagetest", "autoglm-ebpf "+version)
}

// layerFiles returns the names in the image's one layer, and the content
// of its regular files.
func layerFiles(t *testing.T, img v1.Image) ([]string, map[string][]byte) {
	t.Helper()
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("%d layers, %v", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	var names []string
	contents := map[string][]byte{}
	for tr := tar.NewReader(rc); ; {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return names, contents
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
		if h.Typeflag == tar.TypeReg {
			if contents[h.Name], err = io.ReadAll(tr); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// runArm64Layer writes the arm64 layer's files to a folder and runs its
// tool with `version` chrooted there by qemu-aarch64-static (copied in):
// the loader and glibc it finds are the layer's, at the paths the image
// has them. It needs root (chroot) and qemu-user-static, which CI has.
func runArm64Layer(t *testing.T, layer map[string][]byte, want string) {
	qemu, err := exec.LookPath("qemu-aarch64-static")
	if err != nil || os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("CI needs qemu-user-static and root (scripts/install-deps.sh test)")
		}
		t.Skip("root and qemu-aarch64-static needed to run the arm64 layer")
	}
	root := t.TempDir()
	for name, data := range layer {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	data, err := os.ReadFile(qemu)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "qemu-aarch64"), data, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("/qemu-aarch64", binaryPath, "version")
	cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: root}
	cmd.Dir = "/"
	out, err := cmd.CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != want {
		t.Errorf("the arm64 layer's tool with `version`: %q, %v; want %q", out, err, want)
	}
}

// checkPackageRecords checks that the layer's files record the Debian
// packages of its files as this machine's dpkg has them: every file that
// is not the tool's own is in a package's status.d/NAME.md5sums with its
// checksum; each package's status.d/NAME has this machine's version of it
// and its copyright file is there; libc6 is one of them.
func checkPackageRecords(t *testing.T, layer map[string][]byte) {
	t.Helper()
	const status = "var/lib/dpkg/status.d/"
	ours := func(name string) bool {
		return slices.Contains([]string{"usr/local/bin/autoglm-ebpf", "etc/passwd", "etc/group"}, name) ||
			strings.HasPrefix(name, status) || strings.HasPrefix(name, "usr/share/doc/")
	}
	listed := map[string]string{} // file → its checksum in an md5sums
	var pkgs []string
	for name, data := range layer {
		pkg, ok := strings.CutPrefix(name, status)
		if !ok {
			continue
		}
		if pkg, ok := strings.CutSuffix(pkg, ".md5sums"); ok {
			for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
				sum, file, ok := strings.Cut(line, "  ")
				if !ok {
					t.Errorf("%s: line %q", name, line)
				}
				listed[file] = sum
				if _, ok := layer[file]; !ok {
					t.Errorf("%s lists %s, which the layer lacks", pkg, file)
				}
			}
			continue
		}
		pkgs = append(pkgs, pkg)
		fields := map[string]string{}
		for _, line := range strings.Split(string(data), "\n") {
			if k, v, ok := strings.Cut(line, ": "); ok && !strings.HasPrefix(line, " ") {
				fields[k] = v
			}
		}
		if fields["Package"] != pkg {
			t.Errorf("%s: Package %q", name, fields["Package"])
		}
		if _, ok := fields["Conffiles"]; ok {
			t.Errorf("%s names configuration files the image lacks:\n%s", name, data)
		}
		out, err := exec.Command("dpkg-query", "--show", "--showformat", "${Version}", pkg+":"+fields["Architecture"]).Output()
		if err != nil || fields["Version"] != string(out) {
			t.Errorf("%s: Version %q, this machine has %q (%v)", name, fields["Version"], out, err)
		}
		copyright, err := os.ReadFile("/usr/share/doc/" + pkg + "/copyright")
		if err != nil || !bytes.Equal(layer["usr/share/doc/"+pkg+"/copyright"], copyright) {
			t.Errorf("the layer's copyright file of %s is not this machine's (%v)", pkg, err)
		}
	}
	if !slices.Contains(pkgs, "libc6") {
		t.Errorf("no status.d/libc6: %v", pkgs)
	}
	for name, data := range layer {
		if ours(name) {
			continue
		}
		if sum := md5.Sum(data); listed[name] != hex.EncodeToString(sum[:]) {
			t.Errorf("%s: md5 %x, its package's md5sums says %q", name, sum, listed[name])
		}
	}
}

// checkSBOM checks that the SBOM is SPDX JSON that describes the image of
// arch (by its manifest digest) and lists libc6 of arch at this machine's
// version in
// the Debian system, and the Go standard library and modules of go.mod
// that the binary compiles in, at the versions of this toolchain and
// go.mod.
func checkSBOM(t *testing.T, path, digest, arch string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	doc, err := spdxjson.Read(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if err := spdxlib.ValidateDocument(doc); err != nil {
		t.Error(err)
	}
	if doc.SPDXVersion != "SPDX-2.3" {
		t.Errorf("spdxVersion %q", doc.SPDXVersion)
	}
	described, err := spdxlib.GetDescribedPackageIDs(doc)
	if err != nil || len(described) != 1 {
		t.Fatalf("described: %v, %v", described, err)
	}
	byID := map[common.ElementID]*spdx.Package{}
	byName := map[string]*spdx.Package{}
	for _, p := range doc.Packages {
		byID[p.PackageSPDXIdentifier] = p
		byName[p.PackageName] = p
	}
	image := byID[described[0]]
	if image == nil || len(image.PackageChecksums) != 1 || image.PackageChecksums[0].Value != digest || image.PrimaryPackagePurpose != "CONTAINER" {
		t.Errorf("the described package is not the image %s: %+v", digest, image)
	}
	related := func(a *spdx.Package, rel string, b *spdx.Package) bool {
		return a != nil && b != nil && slices.ContainsFunc(doc.Relationships, func(r *spdx.Relationship) bool {
			return r.RefA.ElementRefID == a.PackageSPDXIdentifier && r.Relationship == rel && r.RefB.ElementRefID == b.PackageSPDXIdentifier
		})
	}
	purl := func(p *spdx.Package) packageurl.PackageURL {
		for _, r := range p.PackageExternalReferences {
			if r.RefType == "purl" {
				u, err := packageurl.FromString(r.Locator)
				if err != nil {
					t.Errorf("%s: %v", p.PackageName, err)
				}
				return u
			}
		}
		t.Errorf("%s has no purl", p.PackageName)
		return packageurl.PackageURL{}
	}

	if image != nil && purl(image).Qualifiers.Map()["arch"] != arch {
		t.Errorf("the image's purl %s: want arch %s", purl(image), arch)
	}

	system := byName["debian"]
	if !related(image, "CONTAINS", system) || system.PrimaryPackagePurpose != "OPERATING-SYSTEM" {
		t.Errorf("the image contains no Debian system: %+v", system)
	}
	out, err := exec.Command("dpkg-query", "--show", "--showformat", "${Version}", "libc6:"+arch).Output()
	if err != nil {
		t.Fatal(err)
	}
	if libc := byName["libc6"]; libc == nil || libc.PackageVersion != string(out) || !related(system, "CONTAINS", libc) {
		t.Errorf("libc6 %s is not in the Debian system: %+v", out, libc)
	} else if u := purl(libc); u.Type != "deb" || u.Namespace != "debian" || u.Version != string(out) || u.Qualifiers.Map()["arch"] != arch {
		t.Errorf("libc6's purl %s", u)
	}

	app := byName["github.com/open-autoglm/autoglm-ebpf"]
	if !related(image, "CONTAINS", app) {
		t.Errorf("the image contains no autoglm-ebpf module: %+v", app)
	}
	goVersion, err := exec.Command("go", "env", "GOVERSION").Output()
	if err != nil {
		t.Fatal(err)
	}
	if std := byName["stdlib"]; std == nil || std.PackageVersion != strings.TrimSpace(string(goVersion)) || !related(app, "DEPENDS_ON", std) {
		t.Errorf("stdlib is not Go's %s: %+v", goVersion, std)
	}
	for _, mod := range []string{"github.com/cilium/ebpf", "github.com/NVIDIA/go-nvml", "github.com/prometheus/client_golang"} {
		version, err := exec.Command("go", "list", "-m", "-f", "{{.Version}}", mod).Output()
		if err != nil {
			t.Fatal(err)
		}
		want := strings.TrimSpace(string(version))
		p := byName[mod]
		if p == nil || p.PackageVersion != want || !related(app, "DEPENDS_ON", p) {
			t.Errorf("%s is not listed at go.mod's %s: %+v", mod, want, p)
			continue
		}
		// The purl parser lowercases Go paths.
		if u := purl(p); u.Type != "golang" || !strings.EqualFold(u.Namespace+"/"+u.Name, mod) || u.Version != want {
			t.Errorf("%s's purl %s", mod, u)
		}
		if len(p.PackageChecksums) != 1 {
			t.Errorf("%s has no checksum from go.sum: %+v", mod, p.PackageChecksums)
		}
	}
}

// A file that no package has is an error that names it, and so is a file
// whose checksum is not what dpkg recorded for it.
func TestPackageErrors(t *testing.T) {
	stray := filepath.Join(t.TempDir(), "libstray.so")
	if err := os.WriteFile(stray, []byte("stray"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := debianPackages([]file{{src: stray, dst: "/lib/libstray.so", packaged: true}}); err == nil || !strings.Contains(err.Error(), stray) {
		t.Errorf("a file of no package: %v", err)
	}
	// base-files has one architecture here (libc6's copyright is of
	// libc6:amd64 and libc6:arm64 both).
	ref, pkgPath, err := owner("/usr/share/doc/base-files/copyright")
	if err != nil {
		t.Fatal(err)
	}
	p := debPackage{ref: ref, files: []packagedFile{{dst: "/usr/share/doc/base-files/copyright", pkgPath: pkgPath, md5: "00000000000000000000000000000000"}}}
	if err := p.load(); err == nil || !strings.Contains(err.Error(), "differs") {
		t.Errorf("a changed file: %v", err)
	}
}

// Two binaries of one architecture, and a file that is not an amd64 or
// arm64 ELF executable, are errors that name them.
func TestBinaryErrors(t *testing.T) {
	bin := tool(t, "errtest", "amd64")
	o := options{binaries: []string{bin, bin}, version: "errtest", repo: "localhost/x", out: filepath.Join(t.TempDir(), "image.tar")}
	if err := build(o); err == nil || !strings.Contains(err.Error(), "both amd64") {
		t.Errorf("two amd64 binaries: %v", err)
	}
	text := filepath.Join(t.TempDir(), "script")
	if err := os.WriteFile(text, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, _, err := runtimeFiles(text); err == nil || !strings.Contains(err.Error(), text) {
		t.Errorf("a script: %v", err)
	}
}

// dpkg lists a file under /lib or /usr/lib, whichever its package ships:
// both names are tried.
func TestAliases(t *testing.T) {
	for _, c := range []struct {
		in   string
		want []string
	}{
		{"/usr/lib/x86_64-linux-gnu/libc.so.6", []string{"/usr/lib/x86_64-linux-gnu/libc.so.6", "/lib/x86_64-linux-gnu/libc.so.6"}},
		{"/lib64/ld-linux-x86-64.so.2", []string{"/lib64/ld-linux-x86-64.so.2", "/usr/lib64/ld-linux-x86-64.so.2"}},
		{"/usr/bin/env", []string{"/usr/bin/env", "/bin/env"}},
		{"/usr/share/doc/libc6/copyright", []string{"/usr/share/doc/libc6/copyright"}},
		{"/etc/os-release", []string{"/etc/os-release"}},
		{"/library/x", []string{"/library/x"}},
	} {
		if got := aliases(c.in); !slices.Equal(got, c.want) {
			t.Errorf("aliases(%s) = %v, want %v", c.in, got, c.want)
		}
	}
}

// deploy/Dockerfile builds offline from the files -rootfs writes for the
// target architecture (podman build here, as docker build would, with the
// TARGETARCH it sets), with the labels given as build arguments, and the
// image runs.
func TestDockerfileBuild(t *testing.T) {
	const version = "dockerfiletest"
	requirePodman(t)
	bin := tool(t, version, "amd64")
	ctx := t.TempDir()
	root := filepath.Join(ctx, "bin", "image-root-amd64")
	if err := writeRootfs(bin, root); err != nil {
		t.Fatal(err)
	}
	for _, name := range append([]string{"usr/local/bin/autoglm-ebpf"}, archFiles["amd64"]...) {
		if _, err := os.Stat(filepath.Join(root, name)); err != nil {
			t.Fatal(err)
		}
	}
	const ref = "localhost/autoglm-ebpf-dockerfile-test:" + version
	podman(t, "build", "-q", "-f", "../Dockerfile", "--ignorefile", "../Dockerfile.dockerignore", "--platform", "linux/amd64",
		"--build-arg", "VERSION="+version, "--build-arg", "REVISION=0123abc", "-t", ref, ctx)
	t.Cleanup(func() { _ = exec.Command("podman", "rmi", "-f", ref).Run() })
	labels := podman(t, "inspect", "--format", "{{json .Config.Labels}}", ref)
	for _, want := range []string{`"org.opencontainers.image.version":"` + version + `"`, `"org.opencontainers.image.revision":"0123abc"`} {
		if !strings.Contains(labels, want) {
			t.Errorf("labels %s: want %s", labels, want)
		}
	}
	runInPodman(t, ref, "autoglm-ebpf "+version)
}

// requirePodman skips without podman and root, except in CI.
func requirePodman(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("podman"); err != nil || os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("CI needs podman and root (scripts/install-deps.sh test)")
		}
		t.Skip("podman as root needed to load, build and run the image")
	}
}

func podman(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("podman", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("podman %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// runInPodman runs the image's entrypoint with `version`, and removes the
// image at the end of the test.
func runInPodman(t *testing.T, ref, want string) {
	t.Helper()
	t.Cleanup(func() { _ = exec.Command("podman", "rmi", "-f", ref).Run() })
	// runc rather than Debian's default crun, which refuses hybrid
	// cgroups (v1 controllers, v2 mounted beside them) as this machine
	// has; limits lowered because root here may not raise them (no
	// CAP_SYS_RESOURCE), which podman's defaults would.
	out := podman(t, "--runtime", "runc", "run", "--rm", "--network=none", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024", ref, "version")
	if strings.TrimSpace(out) != want {
		t.Errorf("the image's entrypoint with `version`: %q, want %q", out, want)
	}
}
