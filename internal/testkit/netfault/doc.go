// Package netfault cuts, delays and degrades the network links between the
// processes of a system under test, each link on its own, and records when
// each fault started and healed.
//
// A link is a TCP proxy on loopback in front of one upstream address, made
// per (client process, target) pair: give each client the link's address
// instead of the upstream's (internal/devtools/localstack's Config.Links does it for
// every replica's PostgreSQL, Pub/Sub and service addresses). A fault then
// cuts exactly the links it names and leaves every other path alone:
//
//   - Partition holds every byte both ways and leaves connections open with
//     nobody answering, no reset (half-open), as a dropped route does; the
//     held bytes flow on when it heals, as TCP's retransmissions deliver
//     them. New connections are accepted and left unanswered.
//   - Reset resets every connection (RST) and each new one.
//   - Drop drops every packet of the link with nftables (root): a partition
//     the kernels see, so TCP keepalive and TCP_USER_TIMEOUT fire, which
//     they cannot behind Partition, whose proxy's kernel acknowledges the
//     bytes it holds.
//   - Degrade adds latency ± jitter per chunk (order kept) and packet loss:
//     real loss with nftables (numgen random drop rules on the link's port,
//     in a table of the harness's own) when the process is root and nft is
//     installed, else a proxy approximation (a chunk held for a 200 ms
//     retransmission timeout with the loss probability).
//
// Faults are bounded in time (Config.MaxFault: each heals itself) and links
// in count (Config.MaxLinks). Close heals everything and removes the
// nftables table; a table left by a harness process that died is removed by
// the next New. The proxies live in the test process and die with it.
//
// The package is internal: a fork's own services live in this module and
// use it from their tests as they are. docs/adr/0021 says why links are
// proxies rather than network namespaces.
package netfault
