package valkeystore

// Every decoder in this package's tests records the names it reads, so
// that TestScriptReplies can check that no script sends a name its decoder
// ignores (see named.unread).
func init() { trackNames = true }
