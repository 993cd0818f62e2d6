// Package deploy holds cagebox's Kubernetes manifests (kubectl apply -k
// deploy/): the agent-sandbox CRDs (crds/, generated), the namespace,
// least-privilege RBAC, the node agent's DaemonSet and the controller's
// Deployment. docs/kubernetes.md is the guide. The package's test decodes
// every manifest strictly and checks the RBAC invariants.
package deploy

//go:generate go run ./gen -out crds
