// Command image builds the autoglm-ebpf container image from a built binary,
// without a registry, a base image or a container daemon (`make image`).
//
// Each -binary (one per architecture: amd64, arm64; the ELF header says
// which) is linked against glibc (go-nvml is a cgo package), so its image's
// one layer holds it and the shared libraries it loads, taken from this
// machine's Debian multiarch folders for its architecture (the ELF's
// interpreter and needed libraries, resolved as the loader does, which
// works for a foreign architecture where ldd cannot run): nothing is
// pulled, and the image runs the glibc the binary was linked with. It
// records the Debian packages those files come from as distroless images
// do (dpkg.go), so that scanners see glibc's version, and an SPDX SBOM of
// each image (its Debian packages and the Go modules compiled into the
// binary) is written beside the archive (sbom.go). The archive is an OCI
// image layout whose index names one image index, of the image for each
// architecture, so that `podman load`, `ctr images import` and Docker
// with the containerd image store take the one of their machine. Docker's
// manifest.json beside it (what `docker save` writes since Docker 25) can
// give a tag only one image: it names the amd64 one, for Docker's classic
// image store and the tools that read `docker-archive:`. With -rootfs it
// writes the layer's files of its one binary to a folder instead, for
// deploy/Dockerfile, which copies them into an image FROM scratch.
//
//	go run ./deploy/image -binary bin/autoglm-ebpf -binary bin/arm64/autoglm-ebpf -version v1.2.3 -revision $(git rev-parse HEAD) -o bin/autoglm-ebpf-image.tar
//	go run ./deploy/image -binary bin/arm64/autoglm-ebpf -rootfs bin/image-root-arm64
package main

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// binaryPath is where the image keeps the tool (the Dockerfile's path too).
const binaryPath = "/usr/local/bin/autoglm-ebpf"

func main() {
	var o options
	flag.Func("binary", "the built tool, once for each architecture (required)", func(s string) error {
		o.binaries = append(o.binaries, s)
		return nil
	})
	flag.StringVar(&o.version, "version", "", "the version label and tag (required)")
	flag.StringVar(&o.revision, "revision", "", "the VCS revision label")
	flag.StringVar(&o.source, "source", "https://github.com/open-autoglm/autoglm-ebpf", "the source label")
	flag.StringVar(&o.repo, "repository", "ghcr.io/open-autoglm/autoglm-ebpf", "the image's name, without tag")
	flag.StringVar(&o.out, "o", "bin/autoglm-ebpf-image.tar", "the archive to write")
	flag.StringVar(&o.sbom, "sbom", "", "the SPDX SBOMs to write, PREFIX-ARCH.spdx.json (default prefix: the archive's name without .tar)")
	rootfs := flag.String("rootfs", "", "write the image's files of the one -binary to this folder (made anew) instead of an archive")
	created := flag.Int64("created", 0, "creation time and file times, seconds since the epoch (default: SOURCE_DATE_EPOCH, else 0), so that a build is reproducible")
	flag.Parse()
	if len(o.binaries) == 0 {
		fail(errors.New("-binary is required"))
	}
	if o.sbom == "" {
		o.sbom = strings.TrimSuffix(o.out, ".tar")
	}
	o.created = time.Unix(*created, 0).UTC()
	if *created == 0 {
		if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
			var sec int64
			if _, err := fmt.Sscan(s, &sec); err != nil {
				fail(fmt.Errorf("SOURCE_DATE_EPOCH %q: %w", s, err))
			}
			o.created = time.Unix(sec, 0).UTC()
		}
	}
	if *rootfs != "" {
		if len(o.binaries) != 1 {
			fail(fmt.Errorf("-rootfs writes the files of one -binary, not %d", len(o.binaries)))
		}
		if err := writeRootfs(o.binaries[0], *rootfs); err != nil {
			fail(err)
		}
		return
	}
	if err := build(o); err != nil {
		fail(err)
	}
}

// writeRootfs writes the files of the image's layer under dir.
func writeRootfs(binary, dir string) error {
	_, files, _, err := imageFiles(binary)
	if err != nil {
		return err
	}
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(dir, "tmp"), 0o755); err != nil {
		return err
	}
	if err := os.Chmod(filepath.Join(dir, "tmp"), 0o1777|os.ModeSticky); err != nil {
		return err
	}
	for _, f := range files {
		data, err := f.read()
		if err != nil {
			return err
		}
		dst := filepath.Join(dir, f.dst)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(dst, data, os.FileMode(f.mode)); err != nil {
			return err
		}
	}
	fmt.Printf("%s: %d files\n", dir, len(files))
	return nil
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "image:", err)
	os.Exit(1)
}

