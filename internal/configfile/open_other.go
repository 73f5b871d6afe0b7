//go:build !unix

package configfile

// openFlags adds nothing where O_NONBLOCK does not exist.
const openFlags = 0
