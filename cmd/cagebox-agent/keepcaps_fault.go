//go:build cagebox_fault_keepcaps

package main

// faultKeepCaps, set only in a build with the cagebox_fault_keepcaps tag
// (tests), makes the agent skip dropping capabilities, so that tests can
// show its check of its children refuses to run anything. Release builds
// never have the tag.
const faultKeepCaps = true
