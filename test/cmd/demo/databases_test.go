package main

import (
	"testing"
	"time"
)

func TestDBColumns(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 16, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	const mi = 1 << 20
	for _, tc := range []struct {
		name      string
		samples   []dbSample
		size, tps string
	}{
		{name: "no sample", size: "-", tps: "-"},
		{
			name:    "one sample",
			samples: []dbSample{{At: at(0), Commits: 500, Size: 22 * mi}},
			size:    "22.0Mi", tps: "measuring",
		},
		{
			name:    "less than a minute: the rate over what the samples span",
			samples: []dbSample{{At: at(0), Commits: 100, Size: 22 * mi}, {At: at(20), Commits: 700, Size: 23 * mi}},
			size:    "23.0Mi", tps: "30.0 (over 20s)",
		},
		{
			// The base is the latest sample a minute or more before the
			// last (at 15 s), not the oldest one.
			name: "the last minute only",
			samples: []dbSample{
				{At: at(0), Commits: 0, Size: 22 * mi},
				{At: at(15), Commits: 3000, Size: 22 * mi},
				{At: at(45), Commits: 3600, Size: 22 * mi},
				{At: at(75), Commits: 4200, Size: 24*mi + mi/2},
			},
			size: "24.5Mi", tps: "20.0",
		},
		{
			// The server crashed between 30 s and 45 s: its counter
			// restarts, and the minute before the crash does not count.
			name: "a counter reset",
			samples: []dbSample{
				{At: at(0), Commits: 9000, Size: 22 * mi},
				{At: at(30), Commits: 9900, Size: 22 * mi},
				{At: at(45), Commits: 10, Size: 22 * mi},
				{At: at(65), Commits: 410, Size: 22 * mi},
			},
			size: "22.0Mi", tps: "20.0 (over 20s)",
		},
		{
			name:    "the reset's own sample alone",
			samples: []dbSample{{At: at(0), Commits: 9000, Size: 22 * mi}, {At: at(30), Commits: 5, Size: 22 * mi}},
			size:    "22.0Mi", tps: "measuring",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			size, tps := dbColumns(tc.samples, time.Minute)
			if size != tc.size || tps != tc.tps {
				t.Errorf("dbColumns = %q, %q; want %q, %q", size, tps, tc.size, tc.tps)
			}
		})
	}
}

func TestDBHistoryKeepsOneWindow(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 16, 0, 0, 0, time.UTC)
	var h dbHistory
	for s := 0; s <= 120; s += 15 {
		h = h.add(dbSample{At: t0.Add(time.Duration(s) * time.Second), Commits: int64(s) * 10}, time.Minute)
	}
	// The last is at 120 s: the sample at 60 s is the window's base and
	// nothing older is needed.
	if got := h[0].At.Sub(t0); got != 60*time.Second || len(h) != 5 {
		t.Errorf("history starts at %s with %d samples, want 1m0s and 5", got, len(h))
	}
	if _, tps := dbColumns(h, time.Minute); tps != "10.0" {
		t.Errorf("TPS over the kept history %q, want 10.0", tps)
	}
}

func TestParseSample(t *testing.T) {
	at := time.Date(2026, 12, 6, 16, 0, 0, 0, time.UTC)
	s, err := parseSample("48213 24862511\n", at)
	if err != nil {
		t.Fatal(err)
	}
	if s != (dbSample{At: at, Commits: 48213, Size: 24862511}) {
		t.Errorf("parseSample = %+v", s)
	}
	for _, bad := range []string{"", "48213", "48213 big", "psql: error: connection to server failed"} {
		if _, err := parseSample(bad, at); err == nil {
			t.Errorf("parseSample(%q) accepted it", bad)
		}
	}
}
