package main

import (
	"bytes"
	"debug/buildinfo"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net/mail"
	"os"
	"path"
	"regexp"
	"runtime/debug"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/package-url/packageurl-go"
	spdxjson "github.com/spdx/tools-golang/json"
	"github.com/spdx/tools-golang/spdx/v2/common"
	spdx "github.com/spdx/tools-golang/spdx/v2/v2_3"
)

// The SBOM is a file beside the archive, not a file in the image: the
// image already tells scanners what it holds (dpkg's records of its Debian
// packages, and the Go build information in the binary), and Trivy reads
// any *.spdx.json it finds in an image as more packages, so a copy inside
// would list everything twice. It names the image by its manifest digest,
// which a file inside the image could not.

// noAssertion is SPDX's "this document does not say".
const noAssertion = "NOASSERTION"

// sbomPath is where the SBOM of arch's image goes.
func sbomPath(o options, arch string) string {
	return o.sbom + "-" + arch + ".spdx.json"
}

// writeSBOM writes the SPDX 2.3 JSON document of the image a to its
// sbomPath.
func writeSBOM(o options, tag name.Tag, a archImage) error {
	digest, err := a.img.Digest()
	if err != nil {
		return err
	}
	doc, err := sbom(o, tag, digest, a)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	if err := spdxjson.Write(doc, &buf, spdxjson.Indent("  ")); err != nil {
		return err
	}
	out := sbomPath(o, a.platform.arch)
	if err := os.WriteFile(out, buf.Bytes(), 0o644); err != nil {
		return err
	}
	fmt.Printf("%s: SPDX SBOM of %s@%s (linux/%s), %d packages\n", out, tag.Context().Name(), digest, a.platform.arch, len(doc.Packages))
	return nil
}

