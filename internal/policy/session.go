package policy

// Session is what a condition may read of the session so far. The caller
// (the live policy) fills it in; a nil Session reads as all zeros.
type Session struct {
	// Requests is the number of requests the sandbox has had allowed.
	Requests int64
	// Fired counts, per rule name, the requests that rule has decided.
	Fired map[string]int64
	// Spend is the USD spent (all budgets' scopes together).
	Spend float64
	// BytesUp and BytesDown are body bytes sent and received.
	BytesUp, BytesDown int64
}
