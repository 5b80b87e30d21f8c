package agents

import (
	"cmp"
	"maps"
	"slices"
	"testing"

	discoveryv1 "k8s.io/api/discovery/v1"
)

func TestEndpointsOf(t *testing.T) {
	withPort := func(name string, port int32, at discoveryv1.AddressType, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
		s := endpointSlice("s", port, eps...)
		s.Ports[0].Name = &name
		s.AddressType = at
		return s
	}
	v4 := func(eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
		return withPort(testPort, 7443, discoveryv1.AddressTypeIPv4, eps...)
	}
	noReady := ep("node-a", "pod-a", "uid-a", "10.0.0.1", true)
	noReady.Conditions.Ready = nil
	noNode := ep("node-a", "pod-a", "uid-a", "10.0.0.1", true)
	noNode.NodeName = nil
	noRef := ep("node-a", "pod-a", "uid-a", "10.0.0.1", true)
	noRef.TargetRef = nil
	notPod := ep("node-a", "pod-a", "uid-a", "10.0.0.1", true)
	notPod.TargetRef.Kind = "Node"
	noAddr := ep("node-a", "pod-a", "uid-a", "10.0.0.1", true)
	noAddr.Addresses = nil
	terminating := ep("node-a", "pod-a", "uid-a", "10.0.0.1", true)
	yes := true
	terminating.Conditions.Terminating = &yes

	a := endpoint{Node: "node-a", Pod: "pod-a", UID: "uid-a", Addr: "10.0.0.1:7443"}
	tests := []struct {
		name          string
		slices        []*discoveryv1.EndpointSlice
		want          []endpoint
		wantContested []string
	}{
		{name: "ready endpoint", slices: []*discoveryv1.EndpointSlice{v4(ep("node-a", "pod-a", "uid-a", "10.0.0.1", true))}, want: []endpoint{a}},
		{name: "not ready is still reached (a device class is missing)", slices: []*discoveryv1.EndpointSlice{v4(ep("node-a", "pod-a", "uid-a", "10.0.0.1", false))},
			want: []endpoint{a}},
		{name: "terminating", slices: []*discoveryv1.EndpointSlice{v4(terminating)}},
		{name: "two pods on one node, neither ready, are both refused", slices: []*discoveryv1.EndpointSlice{v4(
			ep("node-a", "pod-a", "uid-a", "10.0.0.1", false), ep("node-a", "pod-x", "uid-x", "10.0.0.9", false))},
			wantContested: []string{"node-a"}},
		{name: "ready unknown reads as ready", slices: []*discoveryv1.EndpointSlice{v4(noReady)}, want: []endpoint{a}},
		{name: "no node name", slices: []*discoveryv1.EndpointSlice{v4(noNode)}},
		{name: "no target", slices: []*discoveryv1.EndpointSlice{v4(noRef)}},
		{name: "target not a pod", slices: []*discoveryv1.EndpointSlice{v4(notPod)}},
		{name: "no address", slices: []*discoveryv1.EndpointSlice{v4(noAddr)}},
		{name: "no port of that name", slices: []*discoveryv1.EndpointSlice{
			withPort("metrics", 9090, discoveryv1.AddressTypeIPv4, ep("node-a", "pod-a", "uid-a", "10.0.0.1", true))}},
		{name: "FQDN slice", slices: []*discoveryv1.EndpointSlice{
			withPort(testPort, 7443, discoveryv1.AddressTypeFQDN, ep("node-a", "pod-a", "uid-a", "a.example", true))}},
		{name: "IPv6 address", slices: []*discoveryv1.EndpointSlice{
			withPort(testPort, 7443, discoveryv1.AddressTypeIPv6, ep("node-a", "pod-a", "uid-a", "fd00::1", true))},
			want: []endpoint{{Node: "node-a", Pod: "pod-a", UID: "uid-a", Addr: "[fd00::1]:7443"}}},
		{name: "one pod in two slices counts once, at its lowest address", slices: []*discoveryv1.EndpointSlice{
			withPort(testPort, 7443, discoveryv1.AddressTypeIPv6, ep("node-a", "pod-a", "uid-a", "fd00::1", true)),
			v4(ep("node-a", "pod-a", "uid-a", "10.0.0.1", true))}, want: []endpoint{a}},
		{name: "two nodes", slices: []*discoveryv1.EndpointSlice{v4(
			ep("node-a", "pod-a", "uid-a", "10.0.0.1", true), ep("node-b", "pod-b", "uid-b", "10.0.0.2", true))},
			want: []endpoint{a, {Node: "node-b", Pod: "pod-b", UID: "uid-b", Addr: "10.0.0.2:7443"}}},
		{name: "two pods on one node are both refused", slices: []*discoveryv1.EndpointSlice{v4(
			ep("node-a", "pod-a", "uid-a", "10.0.0.1", true), ep("node-a", "pod-x", "uid-x", "10.0.0.9", true),
			ep("node-b", "pod-b", "uid-b", "10.0.0.2", true))},
			want: []endpoint{{Node: "node-b", Pod: "pod-b", UID: "uid-b", Addr: "10.0.0.2:7443"}}, wantContested: []string{"node-a"}},
		{name: "a pod recreated under its name is another pod", slices: []*discoveryv1.EndpointSlice{v4(
			ep("node-a", "pod-a", "uid-a", "10.0.0.1", true), ep("node-a", "pod-a", "uid-a2", "10.0.0.3", true))},
			wantContested: []string{"node-a"}},
		{name: "a not-ready old pod does not contest", slices: []*discoveryv1.EndpointSlice{v4(
			ep("node-a", "pod-a", "uid-a", "10.0.0.1", true), ep("node-a", "pod-old", "uid-old", "10.0.0.7", false))},
			want: []endpoint{a}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, contested := endpointsOf(tt.slices, testPort)
			gotList := slices.SortedFunc(maps.Values(got), func(x, y endpoint) int {
				return cmp.Compare(x.Node, y.Node)
			})
			if !slices.Equal(gotList, tt.want) {
				t.Errorf("endpoints = %+v, want %+v", gotList, tt.want)
			}
			if got := slices.Sorted(maps.Keys(contested)); !slices.Equal(got, tt.wantContested) {
				t.Errorf("contested = %v, want %v", got, tt.wantContested)
			}
		})
	}
}
