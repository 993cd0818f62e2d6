package gateway

import "github.com/cagebox/cagebox/internal/link"

// Links is the link manager: published ports (link.Manager.SetPublished)
// and the ingress socket mark the rules admit.
func (g *Gateway) Links() *link.Manager { return g.links }
