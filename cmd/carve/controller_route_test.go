//go:build !nodeagent

package main

import (
	"context"
	"errors"
	"testing"
)

// TestRunAll: one part failing stops the others and is reported; parts
// that end because the others were stopped are not errors.
func TestRunAll(t *testing.T) {
	boom := errors.New("boom")
	untilDone := func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }
	tests := []struct {
		name string
		fns  []func(context.Context) error
		want error
	}{
		{"one fails", []func(context.Context) error{untilDone, func(context.Context) error { return boom }, untilDone}, boom},
		{"all end well", []func(context.Context) error{func(context.Context) error { return nil }, untilDone}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := runAll(context.Background(), tt.fns...)
			if tt.want == nil && err != nil || tt.want != nil && !errors.Is(err, tt.want) {
				t.Errorf("runAll = %v, want %v", err, tt.want)
			}
		})
	}
}
