// Package credentials is cagebox's credential pipeline on the gateway: what
// lets a sandbox use a credential that never enters it.
//
// Bindings. Bind resolves a create request's secret bindings against the
// vault (inline values sealed, a stored secret's hosts narrowed, a sigv4
// value's ACCESS_KEY_ID:SECRET_ACCESS_KEY and an hmac signing configuration
// checked) and makes the placeholders the guest's environment holds; the
// Binding records it returns (never a value) are kept in the sandbox
// record. Build turns them into the request path's Bindings: a
// substitute.Set for placeholder swaps and guards, and SigV4Binding and
// HMACBinding re-signers, each reading its real value from the vault on
// every request with the secret's current record, so a revoke, a rotate or
// a narrowing of the secret's hosts applies to the very next one (a host
// the secret no longer covers is treated as one the binding does not
// name).
//
// Requests. A Pipeline per sandbox holds its Bindings (Install, Unbind) and
// is the egress proxy's request hook (Request, wired by internal/gateway):
// what the headers alone refuse (a placeholder-signed AWS request to a host
// its binding does not name), then the exfil scan of the request as the
// guest sent it (credential-shaped strings that are not the sandbox's
// placeholders; Config.Exfil flag, block or off, within Config.ExfilScan),
// then SigV4 re-signing, HMAC re-signing and the placeholder swap, each
// refusing with a Refusal and an event where the request may not go.
// Denied raises an alert for a placeholder in a request the proxy refused
// on its own. Events go to the Emit func the pipeline was made with, so
// this package knows nothing of the daemon.
//
// Responses. Every real value the request path put into a request is
// recorded in a Reals, each with the placeholder the guest knows it by.
// Scrub then rewrites the response to that request — status line,
// headers, trailers and body, also when gzip-, deflate- or brotli-encoded,
// and WebSocket frames after an upgrade — replacing every occurrence of a
// real value, raw, percent-encoded, JSON-escaped, hex or base64 (std or URL
// alphabet, any alignment), by its placeholder in the same encoding, and
// reports each as a Reflection (name, where, encoding: never the value).
// Bodies are streamed through a window as long as the longest encoded form;
// nothing buffers a whole body. Request returns Scrub.Filter as the
// request's response filter; the egress proxy only applies it
// (egress.ResponseFilter).
//
// Host names are parsed and matched by package hostname, as the policy and
// the vault do. Nothing in this package puts a real value in an error, an
// event or a log line.
package credentials