// sbom describes the image of one architecture, by its manifest digest:
// its Debian packages (in the operating system
// element, which is how Trivy tells whose advisories apply), and the Go
// module of the binary with the modules and the standard library compiled
// into it.
func sbom(o options, tag name.Tag, digest v1.Hash, a archImage) (*spdx.Document, error) {
	osID, osVersionID, debianVersion, err := osRelease(a.files)
	if err != nil {
		return nil, err
	}
	bi, err := buildinfo.ReadFile(a.binary)
	if err != nil {
		return nil, fmt.Errorf("the binary's Go build information: %w", err)
	}

	doc := &spdx.Document{
		SPDXVersion:    spdx.Version,
		DataLicense:    spdx.DataLicense,
		SPDXIdentifier: "DOCUMENT",
		DocumentName:   tag.Name(),
		// Unique per document, as SPDX asks: the digest names the image.
		DocumentNamespace: fmt.Sprintf("%s/spdx/%s@%s", o.source, tag.Name(), digest),
		CreationInfo: &spdx.CreationInfo{
			Creators: []common.Creator{{CreatorType: "Tool", Creator: "autoglm-ebpf-deploy-image-" + o.version}},
			Created:  o.created.Format(time.RFC3339),
		},
	}
	ids := map[common.ElementID]bool{}
	add := func(p *spdx.Package) (common.ElementID, error) {
		if ids[p.PackageSPDXIdentifier] {
			return "", fmt.Errorf("SBOM: two packages would be %s", p.PackageSPDXIdentifier)
		}
		ids[p.PackageSPDXIdentifier] = true
		p.PackageDownloadLocation = noAssertion
		// No licence is known in SPDX's terms: the Go build information
		// has none, and the copyright files of libc6 and base-files are
		// prose, not Debian's machine-readable format.
		p.PackageLicenseConcluded, p.PackageLicenseDeclared, p.PackageCopyrightText = noAssertion, noAssertion, noAssertion
		doc.Packages = append(doc.Packages, p)
		return p.PackageSPDXIdentifier, nil
	}
	relate := func(a common.ElementID, rel string, b common.ElementID) {
		doc.Relationships = append(doc.Relationships, &spdx.Relationship{
			RefA: common.MakeDocElementID("", string(a)), Relationship: rel, RefB: common.MakeDocElementID("", string(b))})
	}

	image, err := add(&spdx.Package{
		PackageSPDXIdentifier: "Image",
		PackageName:           tag.Context().Name(),
		PackageVersion:        o.version,
		PackageChecksums:      []common.Checksum{{Algorithm: common.SHA256, Value: digest.Hex}},
		PrimaryPackagePurpose: "CONTAINER",
		PackageExternalReferences: []*spdx.PackageExternalReference{purlRef(packageurl.NewPackageURL(packageurl.TypeOCI, "",
			path.Base(tag.Context().RepositoryStr()), digest.String(), packageurl.Qualifiers{
				{Key: "arch", Value: a.platform.arch}, {Key: "repository_url", Value: tag.Context().Name()}, {Key: "tag", Value: tag.TagStr()}}, ""))},
	})
	if err != nil {
		return nil, err
	}
	relate("DOCUMENT", common.TypeRelationshipDescribe, image)

	system, err := add(&spdx.Package{
		// Trivy takes an element whose ID starts so for the system.
		PackageSPDXIdentifier: spdxID("OperatingSystem", osID),
		PackageName:           osID,
		PackageVersion:        debianVersion,
		PrimaryPackagePurpose: "OPERATING-SYSTEM",
	})
	if err != nil {
		return nil, err
	}
	relate(image, common.TypeRelationshipContains, system)
	for _, d := range a.debs {
		qualifiers := packageurl.Qualifiers{{Key: "arch", Value: d.arch}, {Key: "distro", Value: osID + "-" + osVersionID}}
		if d.source != d.name || d.sourceVersion != d.version {
			// As Syft writes it, for Grype.
			upstream := d.source
			if d.sourceVersion != d.version {
				upstream += "@" + d.sourceVersion
			}
			qualifiers = append(qualifiers, packageurl.Qualifier{Key: "upstream", Value: upstream})
		}
		p := &spdx.Package{
			PackageSPDXIdentifier: spdxID("Package-deb", d.name),
			PackageName:           d.name,
			PackageVersion:        d.version,
			PackageSupplier:       supplier(d.maintainer),
			PackageHomePage:       d.homepage,
			// As Trivy writes it, and reads it back for the advisories.
			PackageSourceInfo:         fmt.Sprintf("built package from: %s %s", d.source, d.sourceVersion),
			PackageLicenseComments:    fmt.Sprintf("Debian records the licence in the package's copyright file, %s/%s/copyright in the image.", docDir, d.name),
			PackageExternalReferences: []*spdx.PackageExternalReference{purlRef(packageurl.NewPackageURL(packageurl.TypeDebian, osID, d.name, d.version, qualifiers, ""))},
		}
		id, err := add(p)
		if err != nil {
			return nil, err
		}
		relate(system, common.TypeRelationshipContains, id)
	}

	mainVersion := bi.Main.Version
	if mainVersion == "" || mainVersion == "(devel)" {
		// Built from a checkout without VCS stamping: the version the
		// binary reports, which is the image's.
		mainVersion = o.version
	}
	app, err := add(goModule(debug.Module{Path: bi.Main.Path, Version: mainVersion}, "APPLICATION"))
	if err != nil {
		return nil, err
	}
	relate(image, common.TypeRelationshipContains, app)
	// Scanners match the Go standard library's advisories against the
	// toolchain version, as "stdlib".
	goVersion, _, _ := strings.Cut(bi.GoVersion, " ")
	stdlib, err := add(&spdx.Package{
		PackageSPDXIdentifier: spdxID("Package-golang", "stdlib"),
		PackageName:           "stdlib",
		PackageVersion:        goVersion,
		PrimaryPackagePurpose: "LIBRARY",
		PackageExternalReferences: []*spdx.PackageExternalReference{purlRef(packageurl.NewPackageURL(packageurl.TypeGolang, "", "stdlib",
			strings.TrimPrefix(goVersion, "go"), nil, ""))},
	})
	if err != nil {
		return nil, err
	}
	relate(app, common.TypeRelationshipDependsOn, stdlib)
	for _, m := range bi.Deps {
		if m.Replace != nil {
			// The replacement is what was compiled.
			m = m.Replace
		}
		id, err := add(goModule(*m, "LIBRARY"))
		if err != nil {
			return nil, err
		}
		relate(app, common.TypeRelationshipDependsOn, id)
	}
	return doc, nil
}

