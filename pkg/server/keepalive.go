package server

import (
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
)

// gRPC keepalive: both ends of every connection find a peer that stopped
// answering (a partition, a blackholing firewall, a dead host: the
// connection is half-open and no RST ever comes) by HTTP/2 pings, which
// need an answer from the peer's gRPC stack, not its kernel. Without them a
// channel keeps handing calls to a dead connection until TCP gives up
// (about 15 minutes on Linux), each call failing only at its deadline.
const (
	// ClientKeepaliveTime is how long a client connection may go without
	// reading anything before it pings: 10s, the least grpc-go allows.
	ClientKeepaliveTime = 10 * time.Second
	// ClientKeepaliveTimeout is how long the client waits for the ping's
	// answer before it closes the connection; the channel then reconnects.
	// A dead connection is closed within ClientKeepaliveTime +
	// ClientKeepaliveTimeout (15s) of its last byte; calls on it end at
	// their own deadlines before that.
	ClientKeepaliveTimeout = 5 * time.Second

	// serverKeepaliveMinTime is the shortest ping interval a server
	// tolerates. Below ClientKeepaliveTime, or grpc-go's default (5
	// minutes) answers our clients' pings with GOAWAY too_many_pings.
	serverKeepaliveMinTime = 5 * time.Second
	// serverKeepaliveTime and serverKeepaliveTimeout: a server pings a
	// connection silent this long and closes it when the answer does not
	// come, so a vanished client's connection and its streams are freed
	// in 20s rather than grpc-go's default 2h + 20s.
	serverKeepaliveTime    = 15 * time.Second
	serverKeepaliveTimeout = 5 * time.Second
)

// ClientKeepalive is the dial option of every gRPC client of the services
// (the hand-off to the provider, billing's reconciliation, the console):
// ping after ClientKeepaliveTime without traffic, also with no call in
// flight, so a dead idle connection is replaced before the next call
// needs it. Compose it with TLS.DialOption and the per-RPC credentials.
// The server it dials must permit the pings; New's servers do.
func ClientKeepalive() grpc.DialOption {
	return grpc.WithKeepaliveParams(keepalive.ClientParameters{
		Time:                ClientKeepaliveTime,
		Timeout:             ClientKeepaliveTimeout,
		PermitWithoutStream: true,
	})
}

// serverKeepalive are the server options of every Server: permit the
// clients' pings (ClientKeepalive) and ping silent clients.
func serverKeepalive() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
			MinTime:             serverKeepaliveMinTime,
			PermitWithoutStream: true,
		}),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			Time:    serverKeepaliveTime,
			Timeout: serverKeepaliveTimeout,
		}),
	}
}
