// Package credentials is the home of cagebox's credential pipeline on the
// gateway. Today it holds the response half: what keeps a real value the
// gateway put into a request from coming back into the sandbox.
//
// The request hook (internal/gateway) records every real value it
// substituted, injected or produced by re-signing in a Reals, each with the
// placeholder the guest knows it by. Scrub then rewrites the response to
// that request — status line, headers, trailers and body, also when
// gzip-, deflate- or brotli-encoded, and WebSocket frames after an upgrade —
// replacing every occurrence of a real value, raw, percent-encoded,
// JSON-escaped, hex or base64 (std or URL alphabet, any alignment), by its
// placeholder in the same encoding, and reports each as a Reflection (name,
// where, encoding: never the value). Bodies are streamed through a window as
// long as the longest encoded form; nothing buffers a whole body.
//
// The egress proxy knows nothing of this: it applies the response filter
// the request hook returned (egress.ResponseFilter).
//
// Nothing in this package puts a real value in an error, an event or a log
// line.
package credentials
