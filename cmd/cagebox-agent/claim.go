package main

import "github.com/cagebox/cagebox/agentproto"

// claimPlatform applies what only some guests apply of a claim (a VM
// guest: network, entropy, clock, hostname); nil in a container, whose
// kernel, network and hostname the host owns. Set before serving.
var claimPlatform func(*agentproto.Claim) error