type options struct {
	binaries                                   []string
	version, revision, source, repo, out, sbom string
	created                                    time.Time
}

// archImage is the image of one architecture, and what its SBOM describes.
type archImage struct {
	platform platform
	binary   string
	img      v1.Image
	files    []file
	debs     []debPackage
}

func build(o options) error {
	if o.version == "" {
		return errors.New("-version is required")
	}
	tag, err := name.NewTag(o.repo + ":" + o.version)
	if err != nil {
		return fmt.Errorf("image name: %w", err)
	}
	var images []archImage
	for _, bin := range o.binaries {
		p, files, debs, err := imageFiles(bin)
		if err != nil {
			return err
		}
		if i := slices.IndexFunc(images, func(a archImage) bool { return a.platform.arch == p.arch }); i >= 0 {
			return fmt.Errorf("%s and %s are both %s binaries: one -binary for each architecture", images[i].binary, bin, p.arch)
		}
		img, err := archImageOf(o, p, files)
		if err != nil {
			return err
		}
		images = append(images, archImage{platform: p, binary: bin, img: img, files: files, debs: debs})
	}
	// The order of -binary does not change the archive.
	slices.SortFunc(images, func(a, b archImage) int { return strings.Compare(a.platform.arch, b.platform.arch) })
	if err := writeArchive(o.out, tag, images); err != nil {
		return err
	}
	for _, a := range images {
		if err := writeSBOM(o, tag, a); err != nil {
			return err
		}
	}
	return nil
}

// archImageOf returns the one-layer image of files for platform p.
func archImageOf(o options, p platform, files []file) (v1.Image, error) {
	layerTar, err := layer(files, o.created)
	if err != nil {
		return nil, err
	}
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(layerTar)), nil },
		tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	img, err := mutate.AppendLayers(mutate.MediaType(mutate.ConfigMediaType(empty.Image, types.OCIConfigJSON), types.OCIManifestSchema1), l)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS = p.arch, "linux"
	cf.Created = v1.Time{Time: o.created}
	cf.Config.Entrypoint = []string{binaryPath}
	cf.Config.Cmd = []string{"daemon"}
	cf.Config.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin"}
	// The daemon serves /metrics, /healthz and /readyz here.
	cf.Config.ExposedPorts = map[string]struct{}{"9464/tcp": {}}
	cf.Config.Labels = map[string]string{
		"org.opencontainers.image.title":    "autoglm-ebpf",
		"org.opencontainers.image.version":  o.version,
		"org.opencontainers.image.revision": o.revision,
		"org.opencontainers.image.source":   o.source,
		"org.opencontainers.image.created":  o.created.Format(time.RFC3339),
	}
	return mutate.ConfigFile(img, cf)
}

// file is one file of the layer: src on this machine (or data) at dst in
// the image.
type file struct {
	src, dst string
	data     []byte
	mode     int64
	// packaged: src is a file of an installed Debian package, which the
	// image records (dpkg.go).
	packaged bool
}

// read returns the file's content: through symlinks, since the loader wants
// the file.
func (f file) read() ([]byte, error) {
	if f.data != nil {
		return f.data, nil
	}
	return os.ReadFile(f.src)
}

// accounts name uid and gid 0, which the agent runs as: without them some
// runtimes cannot resolve the user's groups, and tools print no name.
var accounts = []file{
	{dst: "/etc/passwd", data: []byte("root:x:0:0:root:/:/usr/local/bin/autoglm-ebpf\n"), mode: 0o644},
	{dst: "/etc/group", data: []byte("root:x:0:\n"), mode: 0o644},
}

// release says which Debian release the libraries come from (files of
// base-files): Trivy reads etc/debian_version, Syft and Grype
// etc/os-release, to know whose security advisories apply.
var release = []string{"/etc/os-release", "/etc/debian_version"}

// platform is an architecture the image is built for: its Go and OCI
// name, its ELF machine, and Debian's multiarch triplet, whose folders
// hold its libraries.
type platform struct {
	arch    string
	machine elf.Machine
	triplet string
}

var platforms = []platform{
	{arch: "amd64", machine: elf.EM_X86_64, triplet: "x86_64-linux-gnu"},
	{arch: "arm64", machine: elf.EM_AARCH64, triplet: "aarch64-linux-gnu"},
}

// libraryDirs are where Debian's dynamic loader for p looks for a library
// that no ld.so.cache lists (the image has none), in its order.
func (p platform) libraryDirs() []string {
	return []string{"/lib/" + p.triplet, "/usr/lib/" + p.triplet, "/lib", "/usr/lib"}
}

