// Package hexdigit reads single hexadecimal digits, the one copy of what
// percent-decoding (paths, queries, cookie and header names) and the
// placeholder scanners need byte by byte. encoding/hex works on whole
// strings and allocates or errors per call; these are for loops that
// look at one byte at a time. It is a leaf: no cagebox imports.
package hexdigit

// Is reports whether c is a hexadecimal digit (either case).
func Is(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// Val is the value of the hexadecimal digit c; c must satisfy Is.
func Val(c byte) byte {
	switch {
	case '0' <= c && c <= '9':
		return c - '0'
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10
	}
	return c - 'A' + 10
}