// goModule is the SPDX package of a Go module.
func goModule(m debug.Module, purpose string) *spdx.Package {
	namespace, name := path.Split(m.Path)
	p := &spdx.Package{
		PackageSPDXIdentifier: spdxID("Package-golang", m.Path),
		PackageName:           m.Path,
		PackageVersion:        m.Version,
		PrimaryPackagePurpose: purpose,
		PackageExternalReferences: []*spdx.PackageExternalReference{purlRef(packageurl.NewPackageURL(packageurl.TypeGolang,
			strings.TrimSuffix(namespace, "/"), name, m.Version, nil, ""))},
	}
	// go.sum's "h1:" hash is the SHA-256 of the module's file list
	// (golang.org/x/mod/sumdb/dirhash); Syft writes it as this checksum too.
	if h1, ok := strings.CutPrefix(m.Sum, "h1:"); ok {
		if sum, err := base64.StdEncoding.DecodeString(h1); err == nil {
			p.PackageChecksums = []common.Checksum{{Algorithm: common.SHA256, Value: hex.EncodeToString(sum)}}
		}
	}
	return p
}

func purlRef(p *packageurl.PackageURL) *spdx.PackageExternalReference {
	return &spdx.PackageExternalReference{Category: common.CategoryPackageManager, RefType: common.TypePackageManagerPURL, Locator: p.ToString()}
}

// notIDChar is what an SPDX ID cannot hold (it is [A-Za-z0-9.-]+).
var notIDChar = regexp.MustCompile(`[^A-Za-z0-9.-]+`)

func spdxID(kind, name string) common.ElementID {
	return common.ElementID(kind + "-" + notIDChar.ReplaceAllString(name, "-"))
}

// supplier is the package's Debian maintainer, "Name <address>", as SPDX
// writes a supplier: an organization, since most are teams (GNU Libc
// Maintainers).
func supplier(maintainer string) *common.Supplier {
	a, err := mail.ParseAddress(maintainer)
	if err != nil || a.Name == "" {
		return &common.Supplier{Supplier: noAssertion}
	}
	return &common.Supplier{SupplierType: "Organization", Supplier: fmt.Sprintf("%s (%s)", a.Name, a.Address)}
}

// osRelease returns ID and VERSION_ID of the image's /etc/os-release, and
// its /etc/debian_version.
func osRelease(files []file) (id, versionID, debianVersion string, err error) {
	read := func(dst string) (string, error) {
		for _, f := range files {
			if f.dst == dst {
				data, err := f.read()
				return string(data), err
			}
		}
		return "", fmt.Errorf("the image has no %s", dst)
	}
	release, err := read("/etc/os-release")
	if err != nil {
		return "", "", "", err
	}
	for _, line := range strings.Split(release, "\n") {
		k, v, _ := strings.Cut(line, "=")
		v = strings.Trim(v, `"'`)
		switch k {
		case "ID":
			id = v
		case "VERSION_ID":
			versionID = v
		}
	}
	if id == "" || versionID == "" {
		return "", "", "", fmt.Errorf("/etc/os-release names no ID and VERSION_ID:\n%s", release)
	}
	dv, err := read("/etc/debian_version")
	return id, versionID, strings.TrimSpace(dv), err
}
