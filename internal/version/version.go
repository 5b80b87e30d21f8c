// Package version holds carve's version, set at link time.
package version

// Version is set by the Makefile with -ldflags -X; "dev" for plain go builds.
var Version = "dev"
