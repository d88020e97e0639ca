package main

import (
	"bytes"
	"crypto/md5"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
)

// The image has no package manager, but its libraries are files of the
// build machine's Debian packages. It records those packages as distroless
// images do, so that scanners (Trivy, Grype, Syft) see glibc and its
// version: each package's paragraph of dpkg's status database in
// /var/lib/dpkg/status.d/NAME, the checksums of its files in the image in
// status.d/NAME.md5sums (Syft reads them to know which files the package
// owns), and its copyright file in /usr/share/doc/NAME/copyright, which
// also carries its licence.
const (
	statusDir = "/var/lib/dpkg/status.d"
	docDir    = "/usr/share/doc"
)

// debPackage is an installed Debian package that files of the image come
// from, as the build machine's dpkg database describes it.
type debPackage struct {
	// ref names it to dpkg-query: NAME, or NAME:ARCH for a Multi-Arch:
	// same package.
	ref, name, arch, version string
	// source and sourceVersion: the source package it was built from
	// (security advisories are per source package: glibc, not libc6).
	source, sourceVersion string
	homepage, maintainer  string
	// status is its paragraph of /var/lib/dpkg/status, less Conffiles.
	status    []byte
	copyright []byte
	files     []packagedFile
}

// packagedFile is a file of the image that is a package's file, unchanged.
type packagedFile struct {
	dst string // where the image has it
	// pkgPath is where the package has it, as dpkg lists it; md5 the
	// checksum of its content, which is what dpkg recorded for pkgPath.
	pkgPath, md5 string
}

// usrMerged are the folders that Debian merged into /usr: the same file
// is /lib/x/libc.so.6 and /usr/lib/x/libc.so.6 on the machine, and dpkg
// lists it under either, depending on the release and the package.
var usrMerged = []string{"bin", "sbin", "lib", "lib32", "lib64", "libx32"}

// aliases returns p and the other name that the /usr merge gives it, if
// any.
func aliases(p string) []string {
	rest, usr := strings.CutPrefix(p, "/usr/")
	if !usr {
		rest = strings.TrimPrefix(p, "/")
	}
	top, _, _ := strings.Cut(rest, "/")
	if !slices.Contains(usrMerged, top) {
		return []string{p}
	}
	if usr {
		return []string{p, "/" + rest}
	}
	return []string{p, "/usr/" + rest}
}

// owner returns the installed package that lists the file at real (a path
// without symlinks), and the path it lists it under.
func owner(real string) (ref, pkgPath string, err error) {
	for _, p := range aliases(real) {
		out, err := exec.Command("dpkg-query", "--search", p).Output()
		var exit *exec.ExitError
		if errors.As(err, &exit) && exit.ExitCode() == 1 {
			continue // no package lists it under this name
		}
		if err != nil {
			return "", "", fmt.Errorf("dpkg-query --search %s: %w (the image records the Debian packages its libraries come from: build it on Debian or Ubuntu)", p, err)
		}
		var owners []string
		for _, line := range strings.Split(string(out), "\n") {
			// "libc6:amd64: /lib/x86_64-linux-gnu/libc.so.6"; "diversion
			// by ..." lines say where a file was moved, not who owns it.
			pkgs, listed, ok := strings.Cut(line, ": ")
			if ok && listed == p && !strings.HasPrefix(line, "diversion by ") {
				owners = append(owners, strings.Split(pkgs, ", ")...)
			}
		}
		if len(owners) != 1 {
			return "", "", fmt.Errorf("%s: dpkg lists it as %s of packages %v, want one package", real, p, owners)
		}
		return owners[0], p, nil
	}
	return "", "", fmt.Errorf("%s: no installed Debian package has this file (as %s), so the image could not say where it comes from", real, strings.Join(aliases(real), " or "))
}

// debianPackages returns the installed packages that the packaged files
// come from, sorted by name, each with the image's files of it. A file
// that no package has, or that differs from what its package installed,
// is an error: the image would claim a version its file is not.
func debianPackages(files []file) ([]debPackage, error) {
	byRef := map[string]*debPackage{}
	var refs []string
	for _, f := range files {
		if !f.packaged {
			continue
		}
		real, err := filepath.EvalSymlinks(f.src)
		if err != nil {
			return nil, err
		}
		ref, pkgPath, err := owner(real)
		if err != nil {
			return nil, err
		}
		data, err := os.ReadFile(real)
		if err != nil {
			return nil, err
		}
		sum := md5.Sum(data)
		if byRef[ref] == nil {
			byRef[ref] = &debPackage{ref: ref}
			refs = append(refs, ref)
		}
		byRef[ref].files = append(byRef[ref].files, packagedFile{dst: f.dst, pkgPath: pkgPath, md5: hex.EncodeToString(sum[:])})
	}
	var pkgs []debPackage
	for _, ref := range refs {
		p := byRef[ref]
		slices.SortFunc(p.files, func(a, b packagedFile) int { return strings.Compare(a.dst, b.dst) })
		if err := p.load(); err != nil {
			return nil, err
		}
		pkgs = append(pkgs, *p)
	}
	slices.SortFunc(pkgs, func(a, b debPackage) int { return strings.Compare(a.name, b.name) })
	for i := 1; i < len(pkgs); i++ {
		if pkgs[i].name == pkgs[i-1].name {
			// status.d/NAME has room for one.
			return nil, fmt.Errorf("files of both %s and %s", pkgs[i-1].ref, pkgs[i].ref)
		}
	}
	return pkgs, nil
}

