// Command image builds the autoglm-ebpf container image from a built binary,
// without a registry, a base image or a container daemon (`make image`).
//
// The binary is linked against glibc (go-nvml is a cgo package), so the one
// layer holds it and the shared libraries it loads, taken from this machine
// as ldd lists them: nothing is pulled, and the image runs the glibc the
// binary was linked with. It records the Debian packages those files come
// from as distroless images do (dpkg.go), so that scanners see glibc's
// version, and an SPDX SBOM of the image (its Debian packages and the Go
// modules compiled into the binary) is written beside the archive
// (sbom.go). The archive is an OCI image layout with Docker's
// manifest.json beside it (what `docker save` writes since Docker 25), so
// `docker load`, `podman load` and `ctr images import` all take it. With
// -rootfs it writes the layer's files to a folder instead, for
// deploy/Dockerfile, which copies them into an image FROM scratch.
//
//	go run ./deploy/image -binary bin/autoglm-ebpf -version v1.2.3 -revision $(git rev-parse HEAD) -o bin/autoglm-ebpf-image.tar
//	go run ./deploy/image -binary bin/autoglm-ebpf -rootfs bin/image-root
package main

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
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
	flag.StringVar(&o.binary, "binary", "bin/autoglm-ebpf", "the built tool")
	flag.StringVar(&o.version, "version", "", "the version label and tag (required)")
	flag.StringVar(&o.revision, "revision", "", "the VCS revision label")
	flag.StringVar(&o.source, "source", "https://github.com/open-autoglm/autoglm-ebpf", "the source label")
	flag.StringVar(&o.repo, "repository", "ghcr.io/open-autoglm/autoglm-ebpf", "the image's name, without tag")
	flag.StringVar(&o.out, "o", "bin/autoglm-ebpf-image.tar", "the archive to write")
	flag.StringVar(&o.sbom, "sbom", "", "the SPDX SBOM to write (default: the archive's name with .spdx.json for .tar)")
	rootfs := flag.String("rootfs", "", "write the image's files to this folder (made anew) instead of an archive")
	created := flag.Int64("created", 0, "creation time and file times, seconds since the epoch (default: SOURCE_DATE_EPOCH, else 0), so that a build is reproducible")
	flag.Parse()
	if o.sbom == "" {
		o.sbom = strings.TrimSuffix(o.out, ".tar") + ".spdx.json"
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
		if err := writeRootfs(o.binary, *rootfs); err != nil {
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
	files, _, err := imageFiles(binary)
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
	binary, version, revision, source, repo, out, sbom string
	created                                            time.Time
}

func build(o options) error {
	if o.version == "" {
		return errors.New("-version is required")
	}
	tag, err := name.NewTag(o.repo + ":" + o.version)
	if err != nil {
		return fmt.Errorf("image name: %w", err)
	}
	files, debs, err := imageFiles(o.binary)
	if err != nil {
		return err
	}
	layerTar, err := layer(files, o.created)
	if err != nil {
		return err
	}
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(layerTar)), nil },
		tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return err
	}
	img, err := mutate.AppendLayers(mutate.MediaType(mutate.ConfigMediaType(empty.Image, types.OCIConfigJSON), types.OCIManifestSchema1), l)
	if err != nil {
		return err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS = "amd64", "linux"
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
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return err
	}
	digest, err := writeArchive(o.out, tag, img)
	if err != nil {
		return err
	}
	return writeSBOM(o, tag, digest, files, debs)
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

// lddLine matches "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)"
// and "/lib64/ld-linux-x86-64.so.2 (0x...)".
var lddLine = regexp.MustCompile(`(?:=>\s*)?(/\S+)\s+\(0x[0-9a-f]+\)`)

// runtimeFiles lists the binary and the shared libraries it loads, each at
// the path the dynamic loader looks for it.
func runtimeFiles(binary string) ([]file, error) {
	out, err := exec.Command("ldd", binary).Output()
	if err != nil {
		return nil, fmt.Errorf("ldd %s: %w", binary, err)
	}
	files := []file{{src: binary, dst: binaryPath, mode: 0o755}}
	for _, line := range strings.Split(string(out), "\n") {
		if m := lddLine.FindStringSubmatch(line); m != nil {
			files = append(files, file{src: m[1], dst: m[1], mode: 0o755, packaged: true})
		}
	}
	if len(files) == 1 {
		return nil, fmt.Errorf("ldd %s listed no libraries: a static binary needs no image of this kind", binary)
	}
	for _, p := range release {
		files = append(files, file{src: p, dst: p, mode: 0o644, packaged: true})
	}
	return append(files, accounts...), nil
}

