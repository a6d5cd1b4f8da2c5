package server

import "time"

// SetClock makes v read the time from now (its verdicts and go-oidc's
// expiry check alike); call it before v's first Authenticate.
func SetClock(v *OIDCVerifier, now func() time.Time) { v.now = now }
