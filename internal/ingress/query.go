package ingress

import (
	"errors"
	"net/url"
	"strings"

	"github.com/cagebox/cagebox/internal/reserved"
)

// errQuery: a query whose cagebox parameters are ambiguous (400).
var errQuery = errors.New("ambiguous query")

// query is a request's query as the listener decided on it, once: the
// signature it carries (if any) and what the guest gets instead.
type query struct {
	// sig is the value of the one cbx_sig parameter ("" if none).
	sig string
	// forward is the raw query for the guest: the request's own pairs, in
	// their order and encoding, minus every cagebox parameter.
	forward string
}

// parseQuery reads a raw query once. Pairs are split at '&'; a pair whose
// name is cagebox's in any encoding (reserved.Param) is removed, and if
// it is cbx_sig (decoded) its value is the signature. Refused (errQuery):
// more than one cbx_sig, a cbx_sig whose value does not decode, and a
// cagebox parameter after a ';' in a pair (servers that also split at ';'
// would read one there that this listener did not).
func parseQuery(raw string) (query, error) {
	if raw == "" {
		return query{}, nil
	}
	var q query
	var keep []string
	sigs := 0
	for _, pair := range strings.Split(raw, "&") {
		name, value, _ := strings.Cut(pair, "=")
		if !reserved.Param(name) {
			if strings.Contains(pair, ";") {
				for _, sub := range strings.Split(pair, ";") {
					if n, _, _ := strings.Cut(sub, "="); reserved.Param(n) {
						return query{}, errQuery
					}
				}
			}
			keep = append(keep, pair)
			continue
		}
		if n, err := url.QueryUnescape(name); err != nil || n != SigParam {
			continue // cagebox's, not a signature: dropped
		}
		sigs++
		v, err := url.QueryUnescape(value)
		if err != nil || sigs > 1 {
			return query{}, errQuery
		}
		q.sig = v
	}
	q.forward = strings.Join(keep, "&")
	return q, nil
}
