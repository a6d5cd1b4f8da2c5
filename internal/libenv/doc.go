// Package libenv is where the services read the pattern libraries'
// configuration from the environment: pkg/ takes its configuration as values
// (outbox.Config, inbox.Config, pgdb.Config, server.Config, telemetry.Config,
// pubsub.ClientConfig), and these functions fill them from the variables the
// runbooks and manifests name, keeping each library's defaults and reporting
// every bad variable by name through an envconfig.Reader.
//
// It is apart from internal/envconfig (the reader itself) so that a binary
// that reads only its own variables (the console) does not link, and so is
// not taken to read, the variables of libraries it does not use: the
// deployment checks (deploy/deploytest) derive each service's variables from
// the packages its binary is built from.
package libenv
