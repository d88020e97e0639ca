//go:build e2e

package e2e

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"regexp"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// imageFile is one file of a test image: its path there and where it is
// read from here.
type imageFile struct{ dst, src string }

// writeImage writes a one-layer image of files (and the shared libraries
// ldd lists for each, at their paths here) to archive in `docker save`
// form, which `ctr images import` takes.
func writeImage(archive, ref string, entrypoint []string, files []imageFile) error {
	seen := map[string]bool{}
	var all []imageFile
	for _, f := range files {
		all = append(all, f)
		libs, err := sharedLibraries(f.src)
		if err != nil {
			return err
		}
		for _, l := range libs {
			if !seen[l] {
				seen[l] = true
				all = append(all, imageFile{dst: l, src: l})
			}
		}
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	for _, f := range all {
		data, err := os.ReadFile(f.src)
		if err != nil {
			return err
		}
		var parents []string
		for d := path.Dir(f.dst); d != "/" && !dirs[d]; d = path.Dir(d) {
			dirs[d] = true
			parents = append([]string{d}, parents...)
		}
		for _, d := range parents {
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d[1:] + "/", Mode: 0o755, ModTime: time.Unix(0, 0)}); err != nil {
				return err
			}
		}
		if err := tw.WriteHeader(&tar.Header{Name: f.dst[1:], Mode: 0o755, Size: int64(len(data)), ModTime: time.Unix(0, 0)}); err != nil {
			return err
		}
		if _, err := tw.Write(data); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf.Bytes())), nil })
	if err != nil {
		return err
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS, cf.Config.Entrypoint = "amd64", "linux", entrypoint
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return err
	}
	tag, err := name.NewTag(ref)
	if err != nil {
		return err
	}
	return tarball.WriteToFile(archive, tag, img)
}

var lddPath = regexp.MustCompile(`(?m)(?:=> )?(/\S+) \(0x`)

// sharedLibraries are the libraries ldd lists for a dynamic executable or
// library (none for a static one), the loader included.
func sharedLibraries(file string) ([]string, error) {
	out, err := exec.Command("ldd", file).CombinedOutput()
	if bytes.Contains(out, []byte("not a dynamic executable")) || bytes.Contains(out, []byte("statically linked")) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("ldd %s: %v: %s", file, err, out)
	}
	var libs []string
	for _, m := range lddPath.FindAllSubmatch(out, -1) {
		// Read through symlinks: the image has the name the loader asks
		// for, with the content of the file it resolves to here.
		libs = append(libs, string(m[1]))
	}
	return libs, nil
}
