package operator

import "google.golang.org/grpc/metadata"

// GatewayMarkPairs is the metadata the gateway's ServeMuxOption adds, for
// tests that stand in for the gateway.
func GatewayMarkPairs(m *GatewayMark) metadata.MD { return metadata.Pairs(gatewayMarkKey, m.secret) }
