package peercopy

import "unsafe"

// uintptrOf is the address of b's first byte (b not empty).
func uintptrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(&b[0])) } //nolint:gosec // G103: only to align a buffer for O_DIRECT
