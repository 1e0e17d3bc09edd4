package main

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
)

// version is the release of this binary: set at build time with
// -ldflags "-X main.version=v1.2.3", else the module version Go stamped in
// the build info ('go install github.com/shardcron/shardcron/cmd/shardcron@v1.2.3'
// stamps v1.2.3, a build in a git checkout a pseudo-version), else "dev".
// Nodes publish it in their membership record and in /metrics build_info,
// so that 'shardcron version' and build_info always agree.
var version = "dev"

func init() { version = buildVersion(version, debug.ReadBuildInfo) }

// buildVersion returns the version set by -ldflags when there is one, else
// the main module's version from the build info, else "dev".
func buildVersion(ldflags string, read func() (*debug.BuildInfo, bool)) string {
	if ldflags != "" && ldflags != "dev" {
		return ldflags
	}
	if bi, ok := read(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}

const versionHelp = `Usage: shardcron version [--output table|json]

Prints the version of this binary and the Go release it was built with.
It does not contact a node: 'shardcron nodes' shows the versions the
nodes run.

Example:
  shardcron version
  shardcron version --output json
`

// runVersion runs 'shardcron version': args are the arguments after
// "version". It prints "shardcron <version> (<go version>)".
func runVersion(args []string, stdout, stderr io.Writer) int {
	c := newCommand("shardcron version", versionHelp, stdout, stderr)
	var output string
	c.fs.StringVar(&output, "output", outputTable, "output `FORMAT`: table or json")
	pos, code, done := c.parse(args)
	if done {
		return code
	}
	if msg := checkOutput(output); msg != "" {
		return c.usageError("%s", msg)
	}
	if len(pos) > 0 {
		return c.usageError("unexpected argument %q", pos[0])
	}
	if output == outputJSON {
		err := writeJSON(stdout, struct {
			Version string `json:"version"`
			Go      string `json:"go"`
			OS      string `json:"os"`
			Arch    string `json:"arch"`
		}{version, runtime.Version(), runtime.GOOS, runtime.GOARCH})
		if err != nil {
			return exitError
		}
		return exitOK
	}
	fmt.Fprintf(stdout, "shardcron %s (%s)\n", version, runtime.Version())
	return exitOK
}
