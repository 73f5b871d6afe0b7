package main

import (
	"fmt"
	"io"
	"runtime/debug"
	"text/tabwriter"

	"github.com/fencegate/fencegate/config"
)

// version is set at build time with -ldflags "-X main.version=v1.2.3".
var version = ""

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
	for _, s := range info.Settings {
		if s.Key == "vcs.revision" && len(s.Value) >= 12 {
			return "dev-" + s.Value[:12]
		}
	}
	return "dev"
}

func printEnv(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "VARIABLE\tDEFAULT\tACCEPTS")
	for _, v := range config.Help() {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", v.Name, v.Default, v.Accepts)
	}
	return tw.Flush()
}
