// Package host holds the host tier: carve's lvm package against real lvm2 on
// loop devices, with activation disabled by an lvm.conf of the test's own
// (the host kernel has no device-mapper). The tests carry the build tag
// hosttest and need root; `make test-host` runs them.
package host
