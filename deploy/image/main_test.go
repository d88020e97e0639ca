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
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/package-url/packageurl-go"
	spdxjson "github.com/spdx/tools-golang/json"
	"github.com/spdx/tools-golang/spdx"
	"github.com/spdx/tools-golang/spdx/v2/common"
	"github.com/spdx/tools-golang/spdxlib"
)

// tool builds the autoglm-ebpf binary with version v.
func tool(t *testing.T, v string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "autoglm-ebpf")
	cmd := exec.Command("go", "build", "-ldflags", "-X main.version="+v, "-o", bin, "../../cmd/autoglm-ebpf")
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

// The archive is an OCI layout and a Docker archive at once, holds the
// tool and the glibc it loads, carries the OCI labels, and is the same
// bytes when built twice from the same inputs. Where podman is installed
// (CI installs it), `podman load` takes it and the image runs `version`.
func TestImage(t *testing.T) {
	const version = "imagetest"
	bin := tool(t, version)
	out := t.TempDir()
	o := options{binary: bin, version: version, revision: "0123abc", source: "https://example.com/src", repo: "localhost/autoglm-ebpf-test",
		out: filepath.Join(out, "image.tar"), sbom: filepath.Join(out, "image.spdx.json"), created: time.Unix(1700000000, 0).UTC()}
	if err := build(o); err != nil {
		t.Fatal(err)
	}
	first, err := os.ReadFile(o.out)
	if err != nil {
		t.Fatal(err)
	}
	firstSBOM, err := os.ReadFile(o.sbom)
	if err != nil {
		t.Fatal(err)
	}
	if err := build(o); err != nil {
		t.Fatal(err)
	}
	if again, _ := os.ReadFile(o.out); !bytes.Equal(first, again) {
		t.Error("two builds from the same inputs differ")
	}
	if again, _ := os.ReadFile(o.sbom); !bytes.Equal(firstSBOM, again) {
		t.Error("two SBOMs from the same inputs differ")
	}

	// As an OCI image layout.
	dir := untar(t, o.out)
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil || len(im.Manifests) != 1 {
		t.Fatalf("index: %+v, %v", im, err)
	}
	ann := im.Manifests[0].Annotations
	if ann["io.containerd.image.name"] != "localhost/autoglm-ebpf-test:imagetest" || ann["org.opencontainers.image.ref.name"] != version {
		t.Errorf("index annotations %v", ann)
	}
	img, err := idx.Image(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	checkSBOM(t, o.sbom, im.Manifests[0].Digest.Hex)
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	labels := cf.Config.Labels
	if labels["org.opencontainers.image.version"] != version || labels["org.opencontainers.image.revision"] != "0123abc" ||
		labels["org.opencontainers.image.source"] != "https://example.com/src" {
		t.Errorf("labels %v", labels)
	}
	if !slices.Equal(cf.Config.Entrypoint, []string{binaryPath}) || !slices.Equal(cf.Config.Cmd, []string{"daemon"}) || cf.Architecture != "amd64" || cf.OS != "linux" {
		t.Errorf("config %+v", cf)
	}
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
			break
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
	for _, want := range []string{"usr/local/bin/autoglm-ebpf", "lib64/ld-linux-x86-64.so.2", "tmp/", "etc/passwd", "etc/group",
		"etc/os-release", "etc/debian_version", "var/lib/dpkg/status.d/libc6", "usr/share/doc/libc6/copyright"} {
		if !slices.Contains(names, want) {
			t.Errorf("layer lacks %s: %v", want, names)
		}
	}
	if !slices.ContainsFunc(names, func(n string) bool { return strings.HasSuffix(n, "/libc.so.6") }) {
		t.Errorf("layer lacks libc.so.6: %v", names)
	}
	checkPackageRecords(t, contents)

	// As a Docker archive (manifest.json).
	if _, err := tarball.ImageFromPath(o.out, nil); err != nil {
		t.Errorf("not a Docker archive: %v", err)
	}
	var docker []struct{ RepoTags []string }
	if b, err := os.ReadFile(filepath.Join(dir, "manifest.json")); err != nil || json.Unmarshal(b, &docker) != nil ||
		len(docker) != 1 || !slices.Equal(docker[0].RepoTags, []string{"localhost/autoglm-ebpf-test:imagetest"}) {
		t.Errorf("manifest.json: %+v, %v", docker, err)
	}

	requirePodman(t)
	if out := podman(t, "load", "-i", o.out); !strings.Contains(out, "localhost/autoglm-ebpf-test:imagetest") {
		t.Fatalf("podman load: %s", out)
	}
	runInPodman(t, "localhost/autoglm-ebpf-test:imagetest", "autoglm-ebpf "+version)
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

// checkSBOM checks that the SBOM is SPDX JSON that describes the image
// (by its manifest digest) and lists libc6 at this machine's version in
// the Debian system, and the Go standard library and modules of go.mod
// that the binary compiles in, at the versions of this toolchain and
// go.mod.
func checkSBOM(t *testing.T, path, digest string) {
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

	system := byName["debian"]
	if !related(image, "CONTAINS", system) || system.PrimaryPackagePurpose != "OPERATING-SYSTEM" {
		t.Errorf("the image contains no Debian system: %+v", system)
	}
	out, err := exec.Command("dpkg-query", "--show", "--showformat", "${Version}", "libc6:amd64").Output()
	if err != nil {
		t.Fatal(err)
	}
	if libc := byName["libc6"]; libc == nil || libc.PackageVersion != string(out) || !related(system, "CONTAINS", libc) {
		t.Errorf("libc6 %s is not in the Debian system: %+v", out, libc)
	} else if u := purl(libc); u.Type != "deb" || u.Namespace != "debian" || u.Version != string(out) || u.Qualifiers.Map()["arch"] != "amd64" {
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
	ref, pkgPath, err := owner("/usr/share/doc/libc6/copyright")
	if err != nil {
		t.Fatal(err)
	}
	p := debPackage{ref: ref, files: []packagedFile{{dst: "/usr/share/doc/libc6/copyright", pkgPath: pkgPath, md5: "00000000000000000000000000000000"}}}
	if err := p.load(); err == nil || !strings.Contains(err.Error(), "differs") {
		t.Errorf("a changed file: %v", err)
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

// deploy/Dockerfile builds offline from the files -rootfs writes (podman
// build here, as docker build would), with the labels given as build
// arguments, and the image runs.
func TestDockerfileBuild(t *testing.T) {
	const version = "dockerfiletest"
	requirePodman(t)
	bin := tool(t, version)
	ctx := t.TempDir()
	if err := writeRootfs(bin, filepath.Join(ctx, "bin", "image-root")); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"usr/local/bin/autoglm-ebpf", "lib64/ld-linux-x86-64.so.2"} {
		if _, err := os.Stat(filepath.Join(ctx, "bin", "image-root", name)); err != nil {
			t.Fatal(err)
		}
	}
	const ref = "localhost/autoglm-ebpf-dockerfile-test:" + version
	podman(t, "build", "-q", "-f", "../Dockerfile", "--ignorefile", "../Dockerfile.dockerignore",
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
