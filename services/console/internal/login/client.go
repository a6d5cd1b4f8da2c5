package login

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// TrustedProxies are the proxies and load balancers in front of the
// console whose X-Forwarded-For is believed. The zero value trusts none:
// the client is the connection's peer.
type TrustedProxies struct {
	prefixes []netip.Prefix
}

// ParseTrustedProxies reads a comma-separated list of CIDRs or addresses
// (an address is its own /32 or /128), blanks ignored.
func ParseTrustedProxies(list string) (TrustedProxies, error) {
	var t TrustedProxies
	for _, s := range strings.Split(list, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		p, err := netip.ParsePrefix(s)
		if err != nil {
			a, aerr := netip.ParseAddr(s)
			if aerr != nil {
				return TrustedProxies{}, fmt.Errorf("%q: want a CIDR such as 10.0.0.0/8 or an address", s)
			}
			a = a.Unmap()
			p = netip.PrefixFrom(a, a.BitLen())
		}
		t.prefixes = append(t.prefixes, p.Masked())
	}
	return t, nil
}

func (t TrustedProxies) trusts(a netip.Addr) bool {
	a = a.Unmap()
	for _, p := range t.prefixes {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// ClientAddr is the address of the client r comes from: the connection's
// peer, unless the peer is a trusted proxy; then the rightmost
// X-Forwarded-For hop that is not a trusted proxy (each proxy appends the
// address it received the request from, so hops left of the first
// untrusted one are the client's to invent). When every hop is trusted,
// the leftmost; a hop that is not an address ends the walk at the last
// trusted one.
func (t TrustedProxies) ClientAddr(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	peer, err := netip.ParseAddr(host)
	if err != nil || !t.trusts(peer) {
		return host
	}
	var hops []string
	for _, v := range r.Header.Values("X-Forwarded-For") {
		hops = append(hops, strings.Split(v, ",")...)
	}
	client := peer
	for i := len(hops) - 1; i >= 0; i-- {
		a, err := netip.ParseAddr(strings.TrimSpace(hops[i]))
		if err != nil {
			break
		}
		client = a.Unmap()
		if !t.trusts(client) {
			break
		}
	}
	return client.String()
}
