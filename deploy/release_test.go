package deploy

import (
	"archive/tar"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// TestReleaseScript runs scripts/release.sh for this machine's platform
// and checks what a user gets: an archive with the binary, LICENSE and
// README.md, a SHA256SUMS that matches it, and a binary stamped with the
// version that runs.
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
	bin := filepath.Join(t.TempDir(), "fencegate")
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, h.Name)
		if h.Name == name+"/fencegate" {
			f, err := os.OpenFile(bin, os.O_CREATE|os.O_WRONLY, 0o755)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := io.Copy(f, tr); err != nil {
				t.Fatal(err)
			}
			f.Close()
		}
	}
	for _, want := range []string{name + "/fencegate", name + "/LICENSE", name + "/README.md"} {
		if !slices.Contains(files, want) {
			t.Errorf("the archive lacks %s: %v", want, files)
		}
	}
	out, err := exec.Command(bin, "version").Output()
	if err != nil || !strings.Contains(string(out), "v9.8.7-test") {
		t.Fatalf("the archived binary's version: %q, %v", out, err)
	}
	if out, err := exec.Command("bash", "../scripts/release.sh").CombinedOutput(); err == nil {
		t.Fatalf("release.sh without a version succeeded: %s", out)
	}
}
