package main

import (
	"fmt"
	"io"
	"runtime/debug"
	"text/tabwriter"

	"github.com/fencegate/fencegate/config"
)

// Set at build time with -ldflags "-X main.version=v1.2.3 -X
// main.commit=<git sha> -X main.date=<RFC 3339>", as the Dockerfile does;
// a plain go build in a git checkout gets the commit and date from the
// VCS information the go command records instead.
var (
	version = ""
	commit  = ""
	date    = ""
)

// Version is the release version, else the module version, else the VCS
// revision the binary was built from, else "dev".
func Version() string {
	if version != "" {
		return version
	}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "dev"
	}
	if v := info.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	if c := vcsSetting(info, "vcs.revision"); len(c) >= 12 {
		return "dev-" + c[:12]
	}
	return "dev"
}

// buildDescription is what fencegate version prints after the version:
// the commit and date of the source, marked when the tree had local
// changes, and the Go version.
func buildDescription() string {
	c, d, modified := commit, date, false
	info, ok := debug.ReadBuildInfo()
	if ok {
		if c == "" {
			c = vcsSetting(info, "vcs.revision")
			modified = vcsSetting(info, "vcs.modified") == "true"
		}
		if d == "" {
			d = vcsSetting(info, "vcs.time")
		}
	}
	if c == "" {
		c = "unknown"
	}
	if modified {
		c += " (modified)"
	}
	if d == "" {
		d = "unknown"
	}
	goVersion := "unknown"
	if ok {
		goVersion = info.GoVersion
	}
	return fmt.Sprintf("commit %s, built %s, %s", c, d, goVersion)
}

func vcsSetting(info *debug.BuildInfo, key string) string {
	for _, s := range info.Settings {
		if s.Key == key {
			return s.Value
		}
	}
	return ""
}

func printEnv(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "VARIABLE\tDEFAULT\tACCEPTS")
	for _, v := range append(config.Help(), config.ClientVars...) {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", v.Name, v.Default, v.Accepts)
	}
	return tw.Flush()
}