// load reads the package's fields, status paragraph, checksums and
// copyright file from the machine, and checks its files against the
// checksums.
func (p *debPackage) load() error {
	const fields = "${Package}\t${Architecture}\t${Version}\t${source:Package}\t${source:Version}\t${Homepage}\t${Maintainer}\t${Conffiles}"
	out, err := exec.Command("dpkg-query", "--show", "--showformat", fields, p.ref).Output()
	if err != nil {
		return fmt.Errorf("dpkg-query --show %s: %w", p.ref, err)
	}
	v := strings.Split(string(out), "\t")
	if len(v) != 8 {
		return fmt.Errorf("dpkg-query --show %s: %q", p.ref, out)
	}
	p.name, p.arch, p.version, p.source, p.sourceVersion, p.homepage, p.maintainer = v[0], v[1], v[2], v[3], v[4], v[5], v[6]

	// What dpkg recorded of each file: md5sums for the package's files,
	// the Conffiles field for its configuration files.
	recorded := map[string]string{}
	md5sums, err := exec.Command("dpkg-query", "--control-show", p.ref, "md5sums").Output()
	if err != nil {
		return fmt.Errorf("dpkg-query --control-show %s md5sums: %w", p.ref, err)
	}
	for _, line := range strings.Split(string(md5sums), "\n") {
		if sum, name, ok := strings.Cut(line, "  "); ok {
			recorded["/"+name] = sum
		}
	}
	for _, line := range strings.Split(v[7], "\n") {
		// " /etc/debian_version 8031d1483ffa9c819e6be94c6c77fd2a [obsolete]"
		if f := strings.Fields(line); len(f) >= 2 {
			recorded[f[0]] = f[1]
		}
	}
	for _, f := range p.files {
		want, ok := recorded[f.pkgPath]
		if !ok {
			return fmt.Errorf("%s: dpkg has no checksum of %s, so the image could not say the file is the package's", p.ref, f.pkgPath)
		}
		if f.md5 != want {
			return fmt.Errorf("%s: %s differs from what %s %s installed (md5 %s, dpkg recorded %s): reinstall the package", f.dst, f.pkgPath, p.ref, p.version, f.md5, want)
		}
	}

	status, err := exec.Command("dpkg-query", "--status", p.ref).Output()
	if err != nil {
		return fmt.Errorf("dpkg-query --status %s: %w", p.ref, err)
	}
	p.status = withoutField(status, "Conffiles")
	if p.copyright, err = os.ReadFile(path.Join(docDir, p.name, "copyright")); err != nil {
		return fmt.Errorf("%s: its copyright file, which the image carries for its licence: %w", p.ref, err)
	}
	return nil
}

// withoutField returns the deb822 paragraph without the field name (its
// first line and the continuation lines, which start with a space or a
// tab). Conffiles goes: it names configuration files the image does not
// have.
func withoutField(paragraph []byte, name string) []byte {
	var out bytes.Buffer
	skipping := false
	for _, line := range strings.Split(string(paragraph), "\n") {
		if line == "" {
			continue
		}
		if line[0] != ' ' && line[0] != '\t' {
			field, _, _ := strings.Cut(line, ":")
			skipping = strings.EqualFold(field, name)
		}
		if !skipping {
			out.WriteString(line + "\n")
		}
	}
	return out.Bytes()
}

// metadataFiles returns the files that record pkgs in the image.
func metadataFiles(pkgs []debPackage) []file {
	var files []file
	for _, p := range pkgs {
		var md5sums strings.Builder
		for _, f := range p.files {
			fmt.Fprintf(&md5sums, "%s  %s\n", f.md5, strings.TrimPrefix(f.dst, "/"))
		}
		files = append(files,
			file{dst: path.Join(statusDir, p.name), data: p.status, mode: 0o644},
			file{dst: path.Join(statusDir, p.name+".md5sums"), data: []byte(md5sums.String()), mode: 0o644},
			file{dst: path.Join(docDir, p.name, "copyright"), data: p.copyright, mode: 0o644})
	}
	return files
}