// imageFiles returns the files of the image's layer: the binary, the
// files of Debian packages it needs, and what records those packages.
func imageFiles(binary string) ([]file, []debPackage, error) {
	files, err := runtimeFiles(binary)
	if err != nil {
		return nil, nil, err
	}
	debs, err := debianPackages(files)
	if err != nil {
		return nil, nil, err
	}
	return append(files, metadataFiles(debs)...), debs, nil
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

// writeArchive writes img as an OCI image layout (oci-layout, index.json,
// blobs/sha256/...) plus Docker's manifest.json naming the same blobs, to
// a file beside out renamed over it, and returns the manifest's digest.
func writeArchive(out string, tag name.Tag, img v1.Image) (v1.Hash, error) {
	manifest, err := img.RawManifest()
	if err != nil {
		return v1.Hash{}, err
	}
	mdigest, err := img.Digest()
	if err != nil {
		return v1.Hash{}, err
	}
	config, err := img.RawConfigFile()
	if err != nil {
		return v1.Hash{}, err
	}
	cdigest, err := img.ConfigName()
	if err != nil {
		return v1.Hash{}, err
	}
	layers, err := img.Layers()
	if err != nil {
		return v1.Hash{}, err
	}
	blob := func(h v1.Hash) string { return "blobs/" + h.Algorithm + "/" + h.Hex }
	type entry struct {
		name string
		data []byte
	}
	entries := []entry{{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)}, {blob(mdigest), manifest}, {blob(cdigest), config}}
	var layerNames []string
	for _, l := range layers {
		d, err := l.Digest()
		if err != nil {
			return v1.Hash{}, err
		}
		rc, err := l.Compressed()
		if err != nil {
			return v1.Hash{}, err
		}
		data, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			return v1.Hash{}, err
		}
		entries = append(entries, entry{blob(d), data})
		layerNames = append(layerNames, blob(d))
	}
	index, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     types.OCIImageIndex,
		"manifests": []map[string]any{{
			"mediaType": types.OCIManifestSchema1,
			"digest":    mdigest.String(),
			"size":      len(manifest),
			"annotations": map[string]string{
				// containerd (ctr images import) names the image from this,
				"io.containerd.image.name": tag.Name(),
				// the OCI tools from this.
				"org.opencontainers.image.ref.name": tag.TagStr(),
			},
		}},
	})
	if err != nil {
		return v1.Hash{}, err
	}
	docker, err := json.Marshal([]map[string]any{{"Config": blob(cdigest), "RepoTags": []string{tag.Name()}, "Layers": layerNames}})
	if err != nil {
		return v1.Hash{}, err
	}
	entries = append(entries, entry{"index.json", index}, entry{"manifest.json", docker})

	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return v1.Hash{}, err
	}
	tmp, err := os.CreateTemp(filepath.Dir(out), "."+filepath.Base(out)+".tmp*")
	if err != nil {
		return v1.Hash{}, err
	}
	defer os.Remove(tmp.Name())
	tw := tar.NewWriter(tmp)
	written := map[string]bool{}
	for _, e := range entries {
		for _, dir := range []string{"blobs/", "blobs/sha256/"} {
			if strings.HasPrefix(e.name, dir) && !written[dir] {
				written[dir] = true
				if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: dir, Mode: 0o755}); err != nil {
					return v1.Hash{}, err
				}
			}
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: e.name, Mode: 0o644, Size: int64(len(e.data))}); err != nil {
			return v1.Hash{}, err
		}
		if _, err := tw.Write(e.data); err != nil {
			return v1.Hash{}, err
		}
	}
	if err := tw.Close(); err != nil {
		return v1.Hash{}, err
	}
	if err := tmp.Close(); err != nil {
		return v1.Hash{}, err
	}
	if err := os.Rename(tmp.Name(), out); err != nil {
		return v1.Hash{}, err
	}
	fmt.Printf("%s: %s (%s)\n", out, tag.Name(), mdigest)
	return mdigest, nil
}
