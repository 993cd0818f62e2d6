//go:build !cagebox_fault_keepcaps

package main

// faultKeepCaps is false in every release build; see keepcaps_fault.go.
const faultKeepCaps = false
