package agents

import (
	"cmp"
	"net"
	"slices"
	"strconv"

	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
)

// endpoint is one node agent per its EndpointSlice; any change to it makes
// a new connection.
type endpoint struct {
	Node string
	// Pod and UID are the endpoint's targetRef; UID may be empty.
	Pod  string
	UID  types.UID
	Addr string // host:port of the node channel
}

// candidate is an endpoint with its ready condition, which only chooses
// between two pods of a node: a readiness change alone is no new agent.
type candidate struct {
	endpoint
	ready bool
}

// endpointsOf reads one endpoint per node. An unready agent is still used
// (one class may be unavailable; the others still work). Terminating or
// incomplete endpoints are skipped; ready pods win. Two pods claiming one
// node are both refused: a surge and an impostor look the same, and
// picking one is a guess an attacker could win.
func endpointsOf(items []*discoveryv1.EndpointSlice, portName string) (nodes map[string]endpoint, conflicts map[string][]endpoint) {
	byNode := map[string][]candidate{}
	for _, s := range items {
		if s.AddressType == discoveryv1.AddressTypeFQDN {
			continue // the controller dials pod IPs
		}
		port, ok := namedPort(s, portName)
		if !ok {
			continue
		}
		for _, e := range s.Endpoints {
			if e.Conditions.Terminating != nil && *e.Conditions.Terminating {
				continue
			}
			if e.NodeName == nil || *e.NodeName == "" || e.TargetRef == nil ||
				e.TargetRef.Kind != "Pod" || e.TargetRef.Name == "" || len(e.Addresses) == 0 {
				continue
			}
			byNode[*e.NodeName] = append(byNode[*e.NodeName], candidate{
				endpoint: endpoint{
					Node: *e.NodeName,
					Pod:  e.TargetRef.Name,
					UID:  e.TargetRef.UID,
					Addr: net.JoinHostPort(e.Addresses[0], strconv.Itoa(int(port))),
				},
				// A nil ready condition means unknown, which the API reads as ready.
				ready: e.Conditions.Ready == nil || *e.Conditions.Ready,
			})
		}
	}
	nodes = map[string]endpoint{}
	conflicts = map[string][]endpoint{}
	for node, cs := range byNode {
		slices.SortFunc(cs, func(a, b candidate) int {
			if c := cmp.Compare(a.Pod, b.Pod); c != 0 {
				return c
			}
			return cmp.Compare(a.Addr, b.Addr)
		})
		cs = slices.CompactFunc(cs, func(a, b candidate) bool { return samePod(a.endpoint, b.endpoint) })
		if len(cs) > 1 {
			if ready := slices.DeleteFunc(slices.Clone(cs), func(c candidate) bool { return !c.ready }); len(ready) > 0 {
				cs = ready
			}
		}
		eps := make([]endpoint, len(cs))
		for i, c := range cs {
			eps[i] = c.endpoint
		}
		if len(eps) > 1 {
			conflicts[node] = eps
			continue
		}
		nodes[node] = eps[0]
	}
	return nodes, conflicts
}

func samePod(a, b endpoint) bool {
	return a.Pod == b.Pod && (a.UID == "" || b.UID == "" || a.UID == b.UID)
}

func namedPort(s *discoveryv1.EndpointSlice, name string) (int32, bool) {
	for _, p := range s.Ports {
		if p.Name != nil && *p.Name == name && p.Port != nil && *p.Port > 0 {
			return *p.Port, true
		}
	}
	return 0, false
}
