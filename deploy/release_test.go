package deploy

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"debug/elf"
	"debug/macho"
	"encoding/hex"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// TestReleaseScript runs scripts/release.sh for this machine's platform
// and checks what a user gets: an archive with the binary, LICENSE,
// README.md and the docs/ pages, in which every relative link resolves
// inside the archive, a SHA256SUMS that matches it, and a binary stamped
// with the version that runs.
func TestReleaseScript(t *testing.T) {
	if os.Getenv("FENCEGATE_QUICK") == "1" {
		t.Skip("FENCEGATE_QUICK: builds the binary once more")
	}
	dist := t.TempDir()
	cmd := exec.Command("bash", "../scripts/release.sh", "v9.8.7-test")
	cmd.Env = append(os.Environ(), "RELEASE_DIR="+dist, "RELEASE_PLATFORMS="+runtime.GOOS+"/"+runtime.GOARCH)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("release.sh: %v\n%s", err, out)
	}
	name := "fencegate_v9.8.7-test_" + runtime.GOOS + "_" + runtime.GOARCH
	archive := filepath.Join(dist, name+".tar.gz")
	raw, err := os.ReadFile(archive)
	if err != nil {
		t.Fatal(err)
	}
	sums, err := os.ReadFile(filepath.Join(dist, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(raw)
	if want := hex.EncodeToString(sum[:]) + "  " + name + ".tar.gz\n"; string(sums) != want {
		t.Fatalf("SHA256SUMS = %q, want %q", sums, want)
	}

	zr, err := gzip.NewReader(strings.NewReader(string(raw)))
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	var files []string
	unpacked := t.TempDir()
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, h.Name)
		if h.Typeflag != tar.TypeReg || !strings.HasPrefix(h.Name, name+"/") || strings.Contains(h.Name, "..") {
			continue
		}
		path := filepath.Join(unpacked, filepath.FromSlash(h.Name))
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY, os.FileMode(h.Mode)&0o755|0o600)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(f, tr); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	for _, want := range []string{name + "/fencegate", name + "/LICENSE", name + "/README.md", name + "/docs/access.md", name + "/docs/tls.md"} {
		if !slices.Contains(files, want) {
			t.Errorf("the archive lacks %s: %v", want, files)
		}
	}
	checkArchiveLinks(t, filepath.Join(unpacked, name))
	bin := filepath.Join(unpacked, name, "fencegate")
	out, err := exec.Command(bin, "version").Output()
	if err != nil || !strings.Contains(string(out), "v9.8.7-test") {
		t.Fatalf("the archived binary's version: %q, %v", out, err)
	}
	if out, err := exec.Command("bash", "../scripts/release.sh").CombinedOutput(); err == nil {
		t.Fatalf("release.sh without a version succeeded: %s", out)
	}
}

var mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// checkArchiveLinks checks that every relative link of every Markdown file
// under root (an unpacked archive) names a file or directory under root:
// a reader of the archive's README and docs/ follows no dead link.
func checkArchiveLinks(t *testing.T, root string) {
	t.Helper()
	pages := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".md") {
			return err
		}
		pages++
		text, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		for _, m := range mdLink.FindAllStringSubmatch(string(text), -1) {
			target, _, _ := strings.Cut(m[1], "#")
			if target == "" || strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			abs := filepath.Join(filepath.Dir(path), filepath.FromSlash(target))
			if !strings.HasPrefix(abs, root+string(filepath.Separator)) {
				t.Errorf("archive %s: link %q leaves the archive", rel, m[1])
				continue
			}
			if _, err := os.Stat(abs); err != nil {
				t.Errorf("archive %s: link %q is dead: the archive lacks %s (add it to scripts/release.sh)", rel, m[1], filepath.ToSlash(strings.TrimPrefix(abs, root+string(filepath.Separator))))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if pages < 2 {
		t.Fatalf("the archive holds %d Markdown pages, want the README and docs/", pages)
	}
}

// TestReleaseScriptBuildsForAnotherOS runs scripts/release.sh for a
// platform of its default list on another operating system than this
// machine's (macOS; Linux on a Mac) and checks that the archive holds a
// binary for it. The event loops and several helpers are Linux-only: a
// file without its build constraint breaks every other platform's build,
// which TestReleaseScript, building for this machine, cannot see.
func TestReleaseScriptBuildsForAnotherOS(t *testing.T) {
	if os.Getenv("FENCEGATE_QUICK") == "1" {
		t.Skip("FENCEGATE_QUICK: builds the binary for another platform")
	}
	goos, goarch := "darwin", "arm64"
	if runtime.GOOS == "darwin" {
		goos, goarch = "linux", "amd64"
	}
	dist := t.TempDir()
	cmd := exec.Command("bash", "../scripts/release.sh", "v9.8.7-test")
	cmd.Env = append(os.Environ(), "RELEASE_DIR="+dist, "RELEASE_PLATFORMS="+goos+"/"+goarch)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("release.sh for %s/%s: %v\n%s", goos, goarch, err, out)
	}
	name := "fencegate_v9.8.7-test_" + goos + "_" + goarch
	f, err := os.Open(filepath.Join(dist, name+".tar.gz"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			t.Fatalf("the %s/%s archive has no %s/fencegate", goos, goarch, name)
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Name != name+"/fencegate" {
			continue
		}
		bin, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		var cpu string
		if goos == "darwin" {
			m, err := macho.NewFile(bytes.NewReader(bin))
			if err != nil {
				t.Fatalf("the darwin binary is not Mach-O: %v", err)
			}
			cpu = m.Cpu.String()
		} else {
			e, err := elf.NewFile(bytes.NewReader(bin))
			if err != nil {
				t.Fatalf("the linux binary is not ELF: %v", err)
			}
			cpu = e.Machine.String()
		}
		if want := map[string]string{"darwin": "CpuArm64", "linux": "EM_X86_64"}[goos]; cpu != want {
			t.Fatalf("the %s/%s binary is for %s, want %s", goos, goarch, cpu, want)
		}
		return
	}
}
