// Package substitute keeps credentials out of sandboxes.
//
// Inside a sandbox an environment variable holds a placeholder shaped like
// the real credential (NewPlaceholder). The credential pipeline (package
// credentials, the egress proxy's request hook) calls Set.Apply for
// every intercepted request: the placeholder is swapped for the real value
// only on requests to the hosts its Binding names, over a TLS connection the
// proxy intercepted; a placeholder heading anywhere else — literally or
// percent-encoded, base64 (std or URL alphabet, any alignment), JSON-escaped
// or hex — refuses the request and raises an alert.
//
// Detector is the other half of exfiltration control: it looks for
// credential-shaped strings that are not our placeholders (real secrets the
// guest may have found) using gitleaks' maintained default rule set.
//
// Nothing in this package puts a real value in an error, a Refusal, a
// Finding or a log line.
package substitute
