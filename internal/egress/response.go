package egress

import (
	"errors"
	"net/http"
)

// ResponseFilter rewrites the upstream's response to one allowed request
// before it goes back to the sandbox: its status, headers, trailers and
// body (res.Body may be replaced by a reader that rewrites as it streams;
// the filter then sets res.ContentLength and the Content-Length header to
// match, or drops them). For a 101 Switching Protocols, res.Body is the
// upstream connection (an io.ReadWriteCloser): a replacement must be one
// too, reading what goes to the sandbox and writing what comes from it.
//
// A non-nil error refuses the response: the sandbox gets a 502 whose JSON
// body carries the error's text, which must say why without internal
// detail or secrets.
type ResponseFilter func(res *http.Response) error

// filterError is a ResponseFilter's refusal on its way to upstreamError.
type filterError struct{ err error }

func (e *filterError) Error() string { return e.err.Error() }
func (e *filterError) Unwrap() error { return e.err }

// modifyResponse applies the request's ResponseFilter, if its hook gave
// one.
func modifyResponse(res *http.Response) error {
	if res.Request == nil {
		return nil
	}
	st, _ := res.Request.Context().Value(reqStateKey{}).(*reqState)
	if st == nil || st.filter == nil {
		return nil
	}
	if err := st.filter(res); err != nil {
		return &filterError{err}
	}
	return nil
}

// filterReason is the text a refused response shows the sandbox.
func filterReason(err error) (string, bool) {
	var fe *filterError
	if !errors.As(err, &fe) {
		return "", false
	}
	return fe.err.Error(), true
}