// runtimeFiles returns the binary's platform, and the binary and the shared
// libraries it loads, each at the path the dynamic loader looks for it:
// its interpreter (PT_INTERP) at the path the binary names, and the
// libraries it and they need (DT_NEEDED), found in the platform's
// library folders of this machine.
func runtimeFiles(binary string) (platform, []file, error) {
	f, err := elf.Open(binary)
	if err != nil {
		return platform{}, nil, fmt.Errorf("%s: not an ELF executable: %w", binary, err)
	}
	defer f.Close()
	i := slices.IndexFunc(platforms, func(p platform) bool { return p.machine == f.Machine && f.Class == elf.ELFCLASS64 })
	if i < 0 {
		return platform{}, nil, fmt.Errorf("%s: a %v %v binary; the image is built for amd64 and arm64", binary, f.Class, f.Machine)
	}
	p := platforms[i]
	var interp string
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			b, err := io.ReadAll(prog.Open())
			if err != nil {
				return p, nil, fmt.Errorf("%s: its interpreter: %w", binary, err)
			}
			interp = strings.TrimRight(string(b), "\x00")
		}
	}
	if interp == "" {
		return p, nil, fmt.Errorf("%s has no interpreter: a static binary needs no image of this kind", binary)
	}
	files := []file{{src: binary, dst: binaryPath, mode: 0o755}, {src: interp, dst: interp, mode: 0o755, packaged: true}}
	// The loader is already loaded under its own name: libc's need of
	// it is met.
	found := map[string]bool{path.Base(interp): true}
	needs, err := needed(binary, p)
	if err != nil {
		return p, nil, err
	}
	for len(needs) > 0 {
		lib := needs[0]
		needs = needs[1:]
		if found[lib] {
			continue
		}
		found[lib] = true
		src, err := findLibrary(lib, p)
		if err != nil {
			return p, nil, fmt.Errorf("%s needs %s: %w", binary, lib, err)
		}
		files = append(files, file{src: src, dst: src, mode: 0o755, packaged: true})
		more, err := needed(src, p)
		if err != nil {
			return p, nil, err
		}
		needs = append(needs, more...)
	}
	// base-files is of the build machine's architecture; these two files
	// are text, the same in every architecture's package.
	for _, r := range release {
		files = append(files, file{src: r, dst: r, mode: 0o644, packaged: true})
	}
	return p, append(files, accounts...), nil
}

// needed returns the libraries (DT_NEEDED) of the ELF file at name, which
// must be of platform p.
func needed(name string, p platform) ([]string, error) {
	f, err := elf.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if f.Machine != p.machine {
		return nil, fmt.Errorf("%s is %v, not %s", name, f.Machine, p.arch)
	}
	libs, err := f.ImportedLibraries()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return libs, nil
}

// findLibrary returns the path of the library named lib in p's library
// folders.
func findLibrary(lib string, p platform) (string, error) {
	for _, dir := range p.libraryDirs() {
		cand := path.Join(dir, lib)
		f, err := elf.Open(cand)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return "", err
		}
		machine := f.Machine
		f.Close()
		if machine == p.machine {
			return cand, nil
		}
	}
	return "", fmt.Errorf("not in %s: install the Debian package that has it, for %s (apt-get install PACKAGE:%s)", strings.Join(p.libraryDirs(), ", "), p.arch, p.arch)
}

// imageFiles returns the binary's platform and the files of its image's
// layer: the binary, the files of Debian packages it needs, and what
// records those packages.
func imageFiles(binary string) (platform, []file, []debPackage, error) {
	p, files, err := runtimeFiles(binary)
	if err != nil {
		return p, nil, nil, err
	}
	debs, err := debianPackages(files)
	if err != nil {
		return p, nil, nil, err
	}
	return p, append(files, metadataFiles(debs)...), debs, nil
}

// layer returns the uncompressed tar of files, with their parent folders,
// owned by root, every time set to mtime: the same inputs give the same
// layer digest.
func layer(files []file, mtime time.Time) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	var addDirs func(dir string) error
	addDirs = func(dir string) error {
		if dir == "/" || dir == "." || dirs[dir] {
			return nil
		}
		if err := addDirs(path.Dir(dir)); err != nil {
			return err
		}
		dirs[dir] = true
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: strings.TrimPrefix(dir, "/") + "/", Mode: 0o755, ModTime: mtime, Format: tar.FormatPAX})
	}
	// /tmp for what the tool writes (the DaemonSet mounts an emptyDir on it).
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "tmp/", Mode: 0o1777, ModTime: mtime, Format: tar.FormatPAX}); err != nil {
		return nil, err
	}
	dirs["/tmp"] = true
	slices.SortFunc(files, func(a, b file) int { return strings.Compare(a.dst, b.dst) })
	for _, f := range files {
		data, err := f.read()
		if err != nil {
			return nil, err
		}
		if err := addDirs(path.Dir(f.dst)); err != nil {
			return nil, err
		}
		h := &tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(f.dst, "/"), Mode: f.mode, Size: int64(len(data)), ModTime: mtime, Format: tar.FormatPAX}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// writeArchive writes images as an OCI image layout (oci-layout,
// index.json, blobs/sha256/...) whose index.json names, with the tag, an
// image index of them (one image of several platforms, as `docker buildx`
// writes it: a tool that names images from index.json names that one, and
// takes its machine's platform from it), plus Docker's manifest.json
// naming the amd64 image's blobs (or the only image's), to a file beside
// out renamed over it.
func writeArchive(out string, tag name.Tag, images []archImage) error {
	blob := func(h v1.Hash) string { return "blobs/" + h.Algorithm + "/" + h.Hex }
	type entry struct {
		name string
		data []byte
	}
	entries := []entry{{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)}}
	written := map[string]bool{}
	add := func(h v1.Hash, data []byte) {
		if !written[blob(h)] {
			written[blob(h)] = true
			entries = append(entries, entry{blob(h), data})
		}
	}
	// The image index, without the artifactType that go-containerregistry's
	// mutate.AppendManifests gives each image (the config's media type,
	// which OCI 1.1 reserves for artifacts that are not images).
	index := v1.IndexManifest{SchemaVersion: 2, MediaType: types.OCIImageIndex}
	var docker []map[string]any
	for _, a := range images {
		img := a.img
		manifest, err := img.RawManifest()
		if err != nil {
			return err
		}
		mdigest, err := img.Digest()
		if err != nil {
			return err
		}
		config, err := img.RawConfigFile()
		if err != nil {
			return err
		}
		cdigest, err := img.ConfigName()
		if err != nil {
			return err
		}
		add(mdigest, manifest)
		add(cdigest, config)
		layers, err := img.Layers()
		if err != nil {
			return err
		}
		var layerNames []string
		for _, l := range layers {
			d, err := l.Digest()
			if err != nil {
				return err
			}
			rc, err := l.Compressed()
			if err != nil {
				return err
			}
			data, err := io.ReadAll(rc)
			rc.Close()
			if err != nil {
				return err
			}
			add(d, data)
			layerNames = append(layerNames, blob(d))
		}
		index.Manifests = append(index.Manifests, v1.Descriptor{MediaType: types.OCIManifestSchema1, Size: int64(len(manifest)), Digest: mdigest,
			Platform: &v1.Platform{OS: "linux", Architecture: a.platform.arch}})
		if a.platform.arch == "amd64" || len(images) == 1 {
			docker = []map[string]any{{"Config": blob(cdigest), "RepoTags": []string{tag.Name()}, "Layers": layerNames}}
		}
	}
	rawIndex, err := json.Marshal(index)
	if err != nil {
		return err
	}
	idigest, _, err := v1.SHA256(bytes.NewReader(rawIndex))
	if err != nil {
		return err
	}
	add(idigest, rawIndex)
	top, err := json.Marshal(v1.IndexManifest{
		SchemaVersion: 2,
		MediaType:     types.OCIImageIndex,
		Manifests: []v1.Descriptor{{
			MediaType: types.OCIImageIndex,
			Digest:    idigest,
			Size:      int64(len(rawIndex)),
			Annotations: map[string]string{
				// containerd (ctr images import) names the image from this,
				"io.containerd.image.name": tag.Name(),
				// the OCI tools from this.
				"org.opencontainers.image.ref.name": tag.TagStr(),
			},
		}},
	})
	if err != nil {
		return err
	}
	entries = append(entries, entry{"index.json", top})
	if docker != nil {
		manifestJSON, err := json.Marshal(docker)
		if err != nil {
			return err
		}
		entries = append(entries, entry{"manifest.json", manifestJSON})
	}

	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(out), "."+filepath.Base(out)+".tmp*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	tw := tar.NewWriter(tmp)
	dirs := map[string]bool{}
	for _, e := range entries {
		for _, dir := range []string{"blobs/", "blobs/sha256/"} {
			if strings.HasPrefix(e.name, dir) && !dirs[dir] {
				dirs[dir] = true
				if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: dir, Mode: 0o755}); err != nil {
					return err
				}
			}
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: e.name, Mode: 0o644, Size: int64(len(e.data))}); err != nil {
			return err
		}
		if _, err := tw.Write(e.data); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), out); err != nil {
		return err
	}
	for _, a := range images {
		d, err := a.img.Digest()
		if err != nil {
			return err
		}
		fmt.Printf("%s: %s (index %s) linux/%s %s\n", out, tag.Name(), idigest, a.platform.arch, d)
	}
	return nil
}
